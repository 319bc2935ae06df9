package rpcmux

import (
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// freezingProxy relays TCP connections to a backend until freeze is
// called; from then on it moves no more bytes in either direction and
// closes nothing, like a network that silently drops every packet.
type freezingProxy struct {
	ln     net.Listener
	frozen chan struct{}
	once   sync.Once
}

func newFreezingProxy(t *testing.T, backend string) *freezingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezingProxy{ln: ln, frozen: make(chan struct{})}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", backend)
			if err != nil {
				_ = in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			go p.relay(out, in)
			go p.relay(in, out)
		}
	}()
	return p
}

func (p *freezingProxy) relay(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.frozen:
			return // drop what was read, and everything after
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *freezingProxy) freeze() { p.once.Do(func() { close(p.frozen) }) }

// A call on a pooled connection whose peer went silent fails once the
// health check gives up on the connection, instead of waiting forever (the
// calls here have no deadline). Regression test for the chaos scenarios
// split-writes and one-way-cut: after a heal, forwarded key writes queued
// on a connection that had been dead for the whole partition.
func TestClientDropsASilentConnection(t *testing.T) {
	m, _ := startMux(t)
	srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	go func() { _ = srv.Serve(m.HTTP()) }()
	t.Cleanup(func() { _ = srv.Close(); _ = m.Close() })
	proxy := newFreezingProxy(t, m.Addr().String())

	client := NewClient(time.Second)
	url := "http://" + proxy.ln.Addr().String() + "/"
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("call before the freeze: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("call went over %s, want HTTP/2", resp.Proto)
	}

	proxy.freeze()
	if resp, err := client.Get(url); err == nil {
		_ = resp.Body.Close()
		t.Fatal("a call through a frozen connection succeeded")
	}
}

// newServer returns an http.Server for the HTTP side of an rpcmux that
// speaks HTTP/1.1 and HTTP/2 cleartext (prior knowledge), as Connect
// clients from NewClient do, and HTTP/2 or HTTP/1.1 over TLS when the mux hands it TLS
// connections (peer TLS). Run it with srv.Serve(mux.HTTP()).
func newServer(h http.Handler) *http.Server {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           h,
		Protocols:         &p,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
}

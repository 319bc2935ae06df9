package rpcmux

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

const testSecret = "mux-test-secret"

func startMux(t *testing.T) (*Mux, chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(ln, testSecret, nil)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- m.Serve() }()
	return m, served
}

func TestRoutesRaftAndHTTPOnOnePort(t *testing.T) {
	m, served := startMux(t)
	srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "http "+r.Proto)
	}))
	go func() { _ = srv.Serve(m.HTTP()) }()
	defer srv.Close()

	raftGot := make(chan string, 1)
	go func() {
		c, err := m.Raft().Accept()
		if err != nil {
			raftGot <- "accept: " + err.Error()
			return
		}
		defer c.Close()
		line, _ := bufio.NewReader(c).ReadString('\n')
		raftGot <- line
		_, _ = c.Write([]byte("pong\n"))
	}()

	// A silent connection must not hold up the others.
	idle, err := net.Dial("tcp", m.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()

	rc, err := DialRaft(m.Addr().String(), testSecret, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := rc.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if got := <-raftGot; got != "ping\n" {
		t.Fatalf("raft side read %q, want the bytes after the raft byte", got)
	}
	if reply, _ := bufio.NewReader(rc).ReadString('\n'); reply != "pong\n" {
		t.Fatalf("raft reply %q", reply)
	}

	for name, client := range map[string]*http.Client{"h2c": NewClient(5 * time.Second), "http1": {}} {
		resp, err := client.Get("http://" + m.Addr().String() + "/")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := map[string]string{"h2c": "http HTTP/2.0", "http1": "http HTTP/1.1"}[name]
		if string(body) != want {
			t.Fatalf("%s: body %q, want %q", name, body, want)
		}
	}

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve after Close: %v", err)
	}
	for name, l := range map[string]net.Listener{"raft": m.Raft(), "http": m.HTTP()} {
		if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("%s Accept after Close: %v", name, err)
		}
	}
}

func TestPeekedConnReplaysFirstByte(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	go func() { _, _ = b.Write([]byte("ET / HTTP/1.1")); b.Close() }()
	c := &peekedConn{Conn: a, first: 'G', pending: true}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "GET / HTTP/1.1" {
		t.Fatalf("read %q", got)
	}
}

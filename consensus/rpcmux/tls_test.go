package rpcmux

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/infermesh/infermesh/consensus/rpcmux/tlstest"
)

// tlsMux starts a mux under peer TLS with an HTTP server that names the
// protocol and whether the request came over TLS, and a raft side that
// echoes one line.
func tlsMux(t *testing.T, p *PeerTLS) *Mux {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(ln, testSecret, nil, WithPeerTLS(p))
	if err != nil {
		t.Fatal(err)
	}
	go m.Serve()
	srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tlsOn := "cleartext"
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			tlsOn = "mtls:" + r.TLS.PeerCertificates[0].Subject.CommonName
		}
		_, _ = io.WriteString(w, r.Proto+" "+tlsOn)
	}))
	go func() { _ = srv.Serve(m.HTTP()) }()
	go func() {
		for {
			c, err := m.Raft().Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 4)
				if _, err := io.ReadFull(c, b); err == nil {
					_, _ = c.Write(b)
				}
			}()
		}
	}()
	t.Cleanup(func() { srv.Close(); m.Close() })
	return m
}

func peer(t *testing.T, ca *tlstest.CA, leaf *tlstest.Leaf) *PeerTLS {
	t.Helper()
	p, err := NewPeerTLS(leaf.TLS, ca.Pool())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func raftEcho(addr string, p *PeerTLS, secret string) error {
	c, err := DialRaftTLS(addr, secret, p, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	b := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	if string(b) != "ping" {
		return errors.New("raft echo: " + string(b))
	}
	return nil
}

func httpGet(c *http.Client, addr string) (string, error) {
	resp, err := c.Get("http://" + addr + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// http1Client speaks HTTP/1.1 over peer TLS, as mesh/forward's default
// transport does with the node's dialer.
func http1Client(p *PeerTLS) *http.Client {
	var protos http.Protocols
	protos.SetHTTP1(true)
	return &http.Client{Transport: &http.Transport{Protocols: &protos, DialContext: p.DialContext(ALPNHTTP1, 5*time.Second)}}
}

func TestPeerTLSCarriesRaftAndHTTP(t *testing.T) {
	ca := tlstest.NewCA(t, "mesh-ca")
	m := tlsMux(t, peer(t, ca, ca.Valid(t, "server")))
	addr := m.Addr().String()
	client := peer(t, ca, ca.Valid(t, "client"))

	if err := raftEcho(addr, client, testSecret); err != nil {
		t.Fatalf("raft over mTLS: %v", err)
	}
	for name, c := range map[string]*http.Client{"h2": NewPeerClient(5*time.Second, client), "http1": http1Client(client)} {
		got, err := httpGet(c, addr)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := map[string]string{"h2": "HTTP/2.0 mtls:client", "http1": "HTTP/1.1 mtls:client"}[name]
		if got != want {
			t.Fatalf("%s: %q, want %q", name, got, want)
		}
	}
	// The cluster secret still guards raft inside TLS.
	if err := raftEcho(addr, client, "another-secret"); !errors.Is(err, ErrHandshake) {
		t.Fatalf("raft over mTLS with a wrong secret: %v, want ErrHandshake", err)
	}
	if m.RaftRefused() != 1 {
		t.Fatalf("raft refused %d, want 1", m.RaftRefused())
	}
}

func TestPeerTLSRefusesStrangers(t *testing.T) {
	ca := tlstest.NewCA(t, "mesh-ca")
	other := tlstest.NewCA(t, "other-ca")
	m := tlsMux(t, peer(t, ca, ca.Valid(t, "server")))
	addr := m.Addr().String()

	refused := m.TLSRefused()
	expectRefused := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s got through", what)
		}
		refused++
		deadline := time.Now().Add(10 * time.Second)
		for m.TLSRefused() < refused {
			if time.Now().After(deadline) {
				t.Fatalf("%s: refused %d, want %d (err %v)", what, m.TLSRefused(), refused, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// Cleartext raft and cleartext HTTP/2.
	_, err := DialRaft(addr, testSecret, 5*time.Second)
	expectRefused("cleartext raft", err)
	_, err = httpGet(NewClient(5*time.Second), addr)
	expectRefused("cleartext h2c", err)

	for name, p := range map[string]*PeerTLS{
		"a certificate from another CA": peer(t, other, other.Valid(t, "intruder")),
		"an expired certificate":        peer(t, ca, ca.Expired(t, "old")),
		"a not-yet-valid certificate":   peer(t, ca, ca.Issue(t, "early", time.Now().Add(time.Hour), time.Now().Add(2*time.Hour))),
	} {
		expectRefused(name+" (raft)", raftEcho(addr, p, testSecret))
		_, err := httpGet(NewPeerClient(5*time.Second, p), addr)
		expectRefused(name+" (Connect)", err)
	}

	// No client certificate at all.
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{ALPNRaft}})
	if err == nil {
		// TLS 1.3 reports the refusal on the first read.
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	expectRefused("a client without a certificate", err)
}

// A client does not accept a server whose certificate does not chain to its
// peer CA: an impostor with its own CA learns nothing.
func TestPeerTLSClientVerifiesTheServer(t *testing.T) {
	ca := tlstest.NewCA(t, "mesh-ca")
	other := tlstest.NewCA(t, "other-ca")
	// The impostor trusts our CA (so it would accept us) but presents a
	// certificate of its own CA.
	impostor, err := NewPeerTLS(other.Valid(t, "impostor").TLS, ca.Pool())
	if err != nil {
		t.Fatal(err)
	}
	m := tlsMux(t, impostor)
	client := peer(t, ca, ca.Valid(t, "client"))
	if err := raftEcho(m.Addr().String(), client, testSecret); err == nil {
		t.Fatal("raft dialled an impostor")
	}
	if _, err := httpGet(NewPeerClient(5*time.Second, client), m.Addr().String()); err == nil {
		t.Fatal("Connect client talked to an impostor")
	}
	// An expired server certificate is refused too.
	stale, _ := NewPeerTLS(ca.Expired(t, "stale").TLS, ca.Pool())
	m2 := tlsMux(t, stale)
	if err := raftEcho(m2.Addr().String(), client, testSecret); err == nil {
		t.Fatal("raft accepted an expired server certificate")
	}
}

// Rotation: Update swaps the certificate and the CA pool for new
// handshakes without a restart.
func TestPeerTLSRotation(t *testing.T) {
	ca := tlstest.NewCA(t, "mesh-ca")
	first := ca.Valid(t, "server")
	srvTLS := peer(t, ca, first)
	m := tlsMux(t, srvTLS)
	addr := m.Addr().String()
	client := peer(t, ca, ca.Valid(t, "client"))

	served := func() string {
		t.Helper()
		conn, err := tls.Dial("tcp", addr, client.ClientConfig(ALPNHTTP1))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	if got := served(); got != first.Serial.String() {
		t.Fatalf("serial %s, want %s", got, first.Serial)
	}
	second := ca.Valid(t, "server")
	if err := srvTLS.Update(second.TLS, ca.Pool()); err != nil {
		t.Fatal(err)
	}
	if got := served(); got != second.Serial.String() {
		t.Fatalf("after rotation serial %s, want %s", got, second.Serial)
	}

	// A CA rotation: both sides move to a new CA; a peer still on the old
	// one is refused, one on the new one gets through.
	next := tlstest.NewCA(t, "mesh-ca-2")
	if err := srvTLS.Update(next.Valid(t, "server").TLS, next.Pool()); err != nil {
		t.Fatal(err)
	}
	if err := raftEcho(addr, client, testSecret); err == nil {
		t.Fatal("a peer of the retired CA still connects")
	}
	if err := client.Update(next.Valid(t, "client").TLS, next.Pool()); err != nil {
		t.Fatal(err)
	}
	if err := raftEcho(addr, client, testSecret); err != nil {
		t.Fatalf("after the client's rotation: %v", err)
	}
	// A bad update keeps the old pair.
	if err := client.Update(tls.Certificate{}, next.Pool()); err == nil {
		t.Fatal("an empty certificate was accepted")
	}
	if err := raftEcho(addr, client, testSecret); err != nil {
		t.Fatalf("after a refused update: %v", err)
	}
}

func TestPeerTLSResumesSessionsAndRechecksTheCA(t *testing.T) {
	ca := tlstest.NewCA(t, "mesh-ca")
	srvTLS := peer(t, ca, ca.Valid(t, "server"))
	addr := tlsMux(t, srvTLS).Addr().String()
	client := peer(t, ca, ca.Valid(t, "client"))
	dial := client.DialContext(ALPNHTTP1, 5*time.Second)
	// get opens a connection, makes one HTTP/1.1 request on it (the
	// client reads the session ticket with the answer) and reports whether
	// the handshake resumed a session.
	get := func() (resumed bool, err error) {
		c, err := dial(context.Background(), "tcp", addr)
		if err != nil {
			return false, err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: peer\r\n\r\n"); err != nil {
			return false, err
		}
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return false, err
		}
		b, err := io.ReadAll(res.Body)
		if err != nil || string(b) != "HTTP/1.1 mtls:client" {
			return false, fmt.Errorf("answer %q, %v", b, err)
		}
		return c.(*tls.Conn).ConnectionState().DidResume, nil
	}
	if resumed, err := get(); err != nil || resumed {
		t.Fatalf("first connection: resumed %v, %v", resumed, err)
	}
	if resumed, err := get(); err != nil || !resumed {
		t.Fatalf("second connection: resumed %v, %v; want a resumed session", resumed, err)
	}

	// The server's pool changes under a session it would still accept (same
	// ticket keys): the resumed session's chain is checked against the new
	// pool and refused.
	other := tlstest.NewCA(t, "other-ca")
	st := *srvTLS.state.Load()
	st.pool = other.Pool()
	srvTLS.state.Store(&st)
	if _, err := get(); err == nil {
		t.Fatal("a session of a certificate from a retired CA was resumed")
	}
	st.pool = ca.Pool()
	srvTLS.state.Store(&st)
	if _, err := get(); err != nil {
		t.Fatalf("after restoring the pool: %v", err)
	}

	// The same from the client's side: the server's chain is checked on
	// resumption against the client's pool in force.
	cst := *client.state.Load()
	cst.pool = other.Pool()
	client.state.Store(&cst)
	if _, err := get(); err == nil {
		t.Fatal("the client resumed a session with a server of a retired CA")
	}
	cst.pool = ca.Pool()
	client.state.Store(&cst)

	// Update starts new ticket keys and a new session cache: the next
	// connection is a full handshake.
	if err := srvTLS.Update(ca.Valid(t, "server").TLS, ca.Pool()); err != nil {
		t.Fatal(err)
	}
	if resumed, err := get(); err != nil || resumed {
		t.Fatalf("after the server's Update: resumed %v, %v; want a full handshake", resumed, err)
	}
	if resumed, err := get(); err != nil || !resumed {
		t.Fatalf("after a full handshake: resumed %v, %v", resumed, err)
	}
}

// BenchmarkPeerTLSHandshake is the cost of a new connection to a peer
// (TCP, mutual TLS 1.3 handshake, reading the session ticket) with a full
// handshake (an empty session cache, as after a rotation) and with a
// resumed session (every later connection to the same peer).
func BenchmarkPeerTLSHandshake(b *testing.B) {
	ca := tlstest.NewCA(b, "mesh-ca")
	srv, err := NewPeerTLS(ca.Valid(b, "server").TLS, ca.Pool())
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	m, err := New(ln, testSecret, nil, WithPeerTLS(srv))
	if err != nil {
		b.Fatal(err)
	}
	go m.Serve()
	hs := newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	go func() { _ = hs.Serve(m.HTTP()) }()
	b.Cleanup(func() { hs.Close(); m.Close() })
	leaf := ca.Valid(b, "client")
	connect := func(b *testing.B, p *PeerTLS) bool {
		c, err := p.DialContext(ALPNHTTP1, 5*time.Second)(context.Background(), "tcp", m.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: peer\r\n\r\n"); err != nil {
			b.Fatal(err)
		}
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		return c.(*tls.Conn).ConnectionState().DidResume
	}
	b.Run("full", func(b *testing.B) {
		for b.Loop() {
			p, err := NewPeerTLS(leaf.TLS, ca.Pool())
			if err != nil {
				b.Fatal(err)
			}
			if connect(b, p) {
				b.Fatal("resumed without a session")
			}
		}
	})
	b.Run("resumed", func(b *testing.B) {
		p, err := NewPeerTLS(leaf.TLS, ca.Pool())
		if err != nil {
			b.Fatal(err)
		}
		connect(b, p)
		for b.Loop() {
			if !connect(b, p) {
				b.Fatal("not resumed")
			}
		}
	})
}

package chaos

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/consensus/rpcmux"
	"github.com/infermesh/infermesh/mesh/forward"
)

// serveTLS serves h with TLS from cert/key on a loopback port.
func serveTLS(t *testing.T, certFile, keyFile string, h http.Handler) string {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{pair}}))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func serveClear(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func TestSecurityIssuesWorkingCertificatesAndChecksPorts(t *testing.T) {
	sec, err := NewSecurity(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Node 1 of the loopback test: the client-port certificate names
	// 127.0.0.1 (what the test dials).
	n := &Node{ID: "n1", Index: 1, IP: netip.MustParseAddr("127.0.0.1")}
	args, err := sec.args(n, true)
	if err != nil {
		t.Fatal(err)
	}
	flag := func(name string) string {
		for i, a := range args {
			if a == "--"+name && i+1 < len(args) {
				return args[i+1]
			}
		}
		t.Fatalf("no --%s in %v", name, args)
		return ""
	}
	for _, f := range []string{"tls-cert", "tls-key", "peer-cert", "peer-key", "peer-ca"} {
		st, err := os.Stat(flag(f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("--%s: %v %v", f, st, err)
		}
	}
	if plain, _ := sec.args(n, false); strings.Contains(strings.Join(plain, " "), "peer") {
		t.Fatalf("peer flags without a mesh: %v", plain)
	}

	// A secured pair of ports passes the check.
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	client := serveTLS(t, flag("tls-cert"), flag("tls-key"), ok)
	pair, err := tls.LoadX509KeyPair(flag("peer-cert"), flag("peer-key"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(flag("peer-ca"))
	pool.AppendCertsFromPEM(caPEM)
	ptls, err := rpcmux.NewPeerTLS(pair, pool)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m, err := rpcmux.New(ln, "secret", nil, rpcmux.WithPeerTLS(ptls))
	if err != nil {
		t.Fatal(err)
	}
	go m.Serve()
	// The RPC server as the node builds it (node/cluster.go).
	hs := forward.NewHTTPServer(ok, nil)
	hs.Protocols.SetHTTP2(true)
	go hs.Serve(m.HTTP())
	t.Cleanup(func() { hs.Close(); m.Close() })
	rpc := m.Addr().String()
	ctx := context.Background()
	if err := sec.check(ctx, "n1", 1, client, rpc); err != nil {
		t.Fatalf("a secured node failed the check: %v", err)
	}
	// The harness's clients trust the client port.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: sec.ClientTLS()}}
	res, err := hc.Get("https://" + client + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()

	// Cleartext ports fail it, each for its own reason.
	clear := serveClear(t, ok)
	err = sec.check(ctx, "n1", 1, clear, clear)
	for _, want := range []string{"cleartext HTTP on the client port answered 200", "mutual TLS with a valid peer certificate failed", "answered cleartext HTTP"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("cleartext ports: want %q in %v", want, err)
		}
	}
	// An RPC port with server-only TLS (no client certificate required)
	// fails it too.
	other := serveTLS(t, flag("peer-cert"), flag("peer-key"), ok)
	if err := sec.check(ctx, "n1", 1, client, other); err == nil || !strings.Contains(err.Error(), "without a peer certificate") {
		t.Fatalf("TLS without client certificates on the RPC port: %v", err)
	}
}

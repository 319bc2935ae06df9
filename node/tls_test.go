package node

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infermesh/infermesh/consensus/rpcmux/tlstest"
)

// syncBuffer is a log sink safe for the reload loop's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestTLSReloadKeepsTheOldCertificateOnBadFiles(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	dir := t.TempDir()
	f := func(n string) string { return filepath.Join(dir, n) }
	first := ca.Valid(t, "node")
	first.WriteFiles(t, f("c.crt"), f("c.key"))
	peer1 := ca.Valid(t, "peer")
	peer1.WriteFiles(t, f("p.crt"), f("p.key"))
	ca.WriteCA(t, f("ca.crt"))
	var logs syncBuffer
	cfg := Config{TLSCert: f("c.crt"), TLSKey: f("c.key"), PeerCert: f("p.crt"), PeerKey: f("p.key"), PeerCA: f("ca.crt"), TLSReloadInterval: 20 * time.Millisecond}
	s, err := newTLSState(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	serial := func() string { return s.client.cur.Load().Leaf.SerialNumber.String() }
	peerSerial := func() string { return s.peerTLS().Certificate().Leaf.SerialNumber.String() }
	if serial() != first.Serial.String() || peerSerial() != peer1.Serial.String() {
		t.Fatal("initial certificates not loaded")
	}

	// A key that does not match the certificate, then a broken PEM: both
	// logged, both keep the previous certificate.
	other := ca.Valid(t, "node")
	if err := os.WriteFile(f("c.crt"), other.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.reload(true); err == nil || serial() != first.Serial.String() {
		t.Fatalf("mismatched key: err %v, serial %s", err, serial())
	}
	if err := os.WriteFile(f("p.crt"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.reload(true); err == nil || peerSerial() != peer1.Serial.String() {
		t.Fatalf("broken peer PEM: err %v, serial %s", err, peerSerial())
	}
	for _, want := range []string{"tls: new certificate not loaded", "peer tls: new certificate or CA not loaded"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("log lacks %q:\n%s", want, logs.String())
		}
	}

	// The watch picks up complete, valid files without a signal.
	s.start()
	defer s.close()
	other.WriteFiles(t, f("c.crt"), f("c.key"))
	peer2 := ca.Valid(t, "peer")
	peer2.WriteFiles(t, f("p.crt"), f("p.key"))
	deadline := time.Now().Add(10 * time.Second)
	for serial() != other.Serial.String() || peerSerial() != peer2.Serial.String() {
		if time.Now().After(deadline) {
			t.Fatalf("watch did not reload: %s %s", serial(), peerSerial())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A CA file without a certificate is refused too.
	if err := os.WriteFile(f("ca.crt"), []byte("nothing"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.reload(true); err == nil {
		t.Fatal("an empty CA file was accepted")
	}
}

func TestTLSSettingsComeInSets(t *testing.T) {
	for _, c := range []Config{{TLSCert: "a"}, {TLSKey: "a"}, {PeerCert: "a", PeerKey: "b"}, {PeerCA: "c"}, {TLSReloadInterval: -1}} {
		if len(c.validateTLS()) == 0 {
			t.Errorf("%+v accepted", c)
		}
	}
	if errs := (&Config{TLSCert: "a", TLSKey: "b", PeerCert: "c", PeerKey: "d", PeerCA: "e"}).validateTLS(); len(errs) != 0 {
		t.Errorf("complete sets refused: %v", errs)
	}
}

// rawExchange sends req on a fresh connection from dial and returns the
// parsed answer and its body.
func rawExchange(t *testing.T, dial func() (net.Conn, error), req string) (*http.Response, []byte) {
	t.Helper()
	c, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, body
}

// wantJSONError checks an OpenAI-style error answer.
func wantJSONError(t *testing.T, res *http.Response, body []byte, status int, code string) {
	t.Helper()
	var e struct {
		Error struct {
			Message, Type, Code string
		} `json:"error"`
	}
	if res.StatusCode != status || res.Header.Get("Content-Type") != "application/json" || json.Unmarshal(body, &e) != nil ||
		e.Error.Code != code || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
		t.Fatalf("want %d %s as a JSON error, got %d %q %s", status, code, res.StatusCode, res.Header.Get("Content-Type"), body)
	}
}

// serveClientPort serves h on a loopback listener wrapped by s (nil: no
// TLS) as the node's client port is.
func serveClientPort(t *testing.T, s *tlsState, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 4 << 10}
	wrapped := s.ClientListener(ln, 5*time.Second)
	go srv.Serve(wrapped)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func TestClientPortAnswersGoOwnErrorsAsJSON(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Connection", "close")
		_, _ = io.WriteString(w, "Unsupported transfer encoding") // a handler may say the same words
	})
	ca := tlstest.NewCA(t, "ca")
	dir := t.TempDir()
	ca.Valid(t, "node").WriteFiles(t, filepath.Join(dir, "c.crt"), filepath.Join(dir, "c.key"))
	secure, err := newTLSState(Config{TLSCert: filepath.Join(dir, "c.crt"), TLSKey: filepath.Join(dir, "c.key")}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		s    *tlsState
	}{{"cleartext", nil}, {"tls", secure}} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveClientPort(t, tc.s, ok)
			dial := func() (net.Conn, error) { return net.Dial("tcp", addr) }
			if tc.s != nil {
				dial = func() (net.Conn, error) {
					return tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", NextProtos: []string{"http/1.1"}})
				}
			}
			res, body := rawExchange(t, dial, "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")
			wantJSONError(t, res, body, http.StatusNotImplemented, "unsupported_transfer_encoding")
			res, body = rawExchange(t, dial, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 8<<10)+"\r\n\r\n")
			wantJSONError(t, res, body, http.StatusRequestHeaderFieldsTooLarge, "request_header_fields_too_large")
			res, body = rawExchange(t, dial, "GET / HTTP/1.1\r\nHost: a b\r\n\r\n")
			wantJSONError(t, res, body, http.StatusBadRequest, "malformed_request")
			// A handler's answer, even with the same words, is left alone;
			// so is the second request of a kept-alive connection.
			res, body = rawExchange(t, dial, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			if res.StatusCode != 200 || string(body) != "Unsupported transfer encoding" {
				t.Fatalf("handler answer changed: %d %q", res.StatusCode, body)
			}
		})
	}
	t.Run("tls-extras", func(t *testing.T) {
		addr := serveClientPort(t, secure, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, r.Proto)
		}))
		// HTTP/2 still works over the port's TLS.
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}, ForceAttemptHTTP2: true}}
		res, err := hc.Get("https://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(b) != "HTTP/2.0" {
			t.Fatalf("want HTTP/2.0 over TLS, got %q", b)
		}
		// Cleartext HTTP on the TLS port: a JSON 400.
		res, body := rawExchange(t, func() (net.Conn, error) { return net.Dial("tcp", addr) }, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		wantJSONError(t, res, body, http.StatusBadRequest, "malformed_request")
	})
}

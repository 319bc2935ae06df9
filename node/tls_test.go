package node

import (
	"bytes"
	"log/slog"
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

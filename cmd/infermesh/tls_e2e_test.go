package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/infermesh/infermesh/consensus/rpcmux/tlstest"
)

// httpsClient trusts only the given CA pool.
func httpsClient(pool *x509.CertPool) *http.Client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// servedSerial fetches url and returns the serial of the certificate the
// server presented and the protocol of the answer.
func servedSerial(c *http.Client, url string) (string, string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	// Any HTTP answer will do (/readyz may say 503 while raft starts): the
	// question is which certificate the server presented.
	return resp.TLS.PeerCertificates[0].SerialNumber.String(), resp.Proto, nil
}

// The client and legacy ports serve TLS with --tls-cert/--tls-key; the
// certificate reloads on SIGHUP and when the files change, and a broken
// new file keeps the old certificate.
func TestEndToEndClientTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "client-ca")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	first := ca.Valid(t, "127.0.40.1")
	first.WriteFiles(t, certFile, keyFile)
	const legacyAddr = "127.0.40.1:11434"
	p := startNodeArgs(t, "e2e-tls", nil, "--listen", "127.0.40.1:0", "--gossip-listen", "127.0.40.1:0", "--rpc-listen", "127.0.40.1:0",
		"--legacy-listen", legacyAddr, "--legacy-end-date", "2999-12-31",
		"--tls-cert", certFile, "--tls-key", keyFile)
	url := "https://" + p.addr + "/readyz"
	good := httpsClient(ca.Pool())

	serial, proto, err := servedSerial(good, url)
	if err != nil {
		t.Fatal(err)
	}
	if serial != first.Serial.String() || proto != "HTTP/2.0" {
		t.Fatalf("served serial %s over %s, want %s over HTTP/2.0", serial, proto, first.Serial)
	}
	if _, _, err := servedSerial(good, "https://"+legacyAddr+"/api/version"); err != nil {
		t.Fatalf("legacy port over TLS: %v", err)
	}
	// A client that trusts another CA refuses the server; cleartext gets
	// no answer from the API.
	var unknown x509.UnknownAuthorityError
	if _, _, err := servedSerial(httpsClient(tlstest.NewCA(t, "other").Pool()), url); !errors.As(err, &unknown) {
		t.Fatalf("client with another CA: %v, want an unknown-authority error", err)
	}
	if resp, err := http.Get("http://" + p.addr + "/readyz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("cleartext HTTP to the TLS port: status %d, want net/http's 400", resp.StatusCode)
		}
	}

	// An expired certificate, installed with SIGHUP, is served (the node
	// does what it is told) and refused by a verifying client.
	ca.Expired(t, "127.0.40.1").WriteFiles(t, certFile, keyFile)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var invalid x509.CertificateInvalidError
	eventually(t, 10*time.Second, "the expired certificate to be served and refused", func() error {
		if _, _, err := servedSerial(httpsClient(ca.Pool()), url); !errors.As(err, &invalid) || invalid.Reason != x509.Expired {
			return fmt.Errorf("got %v", err)
		}
		return nil
	})

	// A new certificate and SIGHUP: served at once, old connections or not.
	second := ca.Valid(t, "127.0.40.1")
	second.WriteFiles(t, certFile, keyFile)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the new certificate after SIGHUP", func() error {
		serial, _, err := servedSerial(httpsClient(ca.Pool()), url)
		if err == nil && serial != second.Serial.String() {
			err = fmt.Errorf("serial %s, want %s", serial, second.Serial)
		}
		return err
	})

	// A broken file: an error in the log, the last good certificate stays.
	if err := os.WriteFile(certFile, []byte("-----BEGIN CERTIFICATE-----\nnot a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The signal is handled asynchronously; give it time to be read (the
	// node's unit tests check the log line and the kept certificate
	// directly).
	time.Sleep(time.Second)
	if serial, _, err := servedSerial(httpsClient(ca.Pool()), url); err != nil || serial != second.Serial.String() {
		t.Fatalf("after a bad file: serial %s, %v; want the previous %s", serial, err, second.Serial)
	}

	// No signal: the file watch notices a change within a few seconds.
	third := ca.Valid(t, "127.0.40.1")
	third.WriteFiles(t, certFile, keyFile)
	eventually(t, 30*time.Second, "the watched files to be reloaded", func() error {
		serial, _, err := servedSerial(httpsClient(ca.Pool()), url)
		if err == nil && serial != third.Serial.String() {
			err = fmt.Errorf("serial %s, want %s", serial, third.Serial)
		}
		return err
	})
	if serial, _, err := servedSerial(httpsClient(ca.Pool()), "https://"+legacyAddr+"/api/version"); err != nil || serial != third.Serial.String() {
		t.Fatalf("legacy port after reload: serial %s, %v", serial, err)
	}
}

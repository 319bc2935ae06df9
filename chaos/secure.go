package chaos

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// Security is the TLS material of a secured run: a throwaway certificate
// authority made for the run, and per node a certificate for the client
// port (--tls-cert/--tls-key, the node's address as its IP SAN) and one for
// mutual TLS between nodes (--peer-cert/--peer-key/--peer-ca). Secured runs
// also keep what every run has: a cluster secret, an admin key, and load
// that authenticates with keys created through the admin API. Nothing is
// kept beyond the run's folder; the keys are ECDSA P-256.
type Security struct {
	dir    string
	caFile string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	pool   *x509.CertPool

	mu     sync.Mutex
	issued map[int]nodeCerts
}

// nodeCerts are the files of one node index.
type nodeCerts struct {
	cert, key, peerCert, peerKey string
}

// NewSecurity makes a CA valid from an hour ago for two days and writes its
// certificate to dir/ca.pem.
func NewSecurity(dir string) (*Security, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "infermesh chaos CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(48 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	s := &Security{dir: dir, caFile: filepath.Join(dir, "ca.pem"), caCert: cert, caKey: key,
		pool: x509.NewCertPool(), issued: map[int]nodeCerts{}}
	s.pool.AddCert(cert)
	if err := os.WriteFile(s.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	return s, nil
}

// ClientTLS is the tls.Config of the harness's clients: it trusts the run's
// CA only and checks the node's address against the certificate.
func (s *Security) ClientTLS() *tls.Config {
	if s == nil {
		return nil
	}
	return &tls.Config{RootCAs: s.pool, MinVersion: tls.VersionTLS12}
}

// args returns the TLS flags of node n, issuing its certificates on first
// use (they are reused across the run's scenarios: a node index always has
// the same address).
func (s *Security) args(n *Node, mesh bool) ([]string, error) {
	if s == nil {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	nc, ok := s.issued[n.Index]
	if !ok {
		dir := filepath.Join(s.dir, n.ID)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		nc = nodeCerts{cert: filepath.Join(dir, "client-port.pem"), key: filepath.Join(dir, "client-port.key"),
			peerCert: filepath.Join(dir, "peer.pem"), peerKey: filepath.Join(dir, "peer.key")}
		if err := s.issue(n.ID, net.IP(n.IP.AsSlice()), nc.cert, nc.key); err != nil {
			return nil, err
		}
		if err := s.issue(n.ID+"-peer", nil, nc.peerCert, nc.peerKey); err != nil {
			return nil, err
		}
		s.issued[n.Index] = nc
	}
	args := []string{"--tls-cert", nc.cert, "--tls-key", nc.key}
	if mesh {
		args = append(args, "--peer-cert", nc.peerCert, "--peer-key", nc.peerKey, "--peer-ca", s.caFile)
	}
	return args, nil
}

// issue writes a certificate for name signed by the CA, and its key: a
// server certificate with ip as its IP SAN when ip is set, else a peer
// certificate for both ends of a mutual TLS connection.
func (s *Security) issue(name string, ip net.IP, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := newSerial()
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(47 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.caCert, &key.PublicKey, s.caKey)
	if err != nil {
		return err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return errors.Join(
		os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600),
		os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
}

func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	return n.Add(n, big.NewInt(1)), nil
}

// checkSecured proves, against the running node n, that the secured run is
// what it says: the client port refuses cleartext HTTP and certificates
// from another CA, and the RPC port refuses a TLS client without a peer
// certificate and a cleartext client. It returns what did not hold.
func (s *Security) checkSecured(ctx context.Context, n *Node) error {
	return s.check(ctx, n.ID, n.Index, net.JoinHostPort(n.IP.String(), strconv.Itoa(n.HTTPPort)), n.RPCAddr())
}

// check is checkSecured for the node with id and index whose client port
// is addr and RPC port rpcAddr.
func (s *Security) check(ctx context.Context, id string, index int, addr, rpcAddr string) error {
	var errs []error
	// Cleartext HTTP on the TLS client port gets no API answer.
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	get := func(url string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		return hc.Do(req)
	}
	if res, err := get("http://" + addr + "/v1/models"); err == nil {
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode/100 == 2 {
			errs = append(errs, fmt.Errorf("%s: cleartext HTTP on the client port answered %d", id, res.StatusCode))
		}
	}
	// A client trusting another CA does not accept the node.
	other, err := NewSecurity(filepath.Join(s.dir, "other-ca"))
	if err != nil {
		return err
	}
	hc.Transport = &http.Transport{DisableKeepAlives: true, TLSClientConfig: other.ClientTLS()}
	if res, err := get("https://" + addr + "/readyz"); err == nil {
		res.Body.Close()
		errs = append(errs, fmt.Errorf("%s: a client trusting another CA accepted the client port's certificate", id))
	}
	// The RPC port speaks mutual TLS: a handshake with a peer certificate
	// from the run's CA completes, one without a certificate is refused.
	s.mu.Lock()
	nc, ok := s.issued[index]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%s: no peer certificate issued", id)
	}
	pair, err := tls.LoadX509KeyPair(nc.peerCert, nc.peerKey)
	if err != nil {
		return err
	}
	if err := rpcHandshake(ctx, rpcAddr, []tls.Certificate{pair}, s.pool); err != nil {
		errs = append(errs, fmt.Errorf("%s: mutual TLS with a valid peer certificate failed on the RPC port: %w", id, err))
	}
	if err := rpcHandshake(ctx, rpcAddr, nil, s.pool); err == nil {
		errs = append(errs, fmt.Errorf("%s: the RPC port served a TLS client without a peer certificate", id))
	}
	// The RPC port: cleartext HTTP/2 gets nothing.
	hc.Transport = &http.Transport{DisableKeepAlives: true}
	if res, err := get("http://" + rpcAddr + "/"); err == nil {
		res.Body.Close()
		errs = append(errs, fmt.Errorf("%s: the RPC port answered cleartext HTTP with %d", id, res.StatusCode))
	}
	return errors.Join(errs...)
}

// rpcHandshake completes a TLS 1.3 handshake with the RPC port at addr
// presenting certs (none when nil) and reads the server's first HTTP/2
// frame, where TLS 1.3 reports a refused client certificate.
func rpcHandshake(ctx context.Context, addr string, certs []tls.Certificate, roots *x509.CertPool) error {
	td := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 3 * time.Second}, Config: &tls.Config{
		MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}, Certificates: certs,
		// Peer names are not checked (see consensus/rpcmux); the chain is.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			c, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			_, err = c.Verify(x509.VerifyOptions{Roots: roots})
			return err
		}}}
	c, err := td.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")); err != nil {
		return err
	}
	_, err = c.Read(make([]byte, 9))
	return err
}

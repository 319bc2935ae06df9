// Package tlstest makes certificate authorities and certificates for tests
// of TLS and mutual TLS (ECDSA P-256, generated in the test; nothing is
// stored in the repository).
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a self-signed certificate authority.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate in PEM form.
	PEM []byte
}

// NewCA makes a CA named name, valid from an hour ago for a day.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool is a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Leaf is an issued certificate with its key.
type Leaf struct {
	// TLS is the certificate and key for a tls.Config.
	TLS tls.Certificate
	// Serial is the certificate's serial number.
	Serial *big.Int
	// CertPEM and KeyPEM are the PEM forms.
	CertPEM, KeyPEM []byte
}

// Issue makes a certificate for name (its DNS SAN, or its IP SAN when name
// is an IP address; localhost, 127.0.0.1 and ::1 always) usable by servers
// and clients, valid from notBefore to notAfter.
func (ca *CA) Issue(t testing.TB, name string, notBefore, notAfter time.Time) *Leaf {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name, "localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &Leaf{TLS: pair, Serial: tmpl.SerialNumber, CertPEM: certPEM, KeyPEM: keyPEM}
}

// Valid issues a certificate valid from an hour ago for a day.
func (ca *CA) Valid(t testing.TB, name string) *Leaf {
	t.Helper()
	return ca.Issue(t, name, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))
}

// Expired issues a certificate that expired an hour ago.
func (ca *CA) Expired(t testing.TB, name string) *Leaf {
	t.Helper()
	return ca.Issue(t, name, time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))
}

// WriteFiles writes the leaf's certificate and key to cert and key
// (replacing them atomically, as a careful rotation does) with mode 0600.
func (l *Leaf) WriteFiles(t testing.TB, cert, key string) {
	t.Helper()
	writeAtomic(t, cert, l.CertPEM)
	writeAtomic(t, key, l.KeyPEM)
}

// WriteCA writes the CA certificate to path.
func (ca *CA) WriteCA(t testing.TB, path string) {
	t.Helper()
	writeAtomic(t, path, ca.PEM)
}

func writeAtomic(t testing.TB, path string, b []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n.Add(n, big.NewInt(1))
}

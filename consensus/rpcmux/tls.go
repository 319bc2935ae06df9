package rpcmux

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"
)

// Mutual TLS on the RPC port.
//
// With a PeerTLS the mux admits TLS connections only (see New and
// WithPeerTLS): the first byte of every connection must start a TLS record
// (0x16), the server presents this node's peer certificate and requires and
// verifies one from the client against the peer CA, and the connection is
// routed by the ALPN protocol the client asked for: ALPNRaft to raft (after
// the cluster-secret handshake, which stays on top of TLS), "h2" and
// "http/1.1" to the HTTP side, which gets the *tls.Conn itself so net/http
// serves HTTP/2 or HTTP/1.1 over it.
//
// Clients dial TLS underneath HTTP: DialContext returns a finished TLS
// connection for a plain http:// URL, with the ALPN protocol the transport
// speaks (h2 for an HTTP/2 prior-knowledge transport, http/1.1 otherwise).
// On the wire that is ordinary HTTP/2 or HTTP/1.1 over TLS; the callers
// (Connect clients built for http:// URLs) do not change.
//
// Reconnections resume TLS 1.3 sessions (PSK with a fresh ECDHE exchange):
// no certificate signature or chain building on either side, while both
// sides still check the peer's certificate chain against the CA pool in
// force at that moment, so a CA removed by a rotation is refused on
// resumption as on a full handshake. Update starts a new session cache and
// new ticket keys, so sessions never outlive a rotation.
//
// Any certificate issued by the peer CA is a valid peer, whatever its name:
// the CA must be dedicated to the mesh. Host names and IP SANs are not
// checked, because peers are dialled at whatever address gossip reports.

// ALPNRaft is the ALPN protocol of raft connections under peer TLS.
const ALPNRaft = "infermesh-raft/1"

// ALPN protocols of the HTTP side.
const (
	ALPNHTTP2 = "h2"
	ALPNHTTP1 = "http/1.1"
)

// PeerTLS holds this node's peer certificate and the peer CA pool. Both can
// be replaced at any time with Update (a certificate rotation); new
// handshakes use the new ones, established connections are kept.
type PeerTLS struct {
	state atomic.Pointer[peerState]
}

type peerState struct {
	cert *tls.Certificate
	pool *x509.CertPool
	// sessions holds this node's client sessions with its peers (keyed by
	// address); tickets are the keys of the tickets it issues as a server.
	sessions tls.ClientSessionCache
	tickets  [][32]byte
}

// sessionCacheSize bounds the client sessions kept: a few per peer.
const sessionCacheSize = 1024

// NewPeerTLS returns a PeerTLS presenting cert and trusting peers whose
// certificates chain to a certificate in ca.
func NewPeerTLS(cert tls.Certificate, ca *x509.CertPool) (*PeerTLS, error) {
	p := &PeerTLS{}
	if err := p.Update(cert, ca); err != nil {
		return nil, err
	}
	return p, nil
}

// Update replaces the certificate and the CA pool. A certificate without a
// private key or an empty pool is refused and the old pair stays.
func (p *PeerTLS) Update(cert tls.Certificate, ca *x509.CertPool) error {
	if len(cert.Certificate) == 0 || cert.PrivateKey == nil {
		return errors.New("rpcmux: peer TLS needs a certificate with its private key")
	}
	if ca == nil {
		return errors.New("rpcmux: peer TLS needs a CA pool")
	}
	if cert.Leaf == nil {
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			return fmt.Errorf("rpcmux: peer certificate: %w", err)
		}
		cert.Leaf = leaf
	}
	var key [32]byte
	if _, err := rand.Read(key[:]); err != nil {
		return fmt.Errorf("rpcmux: session ticket key: %w", err)
	}
	p.state.Store(&peerState{cert: &cert, pool: ca, sessions: tls.NewLRUClientSessionCache(sessionCacheSize), tickets: [][32]byte{key}})
	return nil
}

// Certificate returns the certificate presented now.
func (p *PeerTLS) Certificate() *tls.Certificate { return p.state.Load().cert }

// ServerConfig is the tls.Config of the mux: TLS 1.3, a client certificate
// required and verified against the current peer CA, ALPN for raft and
// HTTP. Each handshake reads the current certificate and pool.
func (p *PeerTLS) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			s := p.state.Load()
			c := &tls.Config{
				MinVersion: tls.VersionTLS13,
				// Node-to-node connections are long-lived and pooled;
				// full-size records from the start save a write per
				// answer that does not fit an MSS-sized record.
				DynamicRecordSizingDisabled: true,
				Certificates:                []tls.Certificate{*s.cert},
				ClientAuth:                  tls.RequireAndVerifyClientCert,
				ClientCAs:                   s.pool,
				NextProtos:                  []string{ALPNHTTP2, ALPNHTTP1, ALPNRaft},
				// On resumption crypto/tls checks the session's verified
				// chains against ClientCAs (this pool) and falls back to
				// a full handshake when none is valid any more.
			}
			c.SetSessionTicketKeys(s.tickets)
			return c, nil
		},
	}
}

// ClientConfig is the tls.Config of a connection to a peer asking for the
// ALPN protocol alpn: the current certificate is presented, and the
// server's chain is verified against the current peer CA (its name is not
// checked; see the package notes).
func (p *PeerTLS) ClientConfig(alpn string) *tls.Config {
	return &tls.Config{
		MinVersion:                  tls.VersionTLS13,
		DynamicRecordSizingDisabled: true,
		NextProtos:                  []string{alpn},
		ClientSessionCache:          p.state.Load().sessions,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return p.state.Load().cert, nil
		},
		// The standard verification pins RootCAs at construction and
		// checks the host name; VerifyConnection does the chain check
		// against the pool in force at handshake time instead (on
		// resumed sessions too).
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return p.verify(cs.PeerCertificates, x509.ExtKeyUsageServerAuth)
		},
	}
}

// verify checks a peer's chain against the current pool at the current time.
func (p *PeerTLS) verify(chain []*x509.Certificate, usage x509.ExtKeyUsage) error {
	if len(chain) == 0 {
		return errors.New("rpcmux: the peer sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{
		Roots:         p.state.Load().pool,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{usage},
	})
	if err != nil {
		return fmt.Errorf("rpcmux: peer certificate %q: %w", chain[0].Subject.CommonName, err)
	}
	return nil
}

// DialContext returns a dial function for http.Transport.DialContext that
// opens a TCP connection and completes a TLS handshake asking for alpn
// (ALPNHTTP2 or ALPNHTTP1, matching what the transport speaks). Use it with
// http:// URLs: the transport then speaks its protocol over the TLS
// connection.
func (p *PeerTLS) DialContext(alpn string, dialTimeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		hctx := ctx
		if dialTimeout > 0 {
			var cancel context.CancelFunc
			hctx, cancel = context.WithTimeout(ctx, dialTimeout+DefaultHandshakeTimeout)
			defer cancel()
		}
		conn := tls.Client(raw, p.ClientConfig(alpn))
		if err := conn.HandshakeContext(hctx); err != nil {
			_ = raw.Close()
			return nil, &net.OpError{Op: "dial", Net: network, Addr: raw.RemoteAddr(), Err: fmt.Errorf("peer TLS: %w", err)}
		}
		return conn, nil
	}
}

// tlsRecordByte starts every TLS connection (a handshake record).
const tlsRecordByte byte = 0x16

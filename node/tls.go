package node

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infermesh/infermesh/consensus/rpcmux"
)

// TLS for the node's listeners, with certificates that reload without a
// restart:
//
//   - the client port and the legacy port serve TLS 1.2+ with --tls-cert
//     and --tls-key;
//   - the RPC port (raft and Connect) is mutual TLS with --peer-cert,
//     --peer-key and --peer-ca (see consensus/rpcmux).
//
// The files are read again on ReloadTLS (SIGHUP) and whenever their
// modification time or size changes (checked every TLSReloadInterval). New
// handshakes use the new certificate; open connections keep theirs. A new
// file that does not load (a broken PEM, a key that does not match the
// certificate) is logged and the old certificate stays in use.

// DefaultTLSReloadInterval is how often certificate files are checked for
// changes.
const DefaultTLSReloadInterval = 5 * time.Second

// validateTLS checks that the TLS settings come in complete sets.
func (c *Config) validateTLS() []error {
	var errs []error
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("tls: --tls-cert and --tls-key go together"))
	}
	if n := countSet(c.PeerCert, c.PeerKey, c.PeerCA); n != 0 && n != 3 {
		errs = append(errs, errors.New("peer tls: --peer-cert, --peer-key and --peer-ca go together"))
	}
	if c.TLSReloadInterval < 0 {
		errs = append(errs, fmt.Errorf("tls reload interval %s: must not be negative", c.TLSReloadInterval))
	}
	return errs
}

func countSet(s ...string) int {
	n := 0
	for _, v := range s {
		if v != "" {
			n++
		}
	}
	return n
}

// fileStamp identifies one version of a set of files.
type fileStamp string

func stampOf(paths ...string) fileStamp {
	s := ""
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil {
			s += fmt.Sprintf("%s:%d:%d;", p, fi.ModTime().UnixNano(), fi.Size())
		} else {
			s += p + ":missing;"
		}
	}
	return fileStamp(s)
}

// clientCert serves the client and legacy ports' certificate.
type clientCert struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

func (c *clientCert) load() error {
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("tls certificate %s / key %s: %w", c.certFile, c.keyFile, err)
	}
	c.cur.Store(&pair)
	return nil
}

// serverConfig is the client-facing tls.Config: TLS 1.2+, HTTP/2 and
// HTTP/1.1, the certificate read at each handshake.
func (c *clientCert) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.cur.Load(), nil
		},
	}
}

// peerCert loads the peer certificate and CA into an rpcmux.PeerTLS.
type peerCert struct {
	certFile, keyFile, caFile string
	tls                       *rpcmux.PeerTLS
}

func (p *peerCert) read() (tls.Certificate, *x509.CertPool, error) {
	pair, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
	if err != nil {
		return pair, nil, fmt.Errorf("peer certificate %s / key %s: %w", p.certFile, p.keyFile, err)
	}
	b, err := os.ReadFile(p.caFile)
	if err != nil {
		return pair, nil, fmt.Errorf("peer CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return pair, nil, fmt.Errorf("peer CA %s: no PEM certificate in it", p.caFile)
	}
	return pair, pool, nil
}

func (p *peerCert) load() error {
	pair, pool, err := p.read()
	if err != nil {
		return err
	}
	if p.tls == nil {
		p.tls, err = rpcmux.NewPeerTLS(pair, pool)
		return err
	}
	return p.tls.Update(pair, pool)
}

// tlsState is the node's TLS material and its reload loop.
type tlsState struct {
	log      *slog.Logger
	client   *clientCert // nil: the client ports are cleartext
	peer     *peerCert   // nil: the RPC port is cleartext
	interval time.Duration

	mu          sync.Mutex // serialises reloads
	clientStamp fileStamp
	peerStamp   fileStamp
	stop        chan struct{}
	done        chan struct{}
}

// newTLSState loads the configured certificates; a file that does not
// load fails start-up.
func newTLSState(cfg Config, log *slog.Logger) (*tlsState, error) {
	s := &tlsState{log: log, interval: cfg.TLSReloadInterval}
	if s.interval == 0 {
		s.interval = DefaultTLSReloadInterval
	}
	if cfg.TLSCert != "" {
		s.client = &clientCert{certFile: cfg.TLSCert, keyFile: cfg.TLSKey}
		s.clientStamp = stampOf(cfg.TLSCert, cfg.TLSKey)
		if err := s.client.load(); err != nil {
			return nil, err
		}
	}
	if cfg.PeerCert != "" {
		s.peer = &peerCert{certFile: cfg.PeerCert, keyFile: cfg.PeerKey, caFile: cfg.PeerCA}
		s.peerStamp = stampOf(cfg.PeerCert, cfg.PeerKey, cfg.PeerCA)
		if err := s.peer.load(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// peerTLS is the RPC port's mutual TLS, nil when it is cleartext.
func (s *tlsState) peerTLS() *rpcmux.PeerTLS {
	if s == nil || s.peer == nil {
		return nil
	}
	return s.peer.tls
}

// reload reads the files again: all of them when force (SIGHUP), else only
// those whose stamp changed. Failures keep the old certificates.
func (s *tlsState) reload(force bool) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.client != nil {
		st := stampOf(s.client.certFile, s.client.keyFile)
		if force || st != s.clientStamp {
			s.clientStamp = st
			if err := s.client.load(); err != nil {
				s.log.Error("tls: new certificate not loaded; serving the previous one", "err", err)
				errs = append(errs, err)
			} else {
				s.log.Info("tls: certificate loaded", "cert", s.client.certFile, "serial", serialOf(s.client.cur.Load()))
			}
		}
	}
	if s.peer != nil {
		st := stampOf(s.peer.certFile, s.peer.keyFile, s.peer.caFile)
		if force || st != s.peerStamp {
			s.peerStamp = st
			if err := s.peer.load(); err != nil {
				s.log.Error("peer tls: new certificate or CA not loaded; using the previous ones", "err", err)
				errs = append(errs, err)
			} else {
				s.log.Info("peer tls: certificate and CA loaded", "cert", s.peer.certFile, "serial", serialOf(s.peer.tls.Certificate()))
			}
		}
	}
	return errors.Join(errs...)
}

func serialOf(c *tls.Certificate) string {
	if c == nil || c.Leaf == nil {
		return ""
	}
	return c.Leaf.SerialNumber.String()
}

// start runs the file watch until close; nothing runs without TLS.
func (s *tlsState) start() {
	if s == nil || s.client == nil && s.peer == nil {
		return
	}
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.done)
		t := time.NewTicker(s.interval)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				_ = s.reload(false)
			}
		}
	}()
}

func (s *tlsState) close() {
	if s == nil || s.stop == nil {
		return
	}
	close(s.stop)
	<-s.done
	s.stop = nil
}

// ReloadTLS reads every configured certificate, key and CA file again
// (the serve command calls it on SIGHUP). A file that does not load is
// reported and the previous certificate stays in use.
func (n *Node) ReloadTLS() error {
	if n.tls == nil || n.tls.client == nil && n.tls.peer == nil {
		n.log.Info("reload requested; no TLS certificates configured")
		return nil
	}
	return n.tls.reload(true)
}

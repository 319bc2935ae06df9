package node

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infermesh/infermesh/consensus/rpcmux"
	"github.com/infermesh/infermesh/node/apierr"
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

// Errors net/http answers itself.
//
// net/http answers some malformed requests before any handler runs, with a
// bare text reply written straight to the connection: 501 for an unknown
// Transfer-Encoding, 431 for oversized headers, 400 for a malformed
// request line, header or Host. ClientListener wraps the client and legacy
// ports so that these replies leave as OpenAI-style JSON errors (same
// status, "Connection: close"), like every other error of the API. The
// wrapper sees plaintext: on TLS ports it completes the handshake itself,
// then hands net/http the *tls.Conn for HTTP/2 (which has no such replies;
// a malformed HTTP/2 request is a stream error) and a wrapped connection
// for HTTP/1.1, so HTTP/1.1 requests over TLS carry no r.TLS (the API does
// not read it).

// goReplyHeaders is what net/http writes between the status line and the
// body of its own replies (server.go, conn.serve).
const goReplyHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// goReplyJSON returns the JSON form of one of net/http's own replies, or
// nil when b is not one. A handler's answer never matches: it carries a
// Date header (net/http adds it) and its headers are sorted (Connection
// before Content-Type).
func goReplyJSON(b []byte) []byte {
	const proto = "HTTP/1.1 "
	if !bytes.HasPrefix(b, []byte(proto)) || len(b) < len(proto)+3 {
		return nil
	}
	head, body, ok := bytes.Cut(b[len(proto):], []byte(goReplyHeaders))
	if !ok || bytes.IndexByte(head, '\n') >= 0 || bytes.Contains(body, []byte(goReplyHeaders)) {
		return nil
	}
	status, err := strconv.Atoi(string(head[:3]))
	if err != nil || status < 400 || status > 599 {
		return nil
	}
	var e *apierr.Error
	switch status {
	case http.StatusNotImplemented:
		e = apierr.New(status, apierr.TypeInvalidRequest, apierr.CodeUnsupportedTransferEncoding, "Transfer-Encoding",
			"the request's Transfer-Encoding is not supported: send the body with Content-Length or Transfer-Encoding: chunked")
	case http.StatusRequestHeaderFieldsTooLarge:
		e = apierr.New(status, apierr.TypeInvalidRequest, apierr.CodeHeadersTooLarge, "",
			"the request's header fields are too large")
	default:
		// "400 Bad Request" or "400 Bad Request: malformed Host header".
		msg := "malformed HTTP request"
		if _, detail, ok := strings.Cut(string(body), ": "); ok && detail != "" {
			msg += ": " + detail
		}
		e = apierr.New(status, apierr.TypeInvalidRequest, apierr.CodeMalformedRequest, "", msg)
	}
	j := apierr.Body(e)
	out := fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		status, http.StatusText(status), len(j))
	return append(out, j...)
}

// jsonReplyConn rewrites net/http's own replies (written in one Write) into
// JSON errors.
type jsonReplyConn struct {
	net.Conn
}

// Write implements net.Conn.
func (c jsonReplyConn) Write(b []byte) (int, error) {
	if j := goReplyJSON(b); j != nil {
		if _, err := c.Conn.Write(j); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// CloseWrite half-closes the connection when the inner one can (net/http
// does before closing after its 431 reply, so that the client reads it).
func (c jsonReplyConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// jsonReplyListener wraps every accepted connection in a jsonReplyConn.
type jsonReplyListener struct {
	net.Listener
}

// Accept implements net.Listener.
func (l jsonReplyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return jsonReplyConn{c}, nil
}

// ClientListener wraps ln, the client or legacy port's listener: TLS when
// --tls-cert is set (handshakes bounded by handshakeTimeout), and JSON
// bodies for net/http's own error replies (see above).
func (s *tlsState) ClientListener(ln net.Listener, handshakeTimeout time.Duration) net.Listener {
	if s == nil || s.client == nil {
		return jsonReplyListener{ln}
	}
	return newTLSListener(ln, s.client.serverConfig(), handshakeTimeout)
}

// tlsListener completes TLS handshakes on connections from an inner
// listener, each in its own goroutine (a slow client holds nobody else
// up), and hands net/http the finished connections.
type tlsListener struct {
	inner   net.Listener
	cfg     *tls.Config
	timeout time.Duration
	conns   chan net.Conn
	errc    chan error
	done    chan struct{}
	once    sync.Once
}

func newTLSListener(inner net.Listener, cfg *tls.Config, timeout time.Duration) *tlsListener {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	l := &tlsListener{inner: inner, cfg: cfg, timeout: timeout, conns: make(chan net.Conn),
		errc: make(chan error, 1), done: make(chan struct{})}
	go l.acceptLoop()
	return l
}

func (l *tlsListener) acceptLoop() {
	for {
		raw, err := l.inner.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			l.errc <- err
			return
		}
		go l.handshake(raw)
	}
}

// handshake runs the server handshake on raw and delivers the connection:
// a *tls.Conn for HTTP/2, wrapped for HTTP/1.1. A client that speaks
// cleartext HTTP to the TLS port gets a JSON 400, as net/http would send
// its text one.
func (l *tlsListener) handshake(raw net.Conn) {
	c := tls.Server(raw, l.cfg)
	_ = raw.SetDeadline(time.Now().Add(l.timeout))
	if err := c.Handshake(); err != nil {
		var re tls.RecordHeaderError
		if errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader[:]) {
			_, _ = jsonReplyConn{re.Conn}.Write([]byte("HTTP/1.1 400 Bad Request" + goReplyHeaders + "400 Bad Request: client sent an HTTP request to an HTTPS server"))
		}
		_ = raw.Close()
		return
	}
	_ = raw.SetDeadline(time.Time{})
	var out net.Conn = c
	if c.ConnectionState().NegotiatedProtocol != "h2" {
		out = jsonReplyConn{c}
	}
	select {
	case l.conns <- out:
	case <-l.done:
		_ = c.Close()
	}
}

// looksLikeHTTP reports whether a TLS record header is in fact the start
// of an HTTP/1 request (net/http's test for the same reply).
func looksLikeHTTP(hdr []byte) bool {
	switch string(hdr) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "DELET", "PATCH":
		return true
	}
	return false
}

// Accept implements net.Listener.
func (l *tlsListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case err := <-l.errc:
		l.errc <- err // every later Accept fails alike
		return nil, err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (l *tlsListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.inner.Close()
}

// Addr implements net.Listener.
func (l *tlsListener) Addr() net.Addr { return l.inner.Addr() }

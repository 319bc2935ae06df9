// Package rpcmux shares one internal TCP listener between raft and the
// node-to-node Connect services (HTTP/2 cleartext, or HTTP/2 and HTTP/1.1
// over mutual TLS).
//
// Without peer TLS, a raft connection starts with the single byte RaftByte,
// written by DialRaft, followed by a mutual challenge–response that proves
// both ends hold the cluster secret (see handshake.go); only connections
// that pass it reach raft. Every other connection is handed to the HTTP side
// with its first byte put back. RaftByte is outside printable ASCII, so it
// can never be the start of an HTTP/1 request line, the HTTP/2 connection
// preface ("PRI") or a TLS record (0x16).
//
// With peer TLS (WithPeerTLS) every connection must be mutual TLS; the
// ALPN protocol routes it (see tls.go), and raft connections still run the
// cluster-secret handshake inside TLS.
package rpcmux

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// RaftByte is the first byte of every raft connection on the shared port.
const RaftByte byte = 0xA7

// DefaultSniffTimeout bounds how long a new connection may take to send its
// first byte before the mux drops it.
const DefaultSniffTimeout = 10 * time.Second

// Mux accepts on one listener and routes each connection to the raft or the
// HTTP side by its first byte. Create it with New, run Serve, and hand
// Raft() to consensus and HTTP() to an http.Server (see NewServer).
type Mux struct {
	ln        net.Listener
	logger    *slog.Logger
	sniff     time.Duration
	secret    []byte
	handshake time.Duration
	refused   atomic.Uint64
	peerTLS   *PeerTLS
	tlsConf   *tls.Config
	tlsRefuse atomic.Uint64

	raft *subListener
	http *subListener

	closeOnce sync.Once
	closed    chan struct{}
	wg        sync.WaitGroup

	mu       sync.Mutex
	sniffing map[net.Conn]struct{} // connections whose first byte is awaited
}

// Option configures a Mux.
type Option func(*Mux)

// WithPeerTLS makes every connection to the mux mutual TLS with p (see
// tls.go); a nil p leaves the mux cleartext.
func WithPeerTLS(p *PeerTLS) Option {
	return func(m *Mux) { m.peerTLS = p }
}

// New returns a mux over ln whose raft side admits only connections that
// prove secret, the cluster secret (an empty one is refused). A nil logger
// discards. It does not accept until Serve runs.
func New(ln net.Listener, secret string, logger *slog.Logger, opts ...Option) (*Mux, error) {
	if secret == "" {
		return nil, errEmptySecret
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m := &Mux{
		ln:        ln,
		logger:    logger,
		sniff:     DefaultSniffTimeout,
		secret:    []byte(secret),
		handshake: DefaultHandshakeTimeout,
		closed:    make(chan struct{}),
		sniffing:  map[net.Conn]struct{}{},
	}
	for _, o := range opts {
		o(m)
	}
	if m.peerTLS != nil {
		m.tlsConf = m.peerTLS.ServerConfig()
	}
	m.raft = newSubListener(ln.Addr())
	m.http = newSubListener(ln.Addr())
	return m, nil
}

// TLSRefused counts connections closed under peer TLS before reaching
// either side: not TLS at all, or a failed TLS handshake (no client
// certificate, one from another CA, expired, ...).
func (m *Mux) TLSRefused() uint64 { return m.tlsRefuse.Load() }

// PeerTLS reports the mux's peer TLS, nil when it is cleartext.
func (m *Mux) PeerTLS() *PeerTLS { return m.peerTLS }

// RaftRefused counts raft connections closed because their handshake
// failed (a wrong or missing cluster secret, or a peer that broke off).
func (m *Mux) RaftRefused() uint64 { return m.refused.Load() }

// Addr is the address of the shared listener.
func (m *Mux) Addr() net.Addr { return m.ln.Addr() }

// Raft is the listener of raft connections; their RaftByte is consumed.
func (m *Mux) Raft() net.Listener { return m.raft }

// HTTP is the listener of every other connection, byte-for-byte intact.
func (m *Mux) HTTP() net.Listener { return m.http }

// Serve accepts until Close; it returns nil after Close and the accept error
// otherwise.
func (m *Mux) Serve() error {
	var backoff time.Duration
	for {
		conn, err := m.ln.Accept()
		if err != nil {
			select {
			case <-m.closed:
				return nil
			default:
			}
			// Retry what net/http's Serve retries (e.g. EMFILE).
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				m.logger.Warn("rpcmux accept", "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("rpcmux accept: %w", err)
		}
		backoff = 0
		m.mu.Lock()
		select {
		case <-m.closed:
			m.mu.Unlock()
			_ = conn.Close()
			return nil
		default:
		}
		m.sniffing[conn] = struct{}{}
		m.wg.Add(1)
		m.mu.Unlock()
		go m.route(conn)
	}
}

func (m *Mux) route(conn net.Conn) {
	defer m.wg.Done()
	b, ok := m.sniffFirst(conn)
	if m.tlsConf != nil {
		m.routeTLS(conn, b, ok)
		return
	}
	raft := ok && b == RaftByte
	// The raft handshake runs here, on the connection's own goroutine, so
	// a slow or hostile client holds up nobody; Close still closes it.
	if raft && !m.raftHandshake(conn, conn) {
		ok = false
	}
	var out net.Conn = &peekedConn{Conn: conn, first: b, pending: true}
	if raft {
		out = conn // raft reads after the mux byte
	}
	m.deliver(conn, out, raft, ok)
}

// raftHandshake proves the cluster secret on out, the connection as raft
// will use it (conn itself, or its TLS session); a refusal is counted and
// logged.
func (m *Mux) raftHandshake(conn, out net.Conn) bool {
	if err := serverHandshake(out, m.secret, m.handshake); err != nil {
		m.refused.Add(1)
		m.logger.Warn("rpcmux: refused a raft connection", "remote", conn.RemoteAddr(), "err", err)
		return false
	}
	return true
}

// deliver stops tracking the accepted connection conn and hands out (conn
// as its listener will see it) to raft or the HTTP server, or closes conn
// when ok is false.
func (m *Mux) deliver(conn, out net.Conn, raft, ok bool) {
	m.mu.Lock()
	delete(m.sniffing, conn)
	m.mu.Unlock()
	if !ok {
		_ = conn.Close()
		return
	}
	if raft {
		m.raft.deliver(out, m.closed)
		return
	}
	m.http.deliver(out, m.closed)
}

// routeTLS finishes the TLS handshake of a connection whose first byte is
// b and routes it by ALPN; anything else is closed and counted.
func (m *Mux) routeTLS(conn net.Conn, b byte, ok bool) {
	var out net.Conn
	raft := false
	if ok && b != tlsRecordByte {
		m.tlsRefuse.Add(1)
		m.logger.Warn("rpcmux: refused a connection that is not TLS (peer TLS is on)", "remote", conn.RemoteAddr())
		ok = false
	}
	if ok {
		tc := tls.Server(&peekedConn{Conn: conn, first: b, pending: true}, m.tlsConf)
		ctx, cancel := context.WithTimeout(context.Background(), m.handshake)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			m.tlsRefuse.Add(1)
			m.logger.Warn("rpcmux: refused a TLS connection", "remote", conn.RemoteAddr(), "err", err)
			ok = false
		} else {
			out = tc
			raft = tc.ConnectionState().NegotiatedProtocol == ALPNRaft
		}
	}
	if ok && raft && !m.raftHandshake(conn, out) {
		ok = false
	}
	m.deliver(conn, out, raft, ok)
}

func (m *Mux) sniffFirst(conn net.Conn) (byte, bool) {
	var b [1]byte
	if err := conn.SetReadDeadline(time.Now().Add(m.sniff)); err != nil {
		return 0, false
	}
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		m.logger.Debug("rpcmux: connection closed before its first byte", "remote", conn.RemoteAddr(), "err", err)
		return 0, false
	}
	if err := conn.SetReadDeadline(time.Time{}); err != nil {
		return 0, false
	}
	return b[0], true
}

// Close stops accepting, closes both sides and waits for connections being
// sniffed. Connections already handed out are their owners' to close.
func (m *Mux) Close() error {
	var err error
	m.closeOnce.Do(func() {
		m.mu.Lock()
		close(m.closed)
		for c := range m.sniffing {
			_ = c.Close()
		}
		m.mu.Unlock()
		err = m.ln.Close()
		_ = m.raft.Close()
		_ = m.http.Close()
		m.wg.Wait()
	})
	return err
}

// raftDialAttempt bounds one connection attempt inside DialRaft.
const raftDialAttempt = 500 * time.Millisecond

// DialRaft connects to a mux at addr, announces a raft connection and runs
// the client side of the handshake with secret: it returns a connection
// only when the server proved the same secret (ErrHandshake otherwise). An
// empty secret is refused before dialling.
//
// A connection attempt that times out (the peer's address drops packets: a
// partition) is repeated every raftDialAttempt until timeout, rather than
// left to the kernel's SYN retransmissions, which back off to 1, 3, 7, 15 s:
// a dial started during a partition then connects within half a second of
// the heal instead of failing at the end of timeout (raft uses 10 s) and
// only then dialling again. The chaos suite saw a healed node learn the new
// leader 2.8 s after the heal for that reason. A refused connection (the
// peer is down) fails at once, as before.
func DialRaft(addr, secret string, timeout time.Duration) (net.Conn, error) {
	if secret == "" {
		return nil, errEmptySecret
	}
	conn, err := dialPersistent(addr, timeout)
	if err != nil {
		return nil, err
	}
	hs := DefaultHandshakeTimeout
	if timeout > 0 {
		hs = min(hs, timeout)
	}
	_ = conn.SetWriteDeadline(time.Now().Add(hs))
	if _, err := conn.Write([]byte{RaftByte}); err != nil {
		_ = conn.Close()
		return nil, err
	}
	if err := clientHandshake(conn, []byte(secret), hs); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("raft connection to %s: %w", addr, err)
	}
	return conn, nil
}

// DialRaftTLS is DialRaft under peer TLS: the connection is mutual TLS with
// p (ALPN ALPNRaft; the server must present a certificate from the peer
// CA), and the cluster-secret handshake runs inside it. A nil p is DialRaft.
func DialRaftTLS(addr, secret string, p *PeerTLS, timeout time.Duration) (net.Conn, error) {
	if p == nil {
		return DialRaft(addr, secret, timeout)
	}
	if secret == "" {
		return nil, errEmptySecret
	}
	raw, err := dialPersistent(addr, timeout)
	if err != nil {
		return nil, err
	}
	hs := DefaultHandshakeTimeout
	if timeout > 0 {
		hs = min(hs, timeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hs)
	defer cancel()
	conn := tls.Client(raw, p.ClientConfig(ALPNRaft))
	if err := conn.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("raft connection to %s: peer TLS: %w", addr, err)
	}
	if got := conn.ConnectionState().NegotiatedProtocol; got != ALPNRaft {
		_ = conn.Close()
		return nil, fmt.Errorf("raft connection to %s: the server does not speak raft over TLS (ALPN %q)", addr, got)
	}
	if err := clientHandshake(conn, []byte(secret), hs); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("raft connection to %s: %w", addr, err)
	}
	return conn, nil
}

// dialPersistent dials addr, repeating attempts that time out until
// timeout has passed (one plain attempt when timeout <= 0).
func dialPersistent(addr string, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 {
		return net.Dial("tcp", addr)
	}
	deadline := time.Now().Add(timeout)
	left := timeout
	for {
		conn, err := net.DialTimeout("tcp", addr, min(raftDialAttempt, left))
		if err == nil {
			return conn, nil
		}
		var ne net.Error
		if left = time.Until(deadline); !errors.As(err, &ne) || !ne.Timeout() || left <= 0 {
			return nil, err
		}
	}
}

// subListener is a net.Listener fed by the mux.
type subListener struct {
	addr      net.Addr
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func newSubListener(addr net.Addr) *subListener {
	return &subListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *subListener) deliver(conn net.Conn, muxClosed <-chan struct{}) {
	select {
	case l.conns <- conn:
	case <-l.done:
		_ = conn.Close()
	case <-muxClosed:
		_ = conn.Close()
	}
}

// Accept waits for the next routed connection.
func (l *subListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops this side; pending connections are closed by the mux.
func (l *subListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

// Addr is the shared listener's address.
func (l *subListener) Addr() net.Addr { return l.addr }

// peekedConn replays the sniffed first byte.
type peekedConn struct {
	net.Conn
	first   byte
	pending bool
	mu      sync.Mutex
}

// Read returns the sniffed byte first, then reads from the connection.
func (c *peekedConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.pending && len(p) > 0 {
		c.pending = false
		c.mu.Unlock()
		p[0] = c.first
		if len(p) == 1 {
			return 1, nil
		}
		n, err := c.Conn.Read(p[1:])
		if err != nil && n == 0 {
			// The replayed byte is data; report the error on the next call.
			return 1, nil
		}
		return n + 1, err
	}
	c.mu.Unlock()
	return c.Conn.Read(p)
}

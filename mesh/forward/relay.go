package forward

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	forwardv1 "github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1"
	"github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1/forwardv1connect"
)

// Relaying an HTTP upgrade (a WebSocket) to the peer that serves it.
//
// The entry node does not speak the upgraded protocol: it passes the
// client's upgrade request to the peer in a RelayOpen, and once the peer's
// local handler has answered 101 and hijacked the connection, it copies the
// raw bytes both ways. The peer hands its handler a ResponseWriter whose
// Hijack returns a net.Conn made of the bidirectional stream, so the
// handler (and its WebSocket library) runs exactly as on a direct
// connection. See mesh/DESIGN.md, "Upgrades".

// relayClients holds the HTTP/2 transport Relay calls need (a bidirectional
// stream cannot run on the HTTP/1.1 transport Forward uses) and one Connect
// client per peer on it.
type relayClients struct {
	tr   *http.Transport
	opts []connect.ClientOption

	mu    sync.Mutex
	peers map[string]forwardv1connect.ForwardServiceClient
}

func newRelayClients(cfg ClientConfig, sign connect.Interceptor) *relayClients {
	h2 := cfg
	h2.H2C = true
	h2.Dial = cfg.DialHTTP2
	return &relayClients{
		tr: newTransport(h2),
		opts: []connect.ClientOption{connect.WithReadMaxBytes(cfg.MaxResponseBytes),
			connect.WithAcceptCompression("gzip", nil, nil), connect.WithInterceptors(sign)},
		peers: map[string]forwardv1connect.ForwardServiceClient{},
	}
}

func (rc *relayClients) peer(addr string) forwardv1connect.ForwardServiceClient {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	pc := rc.peers[addr]
	if pc == nil {
		pc = forwardv1connect.NewForwardServiceClient(memBody{rc.tr}, "http://"+addr, rc.opts...)
		rc.peers[addr] = pc
	}
	return pc
}

// Relay opens a relay of the upgrade request req (protocol is the client's
// Upgrade header, e.g. "websocket") to the peer at addr. Read the peer's
// answer with Tunnel.Head; cancel ctx or Close the tunnel to abandon it.
func (c *Client) Relay(ctx context.Context, addr string, req *Request, protocol string) (*Tunnel, error) {
	msg := &forwardv1.ForwardRequest{
		Method:       req.Method,
		Path:         req.Path,
		Headers:      headersToProto(req.Header),
		Caller:       callerToProto(req.Caller),
		HopCount:     MaxHops,
		RequestId:    req.RequestID,
		OriginNodeId: c.cfg.NodeID,
		Host:         req.Host,
		Model:        req.Model,
	}
	if req.OriginNodeID != "" {
		msg.OriginNodeId = req.OriginNodeID
	}
	bs := c.relay.peer(addr).Relay(ctx)
	err := bs.Send(&forwardv1.RelayRequest{Frame: &forwardv1.RelayRequest_Open{Open: &forwardv1.RelayOpen{Request: msg, Protocol: protocol}}})
	if err != nil && !errors.Is(err, io.EOF) { // io.EOF: the peer answered already; Head reads why
		c.met.calls.WithLabelValues(resultOf(err)).Inc()
		bs.CloseResponse()
		return nil, err
	}
	return &Tunnel{bs: bs, met: c.met}, nil
}

// Tunnel is one relayed upgrade, seen from the entry node: the peer's
// head, then its bytes (Read) while the client's bytes go the other way
// (Write). Read and Write may run concurrently with each other; neither
// may run concurrently with itself.
type Tunnel struct {
	bs      *connect.BidiStreamForClient[forwardv1.RelayRequest, forwardv1.RelayResponse]
	met     *clientMetrics
	head    bool
	pending []byte
	counted bool
	once    sync.Once
}

// Head waits for the peer's answer: 101 means upgraded, anything else is
// a refusal whose body Read returns. Errors here mean no response byte was
// produced: see IsRefused, IsDraining and Retryable.
func (t *Tunnel) Head() (Head, error) {
	if t.head {
		return Head{}, fmt.Errorf("%w: head read twice", ErrProtocol)
	}
	msg, err := t.bs.Receive()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%w: relay ended before the head", ErrProtocol)
		}
		t.count(err)
		return Head{}, err
	}
	h := msg.GetHead()
	if h == nil {
		err := fmt.Errorf("%w: first relay frame is not a head", ErrProtocol)
		t.count(err)
		return Head{}, err
	}
	t.head = true
	return Head{Status: int(h.GetStatus()), Header: headersFromProto(h.GetHeaders())}, nil
}

// Read reads the peer's bytes; io.EOF when the peer closed its side.
func (t *Tunnel) Read(p []byte) (int, error) {
	if !t.head {
		return 0, fmt.Errorf("%w: read before the head", ErrProtocol)
	}
	for len(t.pending) == 0 {
		msg, err := t.bs.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) {
				t.count(nil)
				return 0, io.EOF
			}
			t.count(err)
			return 0, err
		}
		d, ok := msg.GetFrame().(*forwardv1.RelayResponse_Data)
		if !ok {
			err := fmt.Errorf("%w: unexpected relay frame %T", ErrProtocol, msg.GetFrame())
			t.count(err)
			return 0, err
		}
		t.pending = d.Data
	}
	n := copy(p, t.pending)
	t.pending = t.pending[n:]
	return n, nil
}

// Write sends the client's bytes to the peer.
func (t *Tunnel) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if err := t.bs.Send(&forwardv1.RelayRequest{Frame: &forwardv1.RelayRequest_Data{Data: p}}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// CloseWrite tells the peer the client closed its side.
func (t *Tunnel) CloseWrite() error { return t.bs.CloseRequest() }

// Close abandons the tunnel (both directions); call it when done.
func (t *Tunnel) Close() error {
	t.once.Do(func() {
		t.bs.CloseRequest()
		t.bs.CloseResponse()
	})
	if !t.counted {
		t.counted = true
		t.met.calls.WithLabelValues("abandoned").Inc()
	}
	return nil
}

func (t *Tunnel) count(err error) {
	if t.counted {
		return
	}
	t.counted = true
	if err == nil {
		t.met.ok.Inc()
		return
	}
	t.met.calls.WithLabelValues(resultOf(err)).Inc()
}

// Relay serves one ForwardService.Relay call.
func (sv *service) Relay(ctx context.Context, bs *connect.BidiStream[forwardv1.RelayRequest, forwardv1.RelayResponse]) error {
	return sv.s.relay(ctx, bs)
}

// relay replays an upgrade request on the local handler and, when the
// handler upgrades, carries the connection's bytes until it closes.
func (s *Server) relay(ctx context.Context, bs *connect.BidiStream[forwardv1.RelayRequest, forwardv1.RelayResponse]) error {
	// The first Receive is where peer authentication verifies the call.
	first, err := bs.Receive()
	if err != nil {
		return err
	}
	open := first.GetOpen()
	if open == nil || open.GetRequest() == nil {
		s.met.calls.WithLabelValues("bad_request").Inc()
		return connect.NewError(connect.CodeInvalidArgument, errors.New("a relay starts with an open frame"))
	}
	start := time.Now()
	if !s.enter() {
		s.met.calls.WithLabelValues("draining").Inc()
		err := connect.NewError(connect.CodeUnavailable, errors.New("node is draining"))
		err.Meta().Set(RefusalHeader, "draining")
		return err
	}
	defer s.exit()
	msg := open.GetRequest()
	if hops := msg.GetHopCount(); hops > MaxHops {
		s.met.calls.WithLabelValues("hop_limit").Inc()
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("hop count %d exceeds the hop limit %d", hops, MaxHops))
	}
	protocol := open.GetProtocol()
	if protocol == "" || strings.ContainsAny(protocol, " \t\r\n,") {
		s.met.calls.WithLabelValues("bad_request").Inc()
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("bad upgrade protocol %q", protocol))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r, err := buildRequest(ctx, msg)
	if err != nil {
		s.met.calls.WithLabelValues("bad_request").Inc()
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	r.Header.Set("Connection", "Upgrade")
	r.Header.Set("Upgrade", protocol)
	w := &relayWriter{send: bs.Send, recv: bs.Receive, chunk: s.cfg.ChunkSize, header: http.Header{}, remote: r.RemoteAddr}
	err = w.serve(ctx, s.local, r)
	if err != nil {
		s.met.calls.WithLabelValues("error").Inc()
		s.log.Warn("relayed request failed", "request_id", msg.GetRequestId(), "origin", msg.GetOriginNodeId(), "err", err)
	} else {
		s.met.ok.Inc()
	}
	s.met.duration.Observe(time.Since(start).Seconds())
	return err
}

// relayWriter is the http.ResponseWriter (and http.Hijacker) a relayed
// upgrade request is served with. The head goes out at WriteHeader (or the
// first Write); a 101 head may then be hijacked into a relayConn.
type relayWriter struct {
	send   func(*forwardv1.RelayResponse) error
	recv   func() (*forwardv1.RelayRequest, error)
	chunk  int
	remote string

	mu       sync.Mutex // serialises sends: the handler and the hijacked connection
	header   http.Header
	status   int
	err      error
	conn     *relayConn
	hijacked bool
}

// serve runs h and, when h hijacked the connection, waits until the
// connection is closed or ctx ends.
func (w *relayWriter) serve(ctx context.Context, h http.Handler, r *http.Request) error {
	var failure string
	func() {
		defer func() {
			if p := recover(); p != nil {
				failure = fmt.Sprintf("handler panic: %v", p)
			}
		}()
		h.ServeHTTP(w, r)
	}()
	w.mu.Lock()
	conn, status := w.conn, w.status
	if failure != "" && status == 0 {
		w.mu.Unlock()
		return errors.New(failure)
	}
	if status == 0 {
		w.writeHeaderLocked(http.StatusOK)
	}
	err := w.err
	w.mu.Unlock()
	if conn != nil {
		select {
		case <-conn.done:
		case <-ctx.Done():
		}
		return nil
	}
	if failure != "" {
		return errors.New(failure)
	}
	return err
}

// Header returns the response headers; they are fixed at WriteHeader.
func (w *relayWriter) Header() http.Header { return w.header }

// WriteHeader sends the head. 1xx other than 101 are not relayed.
func (w *relayWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writeHeaderLocked(code)
}

func (w *relayWriter) writeHeaderLocked(code int) {
	if w.status != 0 || (code >= 100 && code < 200 && code != http.StatusSwitchingProtocols) {
		return
	}
	w.status = code
	w.sendLocked(&forwardv1.RelayResponse{Frame: &forwardv1.RelayResponse_Head{Head: &forwardv1.Head{
		Status: int32(code), Headers: headersToProto(w.header)}}})
}

func (w *relayWriter) sendLocked(m *forwardv1.RelayResponse) error {
	if w.err != nil {
		return w.err
	}
	w.err = w.send(m)
	return w.err
}

// Write sends body bytes of a response that did not upgrade.
func (w *relayWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	w.writeHeaderLocked(http.StatusOK)
	return w.writeLocked(p)
}

func (w *relayWriter) writeLocked(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), w.chunk)
		if err := w.sendLocked(&forwardv1.RelayResponse{Frame: &forwardv1.RelayResponse_Data{Data: p[:c]}}); err != nil {
			return n, err
		}
		n += c
		p = p[c:]
	}
	return n, nil
}

// Flush does nothing: every Write is sent at once.
func (w *relayWriter) Flush() {}

// Hijack hands the relayed connection to the handler. The handler must
// have written the 101 head first (as WebSocket libraries do).
func (w *relayWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	if w.status != http.StatusSwitchingProtocols {
		return nil, nil, errors.New("forward: a relayed connection is hijacked only after WriteHeader(101)")
	}
	if w.err != nil {
		return nil, nil, w.err
	}
	w.hijacked = true
	w.conn = &relayConn{w: w, done: make(chan struct{})}
	return w.conn, bufio.NewReadWriter(bufio.NewReader(w.conn), bufio.NewWriter(w.conn)), nil
}

// relayConn is the upgraded connection on the serving node: reads come
// from the entry node's Data frames, writes go back as Data frames.
type relayConn struct {
	w       *relayWriter
	pending []byte
	eof     error
	done    chan struct{}
	once    sync.Once
}

// Read returns the client's bytes; io.EOF when the client closed its side.
func (c *relayConn) Read(p []byte) (int, error) {
	for len(c.pending) == 0 {
		if c.eof != nil {
			return 0, c.eof
		}
		select {
		case <-c.done:
			return 0, net.ErrClosed
		default:
		}
		msg, err := c.w.recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				c.eof = io.EOF
			} else {
				c.eof = err
			}
			continue
		}
		d, ok := msg.GetFrame().(*forwardv1.RelayRequest_Data)
		if !ok {
			c.eof = fmt.Errorf("%w: unexpected relay frame %T", ErrProtocol, msg.GetFrame())
			continue
		}
		c.pending = d.Data
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// Write sends bytes to the client.
func (c *relayConn) Write(p []byte) (int, error) {
	select {
	case <-c.done:
		return 0, net.ErrClosed
	default:
	}
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	return c.w.writeLocked(p)
}

// Close ends the relay: the stream finishes and the entry node closes the
// client's connection.
func (c *relayConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return nil
}

// LocalAddr has no meaning for a relayed connection.
func (c *relayConn) LocalAddr() net.Addr { return relayAddr("relay") }

// RemoteAddr is the client's address as the entry node saw it.
func (c *relayConn) RemoteAddr() net.Addr { return relayAddr(c.w.remote) }

var errNoDeadline = errors.New("forward: a relayed connection has no deadlines; cancel the request context instead")

// SetDeadline is not supported.
func (c *relayConn) SetDeadline(time.Time) error { return errNoDeadline }

// SetReadDeadline is not supported.
func (c *relayConn) SetReadDeadline(time.Time) error { return errNoDeadline }

// SetWriteDeadline is not supported.
func (c *relayConn) SetWriteDeadline(time.Time) error { return errNoDeadline }

// relayAddr is a net.Addr given as a string.
type relayAddr string

// Network names the relay.
func (a relayAddr) Network() string { return "infermesh-relay" }

// String returns the address.
func (a relayAddr) String() string { return string(a) }

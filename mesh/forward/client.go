package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	forwardv1 "github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1"
	"github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1/forwardv1connect"
)

// ClientConfig configures a Client.
type ClientConfig struct {
	// NodeID is this node's id; it goes out as the origin of every request.
	NodeID string
	// ClusterSecret keys the signature of every call (mesh/peerauth); the
	// secret itself never leaves the node. Required unless Signer is set.
	ClusterSecret string
	// Signer signs every call instead of a peerauth.Signer built from
	// ClusterSecret (the node shares one between its clients).
	Signer connect.Interceptor
	// DialTimeout bounds connecting to a peer. Default 2s.
	DialTimeout time.Duration
	// IdleConnTimeout closes pooled connections idle this long. Default 90s.
	IdleConnTimeout time.Duration
	// PingAfter sends an HTTP/2 ping (H2C only) on a connection that has
	// received nothing for this long, and PingTimeout closes it if the ping
	// is not answered; together they notice peers that vanished without
	// closing connections. Defaults 10s and 5s.
	PingAfter, PingTimeout time.Duration
	// MaxResponseBytes bounds one response message. Default 16 MiB.
	MaxResponseBytes int
	// H2C makes calls over HTTP/2 without TLS (prior knowledge) on a few
	// multiplexed connections per peer instead of pooled HTTP/1.1
	// keep-alive connections. HTTP/1.1 is the default because it measured
	// about half the per-call latency on loopback (see mesh/DESIGN.md);
	// the server speaks both.
	H2C bool
	// Dial, when set, opens connections to peers instead of a plain TCP
	// dial; the node passes a mutual-TLS dialer (rpcmux.PeerTLS) that
	// returns finished TLS connections with the ALPN protocol matching
	// H2C. URLs stay http://.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DialHTTP2 opens connections for Relay calls (upgrades such as
	// WebSockets), which need HTTP/2 whatever H2C says: with peer TLS, a
	// dialer whose ALPN protocol is h2. Nil dials plain TCP (h2c).
	DialHTTP2 func(ctx context.Context, network, addr string) (net.Conn, error)
	// MuxMaxBody is the largest request body sent over the peer's
	// multiplexed stream (Multiplex); larger bodies take a call of their
	// own, so a large upload never holds up the small requests sharing
	// the stream. Default 64 KiB; negative: never multiplex.
	MuxMaxBody int
	// MuxPingAfter and MuxPingTimeout are PingAfter and PingTimeout for
	// the connection carrying the peer's Multiplex stream. Every call
	// waiting on that stream depends on the one connection, and a peer cut
	// off by a partition closes nothing, so it is checked much sooner than
	// the per-call connections: a connection silent for MuxPingAfter is
	// pinged, and one whose ping goes unanswered for MuxPingTimeout is
	// closed, failing its calls retryably (before their head the
	// dispatcher moves them to the next candidate). Pings go out only on
	// a connection that received nothing for MuxPingAfter. Defaults 1s
	// and 3s.
	MuxPingAfter, MuxPingTimeout time.Duration
	// MaxIdleConnsPerPeer bounds idle HTTP/1.1 connections kept per peer.
	// It should cover the usual concurrency towards one peer, or
	// connections churn. Default 512.
	MaxIdleConnsPerPeer int
}

// Client forwards requests to peers. It keeps one http.Client whose
// transport pools connections per peer address, and one Connect client per
// address; it is safe for concurrent use.
type Client struct {
	cfg  ClientConfig
	sign connect.Interceptor
	log  *slog.Logger
	http connect.HTTPClient
	tr   *http.Transport
	met  *clientMetrics
	// relay holds the HTTP/2 clients of Relay calls, muxRelay those of
	// Multiplex streams (on connections of their own, pinged sooner).
	relay, muxRelay *relayClients
	// mux holds each peer's Multiplex stream.
	mux *muxPeers
	// bufs pools the buffers multiplexed requests are encoded into.
	bufs sync.Pool // *[]byte

	mu    sync.RWMutex
	peers map[string]forwardv1connect.ForwardServiceClient
}

// NewClient builds a Client.
func NewClient(cfg ClientConfig, logger *slog.Logger, reg prometheus.Registerer) (*Client, error) {
	sign, err := signerFor(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 2 * time.Second
	}
	if cfg.IdleConnTimeout <= 0 {
		cfg.IdleConnTimeout = 90 * time.Second
	}
	if cfg.PingAfter <= 0 {
		cfg.PingAfter = 10 * time.Second
	}
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = 5 * time.Second
	}
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = 16 << 20
	}
	if cfg.MuxPingAfter <= 0 {
		cfg.MuxPingAfter = time.Second
	}
	if cfg.MuxPingTimeout <= 0 {
		cfg.MuxPingTimeout = 3 * time.Second
	}
	if cfg.MaxIdleConnsPerPeer <= 0 {
		cfg.MaxIdleConnsPerPeer = 512
	}
	if cfg.MuxMaxBody == 0 {
		cfg.MuxMaxBody = 64 << 10
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	met, err := newClientMetrics(reg)
	if err != nil {
		return nil, err
	}
	tr := newTransport(cfg)
	c := &Client{
		cfg:   cfg,
		sign:  sign,
		log:   logger.With("component", "forward", "node", cfg.NodeID),
		http:  memBody{tr},
		tr:    tr,
		met:   met,
		relay: newRelayClients(cfg, sign),
		peers: map[string]forwardv1connect.ForwardServiceClient{},
	}
	muxCfg := cfg
	muxCfg.PingAfter, muxCfg.PingTimeout = cfg.MuxPingAfter, cfg.MuxPingTimeout
	c.muxRelay = newRelayClients(muxCfg, sign)
	c.mux = newMuxPeers(c)
	c.bufs.New = func() any { b := make([]byte, 0, 4<<10); return &b }
	return c, nil
}

// newTransport returns the transport for node-to-node calls: pooled
// HTTP/1.1 keep-alive connections, or HTTP/2 over cleartext with cfg.H2C.
func newTransport(cfg ClientConfig) *http.Transport {
	p := new(http.Protocols)
	if cfg.H2C {
		p.SetUnencryptedHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	dial := (&net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}).DialContext
	if cfg.Dial != nil {
		dial = cfg.Dial
	}
	return &http.Transport{
		DialContext:         dial,
		Protocols:           p,
		MaxIdleConnsPerHost: cfg.MaxIdleConnsPerPeer,
		IdleConnTimeout:     cfg.IdleConnTimeout,
		DisableCompression:  true,
		ReadBufferSize:      16 << 10,
		WriteBufferSize:     16 << 10,
		HTTP2: &http.HTTP2Config{
			SendPingTimeout:               cfg.PingAfter,
			PingTimeout:                   cfg.PingTimeout,
			MaxReadFrameSize:              256 << 10,
			MaxReceiveBufferPerConnection: 4<<20 - 1,
			MaxReceiveBufferPerStream:     1 << 20,
		},
	}
}

// memBody is the connect.HTTPClient of node-to-node calls. It sends each
// request straight to the transport (there are no redirects, cookies or
// client timeouts to handle, so http.Client would only add work), and hands
// request bodies up to 1 MiB to it as in-memory readers: Connect passes its
// own buffer type, for which net/http flushes the headers in a write of
// their own before the body; with a known in-memory body both leave in one
// write. A Multiplex stream's request body is read in whole messages
// (wholeEnvelopes) and its response body through a buffer (bufferedBody).
type memBody struct {
	rt http.RoundTripper
}

// Do reads a small body into memory and sends the request. The request is
// Connect's, built for this one call, so its body is replaced in place.
func (m memBody) Do(r *http.Request) (*http.Response, error) {
	if r.URL.Path == forwardv1connect.ForwardServiceMultiplexProcedure {
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &wholeEnvelopes{body: r.Body}
		}
		resp, err := m.rt.RoundTrip(r)
		if err == nil {
			resp.Body = bufferedBody(resp.Body)
		}
		return resp, err
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength <= 0 || r.ContentLength > 1<<20 {
		return m.rt.RoundTrip(r)
	}
	buf := make([]byte, r.ContentLength)
	_, err := io.ReadFull(r.Body, buf)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(buf))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	return m.rt.RoundTrip(r)
}

// Close ends the multiplexed streams and drops idle pooled connections.
func (c *Client) Close() {
	c.mux.close()
	c.tr.CloseIdleConnections()
	c.relay.tr.CloseIdleConnections()
	c.muxRelay.tr.CloseIdleConnections()
}

func (c *Client) peer(addr string) forwardv1connect.ForwardServiceClient {
	c.mu.RLock()
	pc := c.peers[addr]
	c.mu.RUnlock()
	if pc != nil {
		return pc
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if pc = c.peers[addr]; pc == nil {
		pc = forwardv1connect.NewForwardServiceClient(c.http, "http://"+addr, connect.WithReadMaxBytes(c.cfg.MaxResponseBytes),
			connect.WithAcceptCompression("gzip", nil, nil), // no gzip between peers
			connect.WithInterceptors(c.sign))
		c.peers[addr] = pc
	}
	return pc
}

// Forward sends req to the peer at addr (its RPC address) and returns the
// response stream. Connection errors usually surface from Stream.Head;
// cancel ctx to abandon the call.
func (c *Client) Forward(ctx context.Context, addr string, req *Request) (*Stream, error) {
	msg := &forwardv1.ForwardRequest{
		Method:       req.Method,
		Path:         req.Path,
		Headers:      headersToProto(req.Header),
		Body:         req.Body,
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
	if c.cfg.MuxMaxBody > 0 && len(req.Body) <= c.cfg.MuxMaxBody {
		if mc := c.mux.get(addr); mc != nil {
			s, err := mc.forward(ctx, msg, req.Unary)
			if err == nil {
				return s, nil
			}
			if !errors.Is(err, errMuxUnusable) {
				c.met.calls.WithLabelValues(resultOf(err)).Inc()
				return nil, err
			}
			// The stream broke before the call went out: a call of its own.
		}
	}
	creq := connect.NewRequest(msg)
	if req.Unary {
		resp, err := c.peer(addr).ForwardUnary(ctx, creq)
		if err == nil {
			return &Stream{whole: resp.Msg, met: c.met}, nil
		}
		if !tooLarge(err) {
			c.met.calls.WithLabelValues(resultOf(err)).Inc()
			return nil, err
		}
		// The response outgrew the peer's unary limit: nothing reached
		// the client, so ask again for a stream. The peer runs the
		// request twice; only responses over the limit (64 MiB by
		// default) pay that.
		c.met.calls.WithLabelValues("unary_too_large").Inc()
		c.log.Warn("response too large for a unary forward; retrying as a stream", "peer", addr, "request_id", req.RequestID)
	}
	s, err := c.peer(addr).Forward(ctx, creq)
	if err != nil {
		c.met.calls.WithLabelValues(resultOf(err)).Inc()
		return nil, err
	}
	return &Stream{s: s, met: c.met}, nil
}

// Head is the response status and headers.
type Head struct {
	// Status is the HTTP status code.
	Status int
	// Header holds the end-to-end response headers.
	Header http.Header
	// Flush is set when the serving handler flushed right after the head.
	Flush bool
}

// Trailer ends a response.
type Trailer struct {
	// Usage is the token usage the serving handler reported.
	Usage Usage
	// Err is set when the serving handler failed after the head; the body
	// is then incomplete.
	Err string
}

// ErrProtocol reports a response stream that broke the frame order.
var ErrProtocol = errors.New("forward: malformed response stream")

// Stream is one forwarded response. Read the head, then body chunks until
// io.EOF, then the trailer. It is not safe for concurrent use.
type Stream struct {
	s       *connect.ServerStreamForClient[forwardv1.ForwardResponse] // nil for a unary or multiplexed call
	m       *muxCall                                                  // a call on the peer's Multiplex stream
	ctx     context.Context                                           // the multiplexed call's context
	met     *clientMetrics
	head    bool
	whole   *forwardv1.Whole   // a Whole frame whose body is still to be read
	pending *forwardv1.Trailer // trailer of a Whole frame after its body
	trailer Trailer
	ended   bool
	counted bool
}

// Head waits for the response head. Errors here mean no response byte was
// produced: see IsRefused, IsDraining and Retryable.
func (s *Stream) Head() (Head, error) {
	if s.head {
		return Head{}, fmt.Errorf("%w: head read twice", ErrProtocol)
	}
	var h *forwardv1.Head
	if s.s == nil && s.m == nil {
		h = s.whole.GetHead()
	} else {
		msg, err := s.receive()
		if err == nil && msg == nil {
			err = fmt.Errorf("%w: stream ended before the head", ErrProtocol)
		}
		if err != nil {
			s.count(err)
			return Head{}, err
		}
		h = msg.GetHead()
		if wh := msg.GetWhole(); wh != nil {
			h = wh.GetHead()
			s.whole = wh
		}
	}
	if h == nil {
		err := fmt.Errorf("%w: first frame is not a head", ErrProtocol)
		s.count(err)
		return Head{}, err
	}
	s.head = true
	return Head{Status: int(h.GetStatus()), Header: headersFromProto(h.GetHeaders()), Flush: h.GetFlush()}, nil
}

// Next returns the next body chunk, or io.EOF after the trailer (see
// Trailer). flush is set when the serving handler flushed after these bytes
// (data may then be empty): pass the flush on to the client. Any error other
// than io.EOF means the body is incomplete.
func (s *Stream) Next() (data []byte, flush bool, err error) {
	if s.ended {
		return nil, false, io.EOF
	}
	if !s.head {
		return nil, false, fmt.Errorf("%w: body read before the head", ErrProtocol)
	}
	if wh := s.whole; wh != nil {
		s.whole = nil
		if len(wh.GetBody()) > 0 {
			s.pending = wh.GetTrailer()
			return wh.GetBody(), false, nil
		}
		return nil, false, s.end(wh.GetTrailer())
	}
	if t := s.pending; t != nil {
		s.pending = nil
		return nil, false, s.end(t)
	}
	for {
		msg, err := s.receive()
		if err != nil {
			s.count(err)
			return nil, false, err
		}
		if msg == nil {
			break
		}
		switch f := msg.GetFrame().(type) {
		case *forwardv1.ForwardResponse_Chunk:
			if d := f.Chunk.GetData(); len(d) > 0 || f.Chunk.GetFlush() {
				return d, f.Chunk.GetFlush(), nil
			}
		case *forwardv1.ForwardResponse_Trailer:
			return nil, false, s.end(f.Trailer)
		default:
			err := fmt.Errorf("%w: unexpected frame %T", ErrProtocol, f)
			s.count(err)
			return nil, false, err
		}
	}
	err = fmt.Errorf("%w: stream ended without a trailer", ErrProtocol)
	s.count(err)
	return nil, false, err
}

// receive returns the next response frame, nil at a clean end of the
// stream (never on a multiplexed call: its last frame ends it), or the
// call's error.
func (s *Stream) receive() (*forwardv1.ForwardResponse, error) {
	if s.m != nil {
		msg, err := s.m.recv(s.ctx)
		if err != nil {
			return nil, err
		}
		if e := msg.GetError(); e != nil {
			return nil, muxError(e)
		}
		return msg.GetResponse(), nil
	}
	if s.s.Receive() {
		return s.s.Msg(), nil
	}
	return nil, s.s.Err()
}

// end records the trailer and, on a stream, reads Connect's end of
// stream, so the connection is clean and goes back to the pool; nothing
// may follow the trailer. It returns io.EOF on success.
func (s *Stream) end(t *forwardv1.Trailer) error {
	s.ended = true
	if s.m != nil {
		s.m.finish()
	}
	if s.s != nil {
		if s.s.Receive() {
			err := fmt.Errorf("%w: frame after the trailer", ErrProtocol)
			s.count(err)
			return err
		}
		if err := s.s.Err(); err != nil {
			s.count(err)
			return err
		}
	}
	u := t.GetUsage()
	s.trailer = Trailer{Usage: Usage{PromptTokens: u.GetPromptTokens(), CompletionTokens: u.GetCompletionTokens()}, Err: t.GetError()}
	s.count(nil)
	return io.EOF
}

// Trailer returns the trailer once Next has returned io.EOF.
func (s *Stream) Trailer() Trailer { return s.trailer }

// Close releases the stream; call it when done, also after errors. A
// stream closed before its end counts as abandoned in the metrics.
func (s *Stream) Close() error {
	if !s.counted {
		s.counted = true
		s.met.calls.WithLabelValues("abandoned").Inc()
	}
	if s.m != nil {
		s.m.finish()
		return nil
	}
	if s.s == nil {
		return nil
	}
	return s.s.Close()
}

func (s *Stream) count(err error) {
	if s.counted {
		return
	}
	s.counted = true
	if err == nil {
		s.met.ok.Inc()
		return
	}
	s.met.calls.WithLabelValues(resultOf(err)).Inc()
}

type clientMetrics struct {
	calls *prometheus.CounterVec
	ok    prometheus.Counter // calls{result="ok"}, resolved once
	// muxOpens counts Multiplex stream opens by result.
	muxOpens *prometheus.CounterVec
	// muxCalls counts requests sent over a Multiplex stream.
	muxCalls prometheus.Counter
}

func newClientMetrics(reg prometheus.Registerer) (*clientMetrics, error) {
	m := &clientMetrics{calls: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "infermesh", Subsystem: "forward", Name: "client_calls_total",
		Help: "Forward calls made to peers, by result (ok, refused, draining, unavailable, error, abandoned).",
	}, []string{"result"}), muxOpens: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "infermesh", Subsystem: "forward", Name: "client_mux_opens_total",
		Help: "Multiplex streams opened to peers, by result (ok, error, unsupported).",
	}, []string{"result"}), muxCalls: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "infermesh", Subsystem: "forward", Name: "client_mux_calls_total",
		Help: "Forward calls sent over a peer's Multiplex stream (also counted in client_calls_total).",
	})}
	m.ok = m.calls.WithLabelValues("ok")
	if reg != nil {
		for _, c := range []prometheus.Collector{m.calls, m.muxOpens, m.muxCalls} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("forward: metrics: %w", err)
			}
		}
	}
	return m, nil
}

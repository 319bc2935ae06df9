package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	forwardv1 "github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1"
	"github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1/forwardv1connect"
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// NodeID is this node's id, for logs.
	NodeID string
	// ClusterSecret keys the signatures every caller must present
	// (mesh/peerauth). Required unless Verifier is set: a node never
	// serves forwarded work without authentication.
	ClusterSecret string
	// Verifier authenticates callers instead of a peerauth.Verifier built
	// from ClusterSecret (the node shares one, with its metrics and replay
	// cache, between its services).
	Verifier connect.Interceptor
	// ChunkSize is the largest body chunk sent in one message; the writer
	// also sends a chunk whenever the handler flushes. Default 32 KiB.
	ChunkSize int
	// MaxRequestBytes bounds an incoming ForwardRequest. Default 64 MiB.
	MaxRequestBytes int
	// MaxUnaryBytes bounds the body of a ForwardUnary response; a larger
	// one fails the call with RESOURCE_EXHAUSTED before anything is sent.
	// Default 64 MiB.
	MaxUnaryBytes int
}

// Server serves ForwardService: it replays forwarded requests into the
// local-only handler it was built with and streams the responses back.
type Server struct {
	cfg     ServerConfig
	log     *slog.Logger
	local   http.Handler
	met     *serverMetrics
	path    string
	handler http.Handler

	mu       sync.Mutex
	draining bool
	inFlight int
	idle     chan struct{} // made by Wait while work is in flight; closed when inFlight drops to zero
}

// NewServer returns a Server that replays requests into local. local must
// be the node's local-only chain: it serves on this node's engines and never
// authenticates, limits or routes again.
func NewServer(cfg ServerConfig, local http.Handler, logger *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	verify, err := verifierFor(cfg)
	if err != nil {
		return nil, err
	}
	if local == nil {
		return nil, errors.New("forward: a local handler is required")
	}
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = 32 << 10
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = 64 << 20
	}
	if cfg.MaxUnaryBytes <= 0 {
		cfg.MaxUnaryBytes = 64 << 20
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	met, err := newServerMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:   cfg,
		log:   logger.With("component", "forward", "node", cfg.NodeID),
		local: local,
		met:   met,
	}
	path, h := forwardv1connect.NewForwardServiceHandler(&service{s: s},
		connect.WithInterceptors(verify),
		connect.WithReadMaxBytes(cfg.MaxRequestBytes),
		// Peers sit on a LAN; gzip costs far more CPU and latency than it
		// saves there.
		connect.WithCompression("gzip", nil, nil),
	)
	s.path, s.handler = path, gateFlushes(h)
	return s, nil
}

// Handler returns the path prefix and handler to mount on the internal RPC
// mux, e.g. mux.Handle(srv.Handler()). Serve it over h2c (see
// NewHTTPServer); HTTP/1.1 also works.
func (s *Server) Handler() (string, http.Handler) { return s.path, s.handler }

// SetDraining switches refusal of new forwarded work on or off. While
// draining, new calls fail with CodeUnavailable and the refusal header set
// to "draining", so the caller retries elsewhere; calls in flight finish.
func (s *Server) SetDraining(on bool) {
	s.mu.Lock()
	s.draining = on
	s.mu.Unlock()
	s.log.Info("forwarding drain", "draining", on)
}

// Draining reports whether the server refuses new work.
func (s *Server) Draining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}

// InFlight returns the number of forwarded requests being served.
func (s *Server) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight
}

// Wait blocks until no forwarded request is in flight or ctx ends. Call it
// after SetDraining(true) to let forwarded streams finish.
func (s *Server) Wait(ctx context.Context) error {
	for {
		s.mu.Lock()
		n := s.inFlight
		if n > 0 && s.idle == nil {
			s.idle = make(chan struct{})
		}
		idle := s.idle
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	s.inFlight++
	s.met.inFlight.Inc()
	return true
}

func (s *Server) exit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight--
	s.met.inFlight.Dec()
	if s.inFlight == 0 && s.idle != nil {
		close(s.idle)
		s.idle = nil
	}
}

// service implements the generated handler interface, keeping Connect
// types off the Server's API.
type service struct {
	s *Server
}

// Forward serves one ForwardService.Forward call.
func (sv *service) Forward(ctx context.Context, req *connect.Request[forwardv1.ForwardRequest], stream *connect.ServerStream[forwardv1.ForwardResponse]) error {
	return sv.s.replay(ctx, req.Msg, newStreamWriter(stream.Send, flushGateFrom(ctx).flushNow, sv.s.cfg.ChunkSize))
}

// ForwardUnary serves one ForwardService.ForwardUnary call: the same replay
// with the whole response collected into one message.
func (sv *service) ForwardUnary(ctx context.Context, req *connect.Request[forwardv1.ForwardRequest]) (*connect.Response[forwardv1.Whole], error) {
	var whole *forwardv1.Whole
	w := newUnaryWriter(func(m *forwardv1.ForwardResponse) error {
		whole = m.GetWhole()
		return nil
	}, sv.s.cfg.MaxUnaryBytes)
	if err := sv.s.replay(ctx, req.Msg, w); err != nil {
		return nil, err
	}
	if whole == nil {
		return nil, connect.NewError(connect.CodeInternal, errors.New("forward: no response collected"))
	}
	return connect.NewResponse(whole), nil
}

// replay admits one forwarded request and runs it on the local handler,
// writing the response to w.
func (s *Server) replay(ctx context.Context, msg *forwardv1.ForwardRequest, w *streamWriter) error {
	start := time.Now()
	if !s.enter() {
		s.met.calls.WithLabelValues("draining").Inc()
		return drainingError()
	}
	defer s.exit()
	if hops := msg.GetHopCount(); hops > MaxHops {
		s.met.calls.WithLabelValues("hop_limit").Inc()
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("hop count %d exceeds the hop limit %d", hops, MaxHops))
	}
	r, err := buildRequest(ctx, msg)
	if err != nil {
		s.met.calls.WithLabelValues("bad_request").Inc()
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	err = w.serve(s.local, r)
	if err != nil {
		s.met.calls.WithLabelValues("error").Inc()
		s.log.Warn("forwarded request failed", "request_id", msg.GetRequestId(), "origin", msg.GetOriginNodeId(), "err", err)
	} else {
		s.met.ok.Inc()
	}
	s.met.duration.Observe(time.Since(start).Seconds())
	return err
}

// buildRequest turns a ForwardRequest into the *http.Request the local
// handler sees, marked as forwarded through its context.
func buildRequest(ctx context.Context, m *forwardv1.ForwardRequest) (*http.Request, error) {
	method := m.GetMethod()
	if method == "" {
		method = http.MethodGet
	}
	if strings.ContainsAny(method, " \t\r\n/") {
		return nil, fmt.Errorf("bad method %q", method)
	}
	target := m.GetPath()
	if target == "" || target[0] != '/' {
		return nil, fmt.Errorf("bad path %q: want an absolute path", target)
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil, fmt.Errorf("bad path %q: %w", target, err)
	}
	hops := int(m.GetHopCount())
	if hops < 1 {
		hops = 1
	}
	ctx = withInfo(ctx, Info{
		Caller:       callerFromProto(m.GetCaller()),
		RequestID:    m.GetRequestId(),
		OriginNodeID: m.GetOriginNodeId(),
		Model:        m.GetModel(),
		HopCount:     hops,
	})
	body := m.GetBody()
	var rd io.Reader = http.NoBody
	if len(body) > 0 {
		rd = bytes.NewReader(body)
	}
	r, err := http.NewRequestWithContext(ctx, method, "/", rd)
	if err != nil {
		return nil, err
	}
	r.URL = u
	r.RequestURI = target
	r.Header = headersFromProto(m.GetHeaders())
	r.Host = m.GetHost()
	r.RemoteAddr = m.GetCaller().GetClientAddress()
	return r, nil
}

type serverMetrics struct {
	calls    *prometheus.CounterVec
	ok       prometheus.Counter // calls{result="ok"}, resolved once
	inFlight prometheus.Gauge
	duration prometheus.Histogram
	// muxStreams counts open Multiplex streams.
	muxStreams prometheus.Gauge
}

func newServerMetrics(reg prometheus.Registerer) (*serverMetrics, error) {
	m := &serverMetrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "forward", Name: "server_calls_total",
			Help: "Forwarded requests received, by result (ok, error, draining, hop_limit, bad_request; replay and bad_mac for refused multiplex frames).",
		}, []string{"result"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "infermesh", Subsystem: "forward", Name: "server_in_flight",
			Help: "Forwarded requests being served.",
		}),
		muxStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "infermesh", Subsystem: "forward", Name: "server_mux_streams",
			Help: "Multiplex streams open from peers (each carries many forwarded requests).",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "infermesh", Subsystem: "forward", Name: "server_duration_seconds",
			Help:    "Time to serve a forwarded request, trailer included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
		}),
	}
	m.ok = m.calls.WithLabelValues("ok")
	if reg != nil {
		for _, c := range []prometheus.Collector{m.calls, m.inFlight, m.duration, m.muxStreams} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("forward: metrics: %w", err)
			}
		}
	}
	return m, nil
}

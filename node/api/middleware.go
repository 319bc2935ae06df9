package api

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/infermesh/infermesh/node/apierr"
)

// RequestIDPattern defines a well-formed caller X-Request-Id: 1 to 128
// characters of letters, digits, '.', '_', ':' and '-'. Anything else is
// replaced by a generated id.
var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

type ctxKey int

const (
	ctxRequestID ctxKey = iota
	ctxClientAddr
)

// RequestID returns the request id stored by the middleware.
func RequestID(ctx context.Context) string {
	s, _ := ctx.Value(ctxRequestID).(string)
	return s
}

// ClientAddr returns the caller's address (IP) as the middleware saw it.
func ClientAddr(ctx context.Context) string {
	s, _ := ctx.Value(ctxClientAddr).(string)
	return s
}

func newRequestID() string {
	var b [12]byte
	rand.Read(b[:])
	var out [4 + 2*len(b)]byte // one allocation: the string
	copy(out[:], "req_")
	hex.Encode(out[4:], b[:])
	return string(out[:])
}

// timedWriter sets openai-processing-ms when the head is written and records
// the status for metrics and logs.
type timedWriter struct {
	http.ResponseWriter
	start  time.Time
	clock  func() time.Time
	hv     [3]string // values of X-Request-Id, X-Service-Version, Openai-Processing-Ms
	status int
	bytes  int64
}

func (w *timedWriter) WriteHeader(code int) {
	if w.status != 0 {
		return
	}
	w.status = code
	// Canonical keys set directly, values in the writer's own array: no
	// allocation per header (they showed in the entry node's profile).
	w.hv[2] = strconv.FormatInt(w.clock().Sub(w.start).Milliseconds(), 10)
	w.Header()["Openai-Processing-Ms"] = w.hv[2:3:3]
	w.ResponseWriter.WriteHeader(code)
}

func (w *timedWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// Flush passes through so SSE streams are not buffered.
func (w *timedWriter) Flush() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack passes through for WebSocket upgrades.
func (w *timedWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if h, ok := w.ResponseWriter.(http.Hijacker); ok {
		return h.Hijack()
	}
	return nil, nil, errors.New("hijack not supported")
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *timedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// common applies the headers every response carries, recovers panics into a
// 500 and records metrics and an access log line.
func (s *Server) common(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := s.opt.Clock()
		id := r.Header.Get("X-Request-Id")
		if !requestIDPattern.MatchString(id) {
			id = newRequestID()
		}
		tw := &timedWriter{ResponseWriter: w, start: start, clock: s.opt.Clock}
		tw.hv[0], tw.hv[1] = id, s.opt.Version
		h := w.Header()
		h["X-Request-Id"] = tw.hv[0:1:1]
		h["X-Service-Version"] = tw.hv[1:2:2]
		ctx := context.WithValue(r.Context(), ctxRequestID, id)
		ctx = context.WithValue(ctx, ctxClientAddr, s.clientAddr(r))
		s.metrics.inflight.Inc()
		s.metrics.recent.begin()
		defer func() {
			s.metrics.inflight.Dec()
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					// The response broke off on purpose; still count the
					// request as finished, or drain waits for it forever.
					s.metrics.observe(r.Method, routePattern(r), http.StatusBadGateway, s.opt.Clock().Sub(start))
					panic(p)
				}
				s.log.Error("handler panic", "request_id", id, "panic", p, "stack", string(debug.Stack()))
				if tw.status == 0 {
					apierr.Write(tw, apierr.New(http.StatusInternalServerError, apierr.TypeServer, apierr.CodeInternal, "", "The server had an error while processing your request."))
				}
			}
			route := routePattern(r)
			status := tw.status
			if status == 0 {
				status = http.StatusOK
			}
			elapsed := s.opt.Clock().Sub(start)
			s.metrics.observe(r.Method, route, status, elapsed)
			if s.log.Enabled(r.Context(), slog.LevelDebug) { // the arguments cost allocations
				s.log.Debug("request", "request_id", id, "method", r.Method, "path", r.URL.Path, "status", status, "ms", elapsed.Milliseconds())
			}
		}()
		next.ServeHTTP(tw, r.WithContext(ctx))
	})
}

// clientAddr is the peer IP or, on a node that trusts a proxy
// (SERVICE_TRUST_PROXY), the client address its trusted proxies recorded
// (see forwardedClient).
func (s *Server) clientAddr(r *http.Request) string {
	if !s.opt.TrustProxy {
		return forwardedClient(r, nil)
	}
	return forwardedClient(r, s.opt.TrustedProxies)
}

// cors answers preflights for allowed origins without a key and adds the
// allow-origin header to their actual requests.
func (s *Server) cors(next http.Handler) http.Handler {
	if len(s.opt.CORSOrigins) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin == "" || !(slices.Contains(s.opt.CORSOrigins, origin) || slices.Contains(s.opt.CORSOrigins, "*")) {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", origin)
		h.Add("Vary", "Origin")
		h.Set("Access-Control-Expose-Headers", "X-Request-Id, X-Service-Version, X-Service-Backend, openai-processing-ms, Retry-After")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
			h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, api-key, x-api-key, X-Request-Id, X-Service-Priority, OpenAI-Organization, OpenAI-Project, OpenAI-Beta, X-Stainless-Lang, X-Stainless-Package-Version, X-Stainless-OS, X-Stainless-Arch, X-Stainless-Runtime, X-Stainless-Runtime-Version, X-Stainless-Retry-Count, X-Stainless-Timeout")
			h.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refuseWhileDraining answers new work (POST) with 503 server_draining
// once the node drains; reads keep working and requests already running
// finish. Model routes that a dispatcher routes are let through: their
// requests go to peers that hold the model (the draining node no longer
// ranks itself), and routed refuses them with the same 503 when every
// holder of the model is draining. Other new work (batch jobs, pulls,
// admin writes) would end with this node, so it is refused here.
func (s *Server) refuseWhileDraining(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && s.opt.Backend.Draining() && !s.routedModelRoute(r) {
			apierr.Write(w, drainingError())
			return
		}
		next.ServeHTTP(w, r)
	})
}

// routedModelRoute reports whether r is for a model route the dispatcher
// routes: one the local router serves (see modelRoutes), pulls aside.
func (s *Server) routedModelRoute(r *http.Request) bool {
	return s.opt.Dispatcher != nil && r.URL.Path != "/v1/models/pull" && s.local != nil &&
		s.local.Match(chi.NewRouteContext(), r.Method, r.URL.Path)
}

// drainingError is the 503 for work no live node can take because its
// node (or every holder of its model) is draining.
func drainingError() *apierr.Error {
	e := apierr.New(http.StatusServiceUnavailable, apierr.TypeServer, apierr.CodeDraining, "", "This node is draining and no other node can take the request; retry shortly.")
	e.RetryAfter = 1
	return e
}

// recoverOnly turns a handler panic into a 500 on the local router.
func (s *Server) recoverOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.log.Error("local handler panic", "panic", p, "stack", string(debug.Stack()))
				apierr.Write(w, apierr.New(http.StatusInternalServerError, apierr.TypeServer, apierr.CodeInternal, "", "The server had an error while processing your request."))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// authenticate resolves the caller before any route runs (CORS preflights
// were answered before it).
func (s *Server) authenticate(next http.Handler) http.Handler {
	if s.opt.Admission == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, e := s.opt.Admission.Authenticate(r)
		if e != nil {
			apierr.Write(w, e)
			return
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// admit counts a request toward the caller's limits; nil done means no
// accounting is configured.
func (s *Server) admit(r *http.Request, model string, body []byte) (func(Served), *apierr.Error) {
	if s.opt.Admission == nil {
		return nil, nil
	}
	return s.opt.Admission.Admit(r, model, body)
}

// statusWriter remembers the status a handler sent, for usage records.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(c int) {
	if w.status == 0 {
		w.status = c
	}
	w.ResponseWriter.WriteHeader(c)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush passes through for streams.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) code() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

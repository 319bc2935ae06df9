package api

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/node/apierr"
)

// SessionLimits bound live sessions (the live transcription WebSocket).
// Sessions are a resource of their own, apart from requests in flight: a
// session holds no in-flight or busy-gate slot, so idle sessions can never
// starve requests, and these caps keep one caller from holding them all.
type SessionLimits struct {
	// PerNode is how many sessions this node serves at once (0:
	// DefaultSessionsPerNode).
	PerNode int
	// PerKey is how many sessions one API key may have open through this
	// node at once (0: DefaultSessionsPerKey).
	PerKey int
	// PerClient is how many sessions one client address may have open
	// through this node at once (0: DefaultSessionsPerClient).
	PerClient int
	// Idle is the longest a session may wait for the client's next whole
	// message; a silent client, or one trickling a frame, is closed then
	// (0: DefaultSessionIdle).
	Idle time.Duration
	// MaxDuration is the longest a session may last (0: LiveMaxDuration).
	MaxDuration time.Duration
}

// Defaults of SessionLimits.
const (
	DefaultSessionsPerNode   = 64
	DefaultSessionsPerKey    = 8
	DefaultSessionsPerClient = 16
	DefaultSessionIdle       = 30 * time.Second
)

func (l SessionLimits) withDefaults() SessionLimits {
	if l.PerNode <= 0 {
		l.PerNode = DefaultSessionsPerNode
	}
	if l.PerKey <= 0 {
		l.PerKey = DefaultSessionsPerKey
	}
	if l.PerClient <= 0 {
		l.PerClient = DefaultSessionsPerClient
	}
	if l.Idle <= 0 {
		l.Idle = DefaultSessionIdle
	}
	if l.MaxDuration <= 0 {
		l.MaxDuration = LiveMaxDuration
	}
	return l
}

// sessionTable counts open sessions: those that entered the mesh through
// this node by key and client address, and those this node serves.
type sessionTable struct {
	lim     SessionLimits
	mu      sync.Mutex
	byKey   map[string]int
	byAddr  map[string]int
	served  int
	gauge   *prometheus.GaugeVec   // open sessions by side (entered, served)
	refused *prometheus.CounterVec // refusals by limit (node, key, client)
}

func newSessionTable(lim SessionLimits, reg *prometheus.Registry) *sessionTable {
	t := &sessionTable{lim: lim.withDefaults(), byKey: map[string]int{}, byAddr: map[string]int{},
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "infermesh_live_sessions",
			Help: "Open live sessions: side=entered, opened through this node (per-key and per-client caps); side=served, served by this node (per-node cap).",
		}, []string{"side"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_live_sessions_refused_total",
			Help: "Live sessions refused 429 session_limit_exceeded, by the limit reached (node, key, client).",
		}, []string{"limit"}),
	}
	if reg != nil {
		reg.MustRegister(t.gauge, t.refused)
	}
	return t
}

// sessionLimitError is the 429 for a session over limit.
func sessionLimitError(limit string, n int) *apierr.Error {
	e := apierr.New(http.StatusTooManyRequests, apierr.TypeRateLimit, apierr.CodeSessionLimit, "",
		fmt.Sprintf("Too many live sessions: %s has %d open, the most allowed; close one or retry later.", limit, n))
	e.RetryAfter = 5
	return e
}

// enter counts a session opening through this node for an API key (""
// for keyless callers) and a client address, or refuses it.
func (t *sessionTable) enter(key, addr string) (func(), *apierr.Error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if key != "" && t.byKey[key] >= t.lim.PerKey {
		t.refused.WithLabelValues("key").Inc()
		return nil, sessionLimitError("this API key", t.lim.PerKey)
	}
	if addr != "" && t.byAddr[addr] >= t.lim.PerClient {
		t.refused.WithLabelValues("client").Inc()
		return nil, sessionLimitError("this client address", t.lim.PerClient)
	}
	if key != "" {
		t.byKey[key]++
	}
	if addr != "" {
		t.byAddr[addr]++
	}
	t.gauge.WithLabelValues("entered").Inc()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			if key != "" {
				if t.byKey[key]--; t.byKey[key] <= 0 {
					delete(t.byKey, key)
				}
			}
			if addr != "" {
				if t.byAddr[addr]--; t.byAddr[addr] <= 0 {
					delete(t.byAddr, addr)
				}
			}
			t.gauge.WithLabelValues("entered").Dec()
		})
	}, nil
}

// serve counts a session this node serves, or refuses it at the node's
// cap (a peer relaying it then tries the next holder).
func (t *sessionTable) serve() (func(), *apierr.Error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.served >= t.lim.PerNode {
		t.refused.WithLabelValues("node").Inc()
		e := sessionLimitError("this node", t.lim.PerNode)
		e.Status, e.Type = http.StatusServiceUnavailable, apierr.TypeServer
		return nil, e
	}
	t.served++
	t.gauge.WithLabelValues("served").Inc()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			t.served--
			t.mu.Unlock()
			t.gauge.WithLabelValues("served").Dec()
		})
	}, nil
}

// open reports the sessions this node serves now, for the dashboard.
func (t *sessionTable) open() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.served
}

// liveEntry wraps the live route on the public router: it answers a
// WebSocket version other than 13 with 426 and counts the session against
// its caller's key and address caps until the session (served here or
// relayed to a peer) ends.
func (s *Server) liveEntry(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("Sec-WebSocket-Version"); strings.EqualFold(r.Header.Get("Upgrade"), "websocket") && v != "13" {
			w.Header().Set("Sec-WebSocket-Version", "13")
			apierr.Write(w, apierr.New(http.StatusUpgradeRequired, apierr.TypeInvalidRequest, apierr.CodeInvalidValue, "",
				fmt.Sprintf("Unsupported WebSocket version %q: this server speaks version 13 (RFC 6455).", v)))
			return
		}
		key := ""
		if s.opt.Admission != nil {
			key = s.opt.Admission.CallerKeyID(r.Context())
		}
		done, e := s.sessions.enter(key, ClientAddr(r.Context()))
		if e != nil {
			apierr.Write(w, e)
			return
		}
		defer done()
		next(w, r)
	}
}

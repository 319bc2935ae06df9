package api

import (
	"errors"
	"net/http"
	"runtime"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	inflight prometheus.Gauge
	recent   *recentStats
	// bodyRefused counts request bodies refused because the node's body
	// budget, or the caller's share of it, was spent.
	bodyRefused prometheus.Counter
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_http_requests_total",
			Help: "HTTP requests by method, route pattern and status.",
		}, []string{"method", "route", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "infermesh_http_request_duration_seconds",
			Help:    "HTTP request latency by route pattern.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"route"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "infermesh_http_inflight_requests",
			Help: "HTTP requests being served now.",
		}),
	}
	m.bodyRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "infermesh_http_body_budget_refusals_total",
		Help: "Request bodies refused while arriving because the node-wide request body budget (503) or the caller's share of it (429) was spent.",
	})
	m.recent = newRecentStats()
	if reg != nil {
		reg.MustRegister(m.requests, m.latency, m.inflight, m.bodyRefused)
	}
	return m
}

// livez answers 200 {"status":"live"} whenever the process serves HTTP,
// draining or not ready included: a liveness probe that fails only when
// the process is stuck or gone, so an orchestrator never restarts a node
// that is merely waiting for its cluster.
func (s *Server) livez(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "live"})
}

// registerBuildInfo puts infermesh_build_info{version,goversion} = 1 on
// the API's registry; routes calls it once when the server is built.
func (s *Server) registerBuildInfo() {
	if s.opt.Registry == nil {
		return
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "infermesh_build_info",
		Help:        "Always 1; the labels name the running build.",
		ConstLabels: prometheus.Labels{"version": s.opt.Version, "goversion": runtime.Version()},
	})
	g.Set(1)
	if err := s.opt.Registry.Register(g); err != nil {
		var already prometheus.AlreadyRegisteredError
		if !errors.As(err, &already) {
			s.log.Warn("register build info", "err", err)
		}
	}
}

func (m *metrics) observe(method, route string, status int, d time.Duration) {
	m.requests.WithLabelValues(method, route, strconv.Itoa(status)).Inc()
	m.latency.WithLabelValues(route).Observe(d.Seconds())
	m.recent.add(route, status, d)
}

// routePattern returns chi's matched pattern, never the raw path, so metric
// label cardinality stays bounded.
func routePattern(r *http.Request) string {
	if rc := chi.RouteContext(r.Context()); rc != nil {
		if p := rc.RoutePattern(); p != "" {
			return p
		}
	}
	return "unmatched"
}

package api

import (
	"errors"
	"net/http"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	inflight prometheus.Gauge
	recent   *recentStats
	// bodyRefused counts requests refused because the body budget was
	// spent.
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
		Help: "Requests answered 503 because the node-wide request body budget was spent.",
	})
	m.recent = &recentStats{routes: map[string]*ring{}}
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
	m.recent.add(route, d)
}

// recentStats keeps the last samples per route for the dashboard's
// percentiles; Prometheus histograms serve scrapers.
type recentStats struct {
	mu     sync.Mutex
	total  int64
	active int64
	routes map[string]*ring
}

type ring struct {
	count   int64
	samples [512]float64
	n       int
}

// LatencyRow is one route's line on the dashboard.
type LatencyRow struct {
	// Route is chi's route pattern, or "unmatched".
	Route string `json:"route"`
	// Count is how many requests the route has served since start.
	Count int64 `json:"count"`
	// P50 is the median latency in milliseconds over the route's last 512
	// requests.
	P50 float64 `json:"p50_ms"`
	// P99 is the 99th-percentile latency in milliseconds over the route's
	// last 512 requests.
	P99 float64 `json:"p99_ms"`
}

func (r *recentStats) begin() { r.mu.Lock(); r.active++; r.mu.Unlock() }

func (r *recentStats) add(route string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.active--
	r.total++
	g := r.routes[route]
	if g == nil {
		if len(r.routes) >= 256 {
			return
		}
		g = &ring{}
		r.routes[route] = g
	}
	g.samples[g.count%int64(len(g.samples))] = float64(d.Microseconds()) / 1000
	g.count++
	if g.n < len(g.samples) {
		g.n++
	}
}

func (r *recentStats) inflight() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.active
}

func (r *recentStats) snapshot() (int64, []LatencyRow) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rows := make([]LatencyRow, 0, len(r.routes))
	for route, g := range r.routes {
		s := append([]float64(nil), g.samples[:g.n]...)
		sort.Float64s(s)
		rows = append(rows, LatencyRow{Route: route, Count: g.count, P50: quantile(s, 0.5), P99: quantile(s, 0.99)})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Count > rows[j].Count })
	return r.total, rows
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
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

package api

import (
	"bytes"
	_ "embed"
	"math"
	"net/http"
	"sort"
	"sync"
	"time"
)

//go:embed dashboard.html
var dashboardHTML []byte

// keyRequiredMark is the placeholder in dashboard.html the page handler
// replaces with "true" or "false": whether the data route will ask this
// browser for a key, so the page asks for one before its first fetch
// instead of collecting a 401.
var keyRequiredMark = []byte("{{KEY_REQUIRED}}")

// dashboardCSP allows only what the page itself carries: inline script and
// style, fetches to this node, and a data: favicon (so the browser does
// not ask for /favicon.ico). Nothing is loaded from anywhere else.
const dashboardCSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// DashboardSource (Options.MeshView) is what can describe the mesh
// for the dashboard: every worker as this node's peer table sees it, the
// raft configuration and the replicated usage ledger. Without it the
// dashboard shows this node alone.
type DashboardSource interface {
	// Dashboard describes the mesh now.
	Dashboard() MeshView
	// DashboardKeyRequired reports whether a request like r (same
	// connection and client address) needs an API key for the dashboard's
	// data, i.e. the loopback rule does not make it the local operator.
	DashboardKeyRequired(r *http.Request) bool
}

// MeshView is the mesh part of the dashboard's data.
type MeshView struct {
	// Workers are the mesh's nodes, this one included, sorted by id.
	Workers []WorkerView `json:"workers"`
	// Raft is the raft group as this node knows it.
	Raft RaftView `json:"raft"`
	// Usage is the replicated usage ledger summed per serving worker:
	// counted model requests and failed ones, mesh-wide.
	Usage []WorkerUsage `json:"usage_by_worker"`
}

// WorkerView is one node of the mesh on the dashboard.
type WorkerView struct {
	// ID is the node id.
	ID string `json:"id"`
	// HTTPAddr is the node's advertised client address.
	HTTPAddr string `json:"http_addr"`
	// Version is the node's software version.
	Version string `json:"version"`
	// State is ready, saturated, draining, alive, unknown, ejected or
	// not_ready (this node only: its replica is catching up).
	State string `json:"state"`
	// Reason explains State in words for the operator.
	Reason string `json:"reason"`
	// Self marks the node that answered.
	Self bool `json:"self"`
	// Canary marks a canary node; CanaryPercent is its share of callers.
	Canary bool `json:"canary"`
	// CanaryPercent is the share of callers (0-100) a canary receives.
	CanaryPercent int `json:"canary_percent"`
	// InFlight is the number of requests the node reports serving.
	InFlight int `json:"inflight"`
	// Cap is the node's in-flight cap; 0 means none.
	Cap int `json:"cap"`
	// Outbound is how many requests this node has in flight to the worker.
	Outbound int `json:"outbound"`
	// QueueDepth is the number of requests waiting in the node's engines.
	QueueDepth int `json:"queue_depth"`
	// Weight is the node's weight for the weighted strategy.
	Weight int `json:"weight"`
	// Policy is the routing policy's entry for the node; nil when it has
	// none (Canary, CanaryPercent, Cap and Weight above are the node's own).
	Policy *Routing `json:"policy"`
	// Effective is how routing treats the node now.
	Effective Routing `json:"effective"`
	// LastSeenSeconds is the age of the node's last gossip record.
	LastSeenSeconds float64 `json:"last_seen_seconds"`
	// Models are the node's installed models, sorted by id.
	Models []WorkerModel `json:"models"`
}

// WorkerModel is one model installed on a worker.
type WorkerModel struct {
	// ID is the canonical model id.
	ID string `json:"id"`
	// WireID is the model's alternative id.
	WireID string `json:"wire_id"`
	// Task is what the model does.
	Task string `json:"task"`
	// Warm reports whether the model is loaded on the worker.
	Warm bool `json:"warm"`
	// LatencyMS is the worker's moving average time to serve a request
	// for the model, in milliseconds; 0 before the first request.
	LatencyMS float64 `json:"latency_ms"`
	// SizeBytes is the size of the model's files on the worker.
	SizeBytes int64 `json:"size_bytes"`
}

// RaftView is the raft group on the dashboard.
type RaftView struct {
	// Leader is the leader this node follows; "" when it knows none.
	Leader string `json:"leader"`
	// IsLeader reports whether this node leads.
	IsLeader bool `json:"is_leader"`
	// AppliedIndex is the last log entry this node's replica applied.
	AppliedIndex uint64 `json:"applied_index"`
	// Servers is the raft configuration, sorted by id.
	Servers []RaftPeer `json:"servers"`
	// Error says why the configuration could not be read; "" when it was.
	Error string `json:"error,omitempty"`
}

// WorkerUsage is one worker's line of the replicated usage ledger.
type WorkerUsage struct {
	// Worker is the node that served the requests.
	Worker string `json:"worker"`
	// Requests counts the model requests it served.
	Requests int64 `json:"requests"`
	// Errors counts those that failed.
	Errors int64 `json:"errors"`
}

// dashboard serves the anonymous live page; its data comes from
// /dashboard/data.
func (s *Server) dashboard(w http.ResponseWriter, r *http.Request) {
	need := s.opt.Admission != nil
	if d := s.opt.MeshView; d != nil && need {
		need = d.DashboardKeyRequired(r)
	}
	mark := []byte("false")
	if need {
		mark = []byte("true")
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", dashboardCSP)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(http.StatusOK)
	w.Write(bytes.Replace(dashboardHTML, keyRequiredMark, mark, 1))
}

// dashboardData is the aggregate JSON behind the page: this node's state,
// request rates, error rates and latency percentiles from its own request
// records, and the mesh (workers, raft, usage ledger) when
// Options.MeshView is set.
func (s *Server) dashboardData(w http.ResponseWriter, r *http.Request) {
	now := s.opt.Clock()
	ns := s.opt.Backend.Status()
	st := map[string]any{"node_id": ns.NodeID, "state": ns.State, "version": ns.Version, "engine": ns.Engine,
		"uptime_seconds": ns.UptimeSeconds, "models": ns.Models, "peers": ns.Peers}
	switch {
	case s.opt.Backend.Draining():
		st["state"], st["reason"] = "draining", "the node is shutting down: it finishes in-flight work and takes no new requests"
	default:
		if reason := s.opt.Backend.NotReady(); reason != "" {
			st["state"], st["reason"] = "not_ready", reason
		} else {
			st["state"], st["reason"] = "ready", "serving requests"
		}
	}
	st["governance"] = "ok"
	if why := s.opt.Backend.WritesBlocked(); why != "" {
		st["governance"], st["governance_reason"] = "no_quorum", why
	}
	var mesh MeshView
	if d := s.opt.MeshView; d != nil {
		mesh = d.Dashboard()
		st["workers"], st["raft"], st["usage_by_worker"] = mesh.Workers, mesh.Raft, mesh.Usage
	}
	snap := s.metrics.recent.snapshot(now, mesh.Usage)
	st["inflight"] = s.metrics.recent.inflight()
	st["live_sessions"], st["live_sessions_cap"] = s.sessions.open(), s.sessions.lim.PerNode
	st["requests_total"] = snap.Requests
	st["errors_total"] = snap.Errors
	st["client_errors_total"] = snap.ClientErrors
	st["latency"] = snap.Routes
	st["latency_all"] = snap.All
	st["series"] = snap.Series
	st["mesh_series"] = snap.Mesh
	st["generated_at_ms"] = now.UnixMilli()
	writeJSON(w, http.StatusOK, st)
}

// isDashboardRoute reports whether a route is the dashboard's own: its
// polls are left out of the request rates and top endpoints, or an open
// page would show mostly itself.
func isDashboardRoute(route string) bool {
	return route == "/dashboard" || route == "/dashboard/data"
}

// Sizes of the dashboard's request records.
const (
	// ringSize is how many recent latencies a route keeps for its
	// percentiles.
	ringSize = 512
	// allRingSize is how many recent latencies (all routes) the node-wide
	// percentiles use.
	allRingSize = 2048
	// bucketSeconds is the width of one point of the rate series.
	bucketSeconds = 5
	// bucketCount is how many points the rate series keeps (10 minutes).
	bucketCount = 120
	// meshSampleEvery is the least time between two samples of the
	// usage ledger.
	meshSampleEvery = 2 * time.Second
	// meshSampleCount bounds the mesh series (10 minutes at 2 s).
	meshSampleCount = 300
	// meshGap is the longest pause between samples the mesh series
	// bridges; after a longer one (nobody watched) it starts afresh, so no
	// point averages over the gap.
	meshGap = 30 * time.Second
	// maxRoutes bounds the routes tracked (route patterns are bounded
	// anyway; this is a guard).
	maxRoutes = 256
)

// recentStats keeps what the dashboard shows of this node's own traffic:
// the last latencies per route for exact percentiles, request and error
// counts per 5-second bucket for the rate charts, and samples of the
// mesh's usage ledger for the mesh chart. Prometheus histograms serve
// scrapers; these serve the page.
type recentStats struct {
	mu      sync.Mutex
	started time.Time
	active  int64
	total   int64
	errors  int64 // 5xx answers
	client  int64 // 4xx answers
	routes  map[string]*routeStats
	all     ring
	buckets [bucketCount]bucket
	mesh    []meshSample
}

// ring holds the last latencies of a route, in milliseconds.
type ring struct {
	count   int64
	samples []float64
	n       int
}

func (g *ring) add(v float64) {
	g.samples[g.count%int64(len(g.samples))] = v
	g.count++
	if g.n < len(g.samples) {
		g.n++
	}
}

// percentiles returns the nearest-rank p50, p95 and p99 of the ring's
// samples (0 when there are none).
func (g *ring) percentiles() (p50, p95, p99 float64) {
	s := append([]float64(nil), g.samples[:g.n]...)
	sort.Float64s(s)
	return quantile(s, 0.50), quantile(s, 0.95), quantile(s, 0.99)
}

type routeStats struct {
	ring
	errors, client int64
}

type bucket struct {
	epoch                    int64 // unix seconds / bucketSeconds
	requests, errors, client int64
}

type meshSample struct {
	at      time.Time
	workers map[string]WorkerUsage
}

func newRecentStats() *recentStats {
	return &recentStats{started: time.Now(), routes: map[string]*routeStats{}, all: ring{samples: make([]float64, allRingSize)}}
}

func (r *recentStats) begin() { r.mu.Lock(); r.active++; r.mu.Unlock() }

// add records a finished request: its route pattern, status and time.
func (r *recentStats) add(route string, status int, d time.Duration) {
	r.addAt(time.Now(), route, status, d)
}

func (r *recentStats) addAt(now time.Time, route string, status int, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.active--
	if isDashboardRoute(route) {
		return
	}
	isErr, isClient := status >= 500, status >= 400 && status < 500
	r.total++
	if isErr {
		r.errors++
	}
	if isClient {
		r.client++
	}
	e := now.Unix() / bucketSeconds
	b := &r.buckets[e%bucketCount]
	if b.epoch != e {
		*b = bucket{epoch: e}
	}
	b.requests++
	if isErr {
		b.errors++
	}
	if isClient {
		b.client++
	}
	ms := float64(d.Microseconds()) / 1000
	r.all.add(ms)
	g := r.routes[route]
	if g == nil {
		if len(r.routes) >= maxRoutes {
			return
		}
		g = &routeStats{ring: ring{samples: make([]float64, ringSize)}}
		r.routes[route] = g
	}
	g.add(ms)
	if isErr {
		g.errors++
	}
	if isClient {
		g.client++
	}
}

func (r *recentStats) inflight() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.active
}

// LatencyRow is one route's line on the dashboard: its traffic and its
// latency percentiles over its last 512 requests.
type LatencyRow struct {
	// Route is chi's route pattern, or "unmatched".
	Route string `json:"route"`
	// Count is how many requests the route has served since start.
	Count int64 `json:"count"`
	// Errors counts its 5xx answers; ClientErrors its 4xx answers.
	Errors int64 `json:"errors"`
	// ClientErrors counts its 4xx answers.
	ClientErrors int64 `json:"client_errors"`
	// Samples is how many latencies the percentiles are computed from.
	Samples int `json:"samples"`
	// P50 is the median latency in milliseconds (nearest rank).
	P50 float64 `json:"p50_ms"`
	// P95 is the 95th-percentile latency in milliseconds (nearest rank).
	P95 float64 `json:"p95_ms"`
	// P99 is the 99th-percentile latency in milliseconds (nearest rank).
	P99 float64 `json:"p99_ms"`
}

// RateSeries is a chart's data: points bucketSeconds apart, oldest first.
type RateSeries struct {
	// BucketSeconds is the width of one point.
	BucketSeconds int `json:"bucket_seconds"`
	// T is each point's start, in Unix milliseconds.
	T []int64 `json:"t"`
	// Requests is requests per second in each point.
	Requests []float64 `json:"requests_per_s"`
	// Errors is 5xx answers per second.
	Errors []float64 `json:"errors_per_s"`
	// ClientErrors is 4xx answers per second.
	ClientErrors []float64 `json:"client_errors_per_s"`
}

// MeshSeries is the mesh chart's data: rates per worker between samples
// of the replicated usage ledger, oldest first.
type MeshSeries struct {
	// T is each point's time, in Unix milliseconds.
	T []int64 `json:"t"`
	// Workers maps a worker id to its rates.
	Workers map[string]WorkerRates `json:"workers"`
}

// WorkerRates are one worker's rates in a MeshSeries.
type WorkerRates struct {
	// Requests is model requests per second.
	Requests []float64 `json:"requests_per_s"`
	// Errors is failed model requests per second.
	Errors []float64 `json:"errors_per_s"`
}

// statsSnapshot is what dashboardData reads from recentStats.
type statsSnapshot struct {
	Requests, Errors, ClientErrors int64
	Routes                         []LatencyRow
	All                            LatencyRow
	Series                         RateSeries
	Mesh                           MeshSeries
}

// snapshot reads the records at now, first adding usage (the ledger per
// worker) as a mesh sample when the last one is old enough.
func (r *recentStats) snapshot(now time.Time, usage []WorkerUsage) statsSnapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := statsSnapshot{Requests: r.total, Errors: r.errors, ClientErrors: r.client}
	out.Routes = make([]LatencyRow, 0, len(r.routes))
	for route, g := range r.routes {
		row := LatencyRow{Route: route, Count: g.count, Errors: g.errors, ClientErrors: g.client, Samples: g.n}
		row.P50, row.P95, row.P99 = g.percentiles()
		out.Routes = append(out.Routes, row)
	}
	sort.Slice(out.Routes, func(i, j int) bool {
		a, b := out.Routes[i], out.Routes[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		return a.Route < b.Route
	})
	out.All = LatencyRow{Route: "all", Count: r.total, Errors: r.errors, ClientErrors: r.client, Samples: r.all.n}
	out.All.P50, out.All.P95, out.All.P99 = r.all.percentiles()
	out.Series = r.series(now)
	if usage != nil {
		r.sampleMesh(now, usage)
	}
	out.Mesh = r.meshSeries()
	return out
}

// series is the rate chart: every completed bucket of the last 10
// minutes since the records started.
func (r *recentStats) series(now time.Time) RateSeries {
	s := RateSeries{BucketSeconds: bucketSeconds}
	cur := now.Unix() / bucketSeconds
	first := max(cur-bucketCount+1, r.started.Unix()/bucketSeconds)
	for e := first; e < cur; e++ {
		b := r.buckets[e%bucketCount]
		if b.epoch != e {
			b = bucket{}
		}
		s.T = append(s.T, e*bucketSeconds*1000)
		s.Requests = append(s.Requests, float64(b.requests)/bucketSeconds)
		s.Errors = append(s.Errors, float64(b.errors)/bucketSeconds)
		s.ClientErrors = append(s.ClientErrors, float64(b.client)/bucketSeconds)
	}
	return s
}

func (r *recentStats) sampleMesh(now time.Time, usage []WorkerUsage) {
	if n := len(r.mesh); n > 0 {
		last := r.mesh[n-1].at
		if now.Sub(last) < meshSampleEvery {
			return
		}
		if now.Sub(last) > meshGap {
			r.mesh = r.mesh[:0]
		}
	}
	m := make(map[string]WorkerUsage, len(usage))
	for _, u := range usage {
		m[u.Worker] = u
	}
	if len(r.mesh) == meshSampleCount {
		r.mesh = append(r.mesh[:0], r.mesh[1:]...)
	}
	r.mesh = append(r.mesh, meshSample{at: now, workers: m})
}

// meshSeries turns consecutive ledger samples into per-worker rates. A
// counter that went down (a restored snapshot) counts as no traffic.
func (r *recentStats) meshSeries() MeshSeries {
	s := MeshSeries{Workers: map[string]WorkerRates{}}
	if len(r.mesh) < 2 {
		return s
	}
	names := map[string]bool{}
	for _, m := range r.mesh {
		for w := range m.workers {
			names[w] = true
		}
	}
	for i := 1; i < len(r.mesh); i++ {
		a, b := r.mesh[i-1], r.mesh[i]
		s.T = append(s.T, b.at.UnixMilli())
		dt := b.at.Sub(a.at).Seconds()
		for w := range names {
			wr := s.Workers[w]
			wr.Requests = append(wr.Requests, math.Max(0, float64(b.workers[w].Requests-a.workers[w].Requests)/dt))
			wr.Errors = append(wr.Errors, math.Max(0, float64(b.workers[w].Errors-a.workers[w].Errors)/dt))
			s.Workers[w] = wr
		}
	}
	return s
}

// quantile is the nearest-rank q-quantile of sorted samples: the smallest
// sample with at least q of the samples at or below it. For few samples
// the high percentiles are the largest sample (the p99 of 10 requests is
// the slowest of them), never an interpolated or lower one.
func quantile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	// The tolerance keeps an exact rank (0.95 of 100) from rounding up.
	i := int(math.Ceil(q*float64(n)-1e-9)) - 1
	return sorted[min(max(i, 0), n-1)]
}

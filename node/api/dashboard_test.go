package api

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestDashboardQuantileNearestRank(t *testing.T) {
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 100}
	cases := []struct {
		s    []float64
		q    float64
		want float64
	}{
		{nil, 0.99, 0},
		{[]float64{7}, 0.5, 7},
		{[]float64{7}, 0.99, 7},
		{[]float64{1, 2}, 0.5, 1},
		{[]float64{1, 2}, 0.99, 2},
		// The p99 of ten requests is the slowest one (the old code gave 9).
		{ten, 0.99, 100},
		{ten, 0.95, 100},
		{ten, 0.5, 5},
		{ten, 0.9, 9},
	}
	for _, c := range cases {
		if got := quantile(c.s, c.q); got != c.want {
			t.Errorf("quantile(%v, %v) = %v, want %v", c.s, c.q, got, c.want)
		}
	}
	// Exact ranks do not round up: 1..100 has p95 = 95, p99 = 99, p50 = 50.
	var hundred []float64
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, float64(i))
	}
	for q, want := range map[float64]float64{0.5: 50, 0.95: 95, 0.99: 99, 1: 100} {
		if got := quantile(hundred, q); got != want {
			t.Errorf("quantile(1..100, %v) = %v, want %v", q, got, want)
		}
	}
}

func TestDashboardStatsSeriesAndRoutes(t *testing.T) {
	r := newRecentStats()
	t0 := time.Unix(1_000_000_000, 0) // a bucket boundary (divisible by 5)
	r.started = t0
	add := func(at time.Time, route string, status int, ms int) {
		r.begin()
		r.addAt(at, route, status, time.Duration(ms)*time.Millisecond)
	}
	for i := 0; i < 10; i++ {
		add(t0.Add(time.Second), "/v1/embeddings", 200, 10*(i+1))
	}
	add(t0.Add(6*time.Second), "/v1/embeddings", 503, 1)
	add(t0.Add(6*time.Second), "/v1/models/{id}", 404, 2)
	add(t0.Add(7*time.Second), "/dashboard/data", 200, 1) // the page's own poll is left out
	r.begin()                                             // one request still running
	s := r.snapshot(t0.Add(16*time.Second), nil)
	if s.Requests != 12 || s.Errors != 1 || s.ClientErrors != 1 {
		t.Fatalf("totals %d/%d/%d, want 12/1/1", s.Requests, s.Errors, s.ClientErrors)
	}
	if got := r.inflight(); got != 1 {
		t.Fatalf("in flight %d, want 1", got)
	}
	if len(s.Routes) != 2 || s.Routes[0].Route != "/v1/embeddings" || s.Routes[0].Count != 11 || s.Routes[0].Errors != 1 {
		t.Fatalf("routes %+v", s.Routes)
	}
	if e := s.Routes[0]; e.P99 != 100 || e.P50 != 50 || e.Samples != 11 {
		t.Fatalf("embeddings percentiles %+v, want p50 50 p99 100", e)
	}
	// Three completed buckets: [0,5) with 10 requests, [5,10) with 2, [10,15) empty.
	want := RateSeries{BucketSeconds: 5, T: []int64{1_000_000_000_000, 1_000_000_005_000, 1_000_000_010_000},
		Requests: []float64{2, 0.4, 0}, Errors: []float64{0, 0.2, 0}, ClientErrors: []float64{0, 0.2, 0}}
	if !slices.Equal(s.Series.T, want.T) || !slices.Equal(s.Series.Requests, want.Requests) ||
		!slices.Equal(s.Series.Errors, want.Errors) || !slices.Equal(s.Series.ClientErrors, want.ClientErrors) {
		t.Fatalf("series %+v, want %+v", s.Series, want)
	}
	// Ten minutes later the old buckets have rotated out.
	late := r.snapshot(t0.Add(20*time.Minute), nil)
	if len(late.Series.T) != bucketCount-1 || slices.Max(late.Series.Requests) != 0 {
		t.Fatalf("late series: %d points, max %v", len(late.Series.T), slices.Max(late.Series.Requests))
	}
}

func TestDashboardMeshSeries(t *testing.T) {
	r := newRecentStats()
	t0 := time.Unix(2_000_000_000, 0)
	u := func(a, ae, b int64) []WorkerUsage {
		return []WorkerUsage{{Worker: "a", Requests: a, Errors: ae}, {Worker: "b", Requests: b}}
	}
	r.snapshot(t0, u(0, 0, 0))
	r.snapshot(t0.Add(time.Second), u(50, 0, 50))  // too soon: not sampled
	r.snapshot(t0.Add(2*time.Second), u(10, 2, 4)) // +10/+2/+4 over 2 s
	s := r.snapshot(t0.Add(4*time.Second), u(30, 2, 4))
	if len(s.Mesh.T) != 2 {
		t.Fatalf("mesh points %v", s.Mesh.T)
	}
	if a := s.Mesh.Workers["a"]; !slices.Equal(a.Requests, []float64{5, 10}) || !slices.Equal(a.Errors, []float64{1, 0}) {
		t.Fatalf("worker a %+v", a)
	}
	if b := s.Mesh.Workers["b"]; !slices.Equal(b.Requests, []float64{2, 0}) {
		t.Fatalf("worker b %+v", b)
	}
	// After a long pause the series starts afresh instead of averaging
	// over the gap.
	s = r.snapshot(t0.Add(10*time.Minute), u(1000, 2, 4))
	if len(s.Mesh.T) != 0 {
		t.Fatalf("series after a gap: %v", s.Mesh.T)
	}
}

func TestDashboardPageSelfContained(t *testing.T) {
	s := New(Options{Backend: nil, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(), Dashboard: true})
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/dashboard", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	body := rec.Body.String()
	if !strings.Contains(body, `data-key-required="false"`) || strings.Contains(body, "{{") {
		t.Fatal("key hint not filled in")
	}
	csp := rec.Header().Get("Content-Security-Policy")
	if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Fatalf("CSP %q", csp)
	}
	// Nothing is loaded from elsewhere: every src/href is a data: URL or
	// a path on this node.
	for _, m := range regexp.MustCompile(`(?i)\b(?:src|href)\s*=\s*["']([^"']*)["']`).FindAllStringSubmatch(body, -1) {
		if !strings.HasPrefix(m[1], "data:") && !strings.HasPrefix(m[1], "/") {
			t.Errorf("page loads %q", m[1])
		}
	}
	if strings.Contains(strings.ReplaceAll(body, "http://www.w3.org/2000/svg", ""), "://") {
		t.Error("page names an external URL")
	}
}

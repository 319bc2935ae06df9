package dispatch_test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infermesh/infermesh/mesh"
	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/mesh/meshtest"
	"github.com/infermesh/infermesh/node/dispatch"
)

// hopBench is the loopback setup the hop benchmarks share: n2 serves model
// m; "direct" calls n2's front end, "mesh" calls n1's, which forwards over
// Connect, and "proxy" calls a tuned httputil.ReverseProxy in front of n2.
type hopBench struct {
	urls   map[string]string
	client *http.Client
	body   []byte
	want   int
}

// The front ends mark requests as one-piece answers (Facts.OnePiece), as
// the API does for an embeddings request, so the mesh hop is a
// ForwardUnary call; HOP_STREAM=1 makes it the streaming Forward call.
// HOP_PCT=1 logs each path's latency percentiles from p50 to p99.9, and
// HOP_FAST_GOSSIP=1 runs the nodes on the test clusters' fast gossip.

// hopPaths are the compared paths; HOP_ONLY=mesh (or direct, proxy) runs
// one of them alone, for profiling.
var hopPaths = func() []string {
	if p := os.Getenv("HOP_ONLY"); p != "" {
		return []string{p}
	}
	return []string{"direct", "mesh", "proxy"}
}()

func newHopBench(b *testing.B) *hopBench {
	b.Helper()
	resp := bytes.Repeat([]byte("x"), 1024)
	resp = append([]byte(`{"object":"list","data":[{"embedding":"`), resp...)
	resp = append(resp, `"}]}`...)
	engine := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(resp)
	})
	fronts := map[string]string{}
	var mu sync.Mutex
	pol := fixedPolicy{}
	c := meshtest.Start(b, meshtest.Options{
		IDs: []string{"n1", "n2"},
		// A deployment's gossip, not a test's: memberlist's LAN timers and
		// the default record interval and heartbeat. meshtest.Config's timers
		// publish load every 20 ms, which in the same process makes gossip
		// the largest allocator of the run (its packets, its compression)
		// and adds to every path's GC time.
		Configure: func(cfg *mesh.Config) {
			if os.Getenv("HOP_FAST_GOSSIP") == "" {
				cfg.Timers, cfg.RecordInterval, cfg.RecordHeartbeat, cfg.EjectHold = mesh.LANTimers(), 0, 0, 0
			}
		},
		Local: func(n *meshtest.Node) http.Handler {
			d, err := dispatch.New(dispatch.Config{NodeID: n.ID}, engine, n.Mesh, n.Client, pol, n.Mesh, n.Logger, nil)
			if err != nil {
				b.Fatal(err)
			}
			url := serve(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				d.Serve(w, r, dispatch.Facts{Model: "m", Caller: forward.Caller{KeyID: "bench"}, OnePiece: os.Getenv("HOP_STREAM") == ""}, body)
			}))
			mu.Lock()
			fronts[n.ID] = url
			mu.Unlock()
			return d.Local()
		},
	})
	c.Node("n2").Ready("m")
	c.Node("n1").Ready()
	c.WaitConverged()

	target, _ := url.Parse(fronts["n2"])
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: &http.Transport{
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
			WriteBufferSize:     64 << 10,
			ReadBufferSize:      64 << 10,
		},
		BufferPool: newBufferPool(32 << 10),
	}
	return &hopBench{
		urls: map[string]string{"direct": fronts["n2"], "mesh": fronts["n1"], "proxy": serve(b, rp)},
		client: &http.Client{Transport: &http.Transport{
			MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 90 * time.Second, DisableCompression: true,
		}},
		body: []byte(`{"model":"m","input":"the quick brown fox jumps over the lazy dog"}`),
		want: len(resp),
	}
}

func serve(b *testing.B, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

type bufferPool struct{ p sync.Pool }

func newBufferPool(size int) *bufferPool {
	return &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, size); return &b }}}
}
func (p *bufferPool) Get() []byte  { return *(p.p.Get().(*[]byte)) }
func (p *bufferPool) Put(b []byte) { p.p.Put(&b) }

func (h *hopBench) do(b *testing.B, path string) {
	resp, err := h.client.Post(h.urls[path]+"/v1/embeddings", "application/json", bytes.NewReader(h.body))
	if err != nil {
		b.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || int(n) != h.want {
		b.Fatalf("%s: status %d, %d bytes", path, resp.StatusCode, n)
	}
}

// BenchmarkHopLatency measures, at concurrency 1 and interleaving the three
// paths request by request, the latency the mesh hop and the ReverseProxy
// hop add over a direct request, at p50 and p99. Target: mesh/proxy added
// latency ratio <= 1.2.
func BenchmarkHopLatency(b *testing.B) {
	h := newHopBench(b)
	for _, p := range hopPaths { // warm connections
		for i := 0; i < 200; i++ {
			h.do(b, p)
		}
	}
	lat := map[string][]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range hopPaths {
			p := hopPaths[(i+j)%len(hopPaths)]
			t0 := time.Now()
			h.do(b, p)
			lat[p] = append(lat[p], time.Since(t0))
		}
	}
	b.StopTimer()
	pct := func(p string, q float64) float64 {
		d := slices.Clone(lat[p])
		slices.Sort(d)
		return float64(d[min(len(d)-1, int(q*float64(len(d))))]) / float64(time.Microsecond)
	}
	if os.Getenv("HOP_PCT") != "" {
		for _, p := range hopPaths {
			b.Logf("%s p50 %.0f p90 %.0f p95 %.0f p98 %.0f p99 %.0f p99.5 %.0f p99.9 %.0f", p, pct(p, .5), pct(p, .9), pct(p, .95), pct(p, .98), pct(p, .99), pct(p, .995), pct(p, .999))
		}
	}
	if len(hopPaths) < 3 {
		return
	}
	for _, q := range []struct {
		name string
		v    float64
	}{{"p50", 0.50}, {"p99", 0.99}} {
		direct := pct("direct", q.v)
		meshAdd := pct("mesh", q.v) - direct
		proxyAdd := pct("proxy", q.v) - direct
		b.ReportMetric(direct, "direct_"+q.name+"_us")
		b.ReportMetric(meshAdd, "mesh_added_"+q.name+"_us")
		b.ReportMetric(proxyAdd, "proxy_added_"+q.name+"_us")
		if proxyAdd > 0 {
			b.ReportMetric(meshAdd/proxyAdd, "added_"+q.name+"_mesh/proxy")
		}
	}
}

// BenchmarkHopThroughput measures requests per second at concurrency 64 for
// the three paths, in alternating rounds. Target: mesh/proxy >= 0.85.
func BenchmarkHopThroughput(b *testing.B) {
	const conc = 64
	h := newHopBench(b)
	for _, p := range hopPaths {
		run(b, h, p, conc, 2000)
	}
	elapsed := map[string]time.Duration{}
	done := map[string]int{}
	round := max(b.N/4, 1)
	b.ResetTimer()
	for left := b.N; left > 0; left -= round {
		n := min(round, left)
		for _, p := range hopPaths {
			elapsed[p] += run(b, h, p, conc, n)
			done[p] += n
		}
	}
	b.StopTimer()
	rps := map[string]float64{}
	for _, p := range hopPaths {
		rps[p] = float64(done[p]) / elapsed[p].Seconds()
		b.ReportMetric(rps[p], p+"_rps")
	}
	if rps["proxy"] > 0 {
		b.ReportMetric(rps["mesh"]/rps["proxy"], "throughput_mesh/proxy")
	}
}

// run sends n requests on path with conc workers and returns the wall time.
func run(b *testing.B, h *hopBench, path string, conc, n int) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				h.do(b, path)
			}
		}()
	}
	wg.Wait()
	return time.Since(t0)
}

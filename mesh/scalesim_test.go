package mesh

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infermesh/infermesh/mesh/route"
	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

// simResult is what one simulated mesh measured.
type simResult struct {
	Nodes                 int     `json:"nodes"`
	Timers                string  `json:"timers"`
	StartSeconds          float64 `json:"start_s"`
	AfterLastStartSeconds float64 `json:"after_last_start_s"` // -1: not within the bound
	IdleSeconds           float64 `json:"idle_window_s"`
	IdleInMean            float64 `json:"idle_in_bytes_per_s_mean"`
	IdleInMax             float64 `json:"idle_in_bytes_per_s_max"`
	IdleOutMean           float64 `json:"idle_out_bytes_per_s_mean"`
	IdleOutMax            float64 `json:"idle_out_bytes_per_s_max"`
	LoadSeconds           float64 `json:"load_window_s"`
	LoadChangesPerSec     float64 `json:"load_changes_per_s"`
	LoadInMean            float64 `json:"load_in_bytes_per_s_mean"`
	LoadOutMean           float64 `json:"load_out_bytes_per_s_mean"`
	Drops                 uint64  `json:"packets_dropped"`
	HeapMiB               float64 `json:"heap_mib"`
}

// TestScaleSimulation runs meshes of the sizes in INFERMESH_SCALE_SIM
// (comma-separated, e.g. "100,1000"; skipped when unset: `make
// scale-sim`) in this process over an in-memory network, with the real
// Mesh, memberlist, encryption and records: node 1 starts, the others
// join through three seeds at once, the model is on 5 nodes. It reports
// the time until every node lists every node ready after the last start,
// gossip bytes per node per second idle, then while LOAD_NODES nodes (5)
// change their in-flight count every record interval. Timers:
// INFERMESH_SCALE_SIM_TIMERS = local (default: what a node on loopback
// runs), lan, or test (--fast-timers). Results go to the test log and,
// with INFERMESH_SCALE_SIM_OUT, to sim.json there. It fails when a mesh
// does not converge within 10 minutes (a hang guard, not a target).
func TestScaleSimulation(t *testing.T) {
	spec := os.Getenv("INFERMESH_SCALE_SIM")
	if spec == "" {
		t.Skip("INFERMESH_SCALE_SIM not set (make scale-sim)")
	}
	timers := os.Getenv("INFERMESH_SCALE_SIM_TIMERS")
	if timers == "" {
		timers = "local"
	}
	window := 30 * time.Second
	if w := os.Getenv("INFERMESH_SCALE_SIM_WINDOW"); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil {
			t.Fatal(err)
		}
		window = d
	}
	var results []simResult
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			t.Fatalf("INFERMESH_SCALE_SIM: bad size %q", f)
		}
		r := simulate(t, n, timers, window)
		t.Logf("%+v", r)
		results = append(results, r)
	}
	if dir := os.Getenv("INFERMESH_SCALE_SIM_OUT"); dir != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "sim.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// simTimers returns the named timers with failure detection relaxed: a
// thousand memberlists share this process's two cores with whatever else
// runs, and a probe answered late by a starved goroutine is not a failure
// the simulation is about (it made memberships flap). The probe interval,
// gossip and push-pull, which set the bytes, are unchanged.
func simTimers(name string) Timers {
	t := LocalTimers()
	switch name {
	case "lan":
		t = LANTimers()
	case "test":
		t = TestTimers()
	}
	t.ProbeTimeout = max(t.ProbeTimeout, t.ProbeInterval*9/10)
	t.SuspicionMult = max(t.SuspicionMult, 8)
	return t
}

func simulate(t *testing.T, n int, timers string, window time.Duration) simResult {
	res := simResult{Nodes: n, Timers: timers}
	sn := newSimNet()
	trs := make([]*simTransport, n)
	for i := range trs {
		trs[i] = sn.newTransport()
	}
	seeds := []string{trs[0].addr, trs[1%n].addr, trs[2%n].addr}
	meshes := make([]*Mesh, n)
	defer func() {
		var wg sync.WaitGroup
		for _, m := range meshes {
			if m != nil {
				wg.Add(1)
				go func() { defer wg.Done(); m.Shutdown() }()
			}
		}
		wg.Wait()
	}()
	start := func(i int) {
		cfg := Config{NodeID: fmt.Sprintf("s%04d", i), BindAddr: "127.0.0.1:0", ClusterSecret: "scale-sim",
			Timers: simTimers(timers), transport: trs[i]}
		if timers == "test" {
			cfg.JoinBackoffMin, cfg.JoinBackoffMax = 50*time.Millisecond, time.Second
		}
		if i > 0 {
			cfg.Join = seeds
		}
		m, err := New(cfg, nil, nil, nil)
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		if i < 5 {
			m.SetModels([]string{"m"}, []string{"m"})
		}
		m.SetRouting(Routing{MaxInFlight: 8})
		m.SetHealth(route.HealthReady)
		meshes[i] = m
	}
	t0 := time.Now()
	start(0)
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); start(i) }()
	}
	wg.Wait()
	lastStart := time.Now()
	res.StartSeconds = lastStart.Sub(t0).Seconds()
	bound := 10 * time.Minute
	if b := os.Getenv("INFERMESH_SCALE_SIM_BOUND"); b != "" {
		if d, err := time.ParseDuration(b); err == nil {
			bound = d
		}
	}
	deadline := lastStart.Add(bound)
	nextLog := time.Now().Add(5 * time.Second)
	for {
		if time.Now().After(nextLog) {
			minMembers, minReady := n, n
			for _, m := range meshes {
				minMembers = min(minMembers, int(m.table.members.Load()))
				minReady = min(minReady, m.table.readyMembers())
			}
			t.Logf("%d nodes, %.0f s after the last start: fewest members %d, fewest ready %d", n, time.Since(lastStart).Seconds(), minMembers, minReady)
			nextLog = time.Now().Add(5 * time.Second)
		}
		if allReady(meshes, n) {
			res.AfterLastStartSeconds = time.Since(lastStart).Seconds()
			break
		}
		if time.Now().After(deadline) {
			// Measure the bytes anyway; the report says it did not converge.
			t.Errorf("%d nodes: not converged %s after the last start", n, bound)
			res.AfterLastStartSeconds = -1
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d nodes converged %.1f s after the last start", n, res.AfterLastStartSeconds)

	// Idle: let the joins' traffic settle for one window, then measure.
	time.Sleep(window / 2)
	a, at := byteCounts(meshes), time.Now()
	time.Sleep(window)
	b, bt := byteCounts(meshes), time.Now()
	res.IdleSeconds = bt.Sub(at).Seconds()
	res.IdleInMean, res.IdleInMax, res.IdleOutMean, res.IdleOutMax = rates(a, b, res.IdleSeconds)

	// Load: the five model nodes change their in-flight count every record
	// interval, as nodes under traffic do.
	stop := make(chan struct{})
	var changes sync.WaitGroup
	var count int64
	var cmu sync.Mutex
	for i := range min(5, n) {
		changes.Add(1)
		go func() {
			defer changes.Done()
			tick := time.NewTicker(250 * time.Millisecond)
			defer tick.Stop()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				case <-tick.C:
					meshes[i].SetInFlight(k % 7)
					cmu.Lock()
					count++
					cmu.Unlock()
				}
			}
		}()
	}
	a, at = byteCounts(meshes), time.Now()
	time.Sleep(window)
	b, bt = byteCounts(meshes), time.Now()
	close(stop)
	changes.Wait()
	res.LoadSeconds = bt.Sub(at).Seconds()
	res.LoadChangesPerSec = float64(count) / res.LoadSeconds
	res.LoadInMean, _, res.LoadOutMean, _ = rates(a, b, res.LoadSeconds)
	res.Drops = sn.drops.Load()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.HeapMiB = float64(ms.HeapAlloc) / (1 << 20)
	return res
}

// allReady reports whether every mesh lists n members ready, read from
// the table directly (a snapshot of every table each round would cost the
// simulation more than the meshes do).
func allReady(meshes []*Mesh, n int) bool {
	for _, m := range meshes {
		if m.table.readyMembers() != n {
			return false
		}
	}
	return true
}

// readyMembers counts members whose record says ready and that are not
// ejected.
func (t *table) readyMembers() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := 0
	for _, e := range t.nodes {
		if e.member && !e.ejected && e.record.GetHealth() == meshv1.Health_HEALTH_READY {
			c++
		}
	}
	return c
}

func byteCounts(meshes []*Mesh) [][2]uint64 {
	out := make([][2]uint64, len(meshes))
	for i, m := range meshes {
		out[i][0], out[i][1] = m.GossipBytes()
	}
	return out
}

// rates returns the mean and max bytes per second per node, in and out.
func rates(a, b [][2]uint64, secs float64) (inMean, inMax, outMean, outMax float64) {
	ins := make([]float64, len(a))
	outs := make([]float64, len(a))
	for i := range a {
		ins[i] = float64(b[i][0]-a[i][0]) / secs
		outs[i] = float64(b[i][1]-a[i][1]) / secs
	}
	mean := func(v []float64) float64 {
		var s float64
		for _, x := range v {
			s += x
		}
		return s / float64(len(v))
	}
	return mean(ins), slices.Max(ins), mean(outs), slices.Max(outs)
}

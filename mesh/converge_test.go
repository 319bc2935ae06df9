package mesh_test

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/infermesh/infermesh/mesh"
	"github.com/infermesh/infermesh/mesh/route"
)

// convergeLimit guards against a hang; it is not a timing expectation.
const convergeLimit = 60 * time.Second

// startTogether starts n nodes at once on loopback, each on its own
// address (127.0.31.i, port), every one but the seed (node 1) joining the
// seed, and the seed started last, so the first joins hit a closed port as
// when a deployment starts every node together. Each node reports itself
// ready as soon as it runs. It returns how long it took from the start
// until every node listed n ready members, and stops the nodes.
func startTogether(t *testing.T, n, port int, configure func(*mesh.Config)) time.Duration {
	t.Helper()
	addr := func(i int) string { return net.JoinHostPort(fmt.Sprintf("127.0.31.%d", i), fmt.Sprint(port)) }
	nodes := make([]*mesh.Mesh, n+1)
	defer func() {
		for _, m := range nodes {
			if m != nil {
				m.Shutdown()
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	t0 := time.Now()
	startNode := func(i int) {
		defer wg.Done()
		cfg := mesh.Config{NodeID: fmt.Sprintf("n%02d", i), BindAddr: addr(i), ClusterSecret: "converge"}
		if i != 1 {
			cfg.Join = []string{addr(1)}
		}
		configure(&cfg)
		m, err := mesh.New(cfg, nil, nil, nil)
		if err != nil {
			errs <- err
			return
		}
		m.SetHealth(route.HealthReady)
		nodes[i] = m
	}
	wg.Add(n - 1)
	for i := 2; i <= n; i++ {
		go startNode(i)
	}
	wg.Wait()
	wg.Add(1)
	startNode(1)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ready := func(m *mesh.Mesh) int {
		k := 0
		for _, p := range m.Peers() {
			if p.Health == route.HealthReady && !p.Ejected {
				k++
			}
		}
		return k
	}
	for {
		all := true
		for _, m := range nodes[1:] {
			if ready(m) != n {
				all = false
				break
			}
		}
		if all {
			return time.Since(t0)
		}
		if time.Since(t0) > convergeLimit {
			var got []string
			for _, m := range nodes[1:] {
				got = append(got, fmt.Sprintf("%s:%d", m.LocalID(), ready(m)))
			}
			t.Fatalf("after %s the nodes list these numbers of ready members: %v, want %d each", convergeLimit, got, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Ten nodes started together, the seed last, all list ten ready members,
// in ten consecutive runs with the fast timers a node gets with
// --fast-timers. How long it took is logged per run, not asserted: the
// bound (5 s in the issue) is a measured figure for the notes.
func TestTenNodesStartedTogetherConverge(t *testing.T) {
	fast := func(c *mesh.Config) {
		c.Timers = mesh.TestTimers()
		c.JoinBackoffMin, c.JoinBackoffMax = 50*time.Millisecond, time.Second
	}
	var worst time.Duration
	for run := 0; run < 10; run++ {
		d := startTogether(t, 10, 27600+run, fast)
		worst = max(worst, d)
		t.Logf("fast timers, run %d: all ten list ten ready members after %s", run+1, d.Round(time.Millisecond))
	}
	t.Logf("fast timers: slowest of ten runs %s", worst.Round(time.Millisecond))
}

// The same start with the timers a node uses by default (memberlist's LAN
// settings, join backoff 250 ms doubling to 2 s, records every 250 ms),
// once; the time is logged for the notes.
func TestTenNodesConvergeWithDeploymentTimers(t *testing.T) {
	if testing.Short() {
		t.Skip("deployment timers are slow; -short leaves them out")
	}
	d := startTogether(t, 10, 27620, func(*mesh.Config) {})
	t.Logf("deployment timers: all ten list ten ready members after %s", d.Round(time.Millisecond))
}

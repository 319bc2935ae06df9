package limits

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/auth"
)

func waitQueued(t *testing.T, g *Gate, n int) {
	t.Helper()
	deadline := time.Now().Add(consensustest.WaitLimit)
	for g.Load().Queued != n {
		if time.Now().After(deadline) {
			t.Fatalf("queue never reached %d (load %+v)", n, g.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGateInteractiveFirst: with every slot taken, queued work gets slots
// interactive first, then background, then maintenance, FIFO within each.
func TestGateInteractiveFirst(t *testing.T) {
	g := NewGate(GateConfig{MaxInflight: 1, MaxQueue: 10}, prometheus.NewRegistry(), nil)
	hold, d := g.Acquire(context.Background(), Interactive)
	if d != nil {
		t.Fatal(d)
	}
	if !g.Load().Saturated() {
		t.Fatalf("load %+v with the only slot taken is not saturated", g.Load())
	}
	var (
		mu    sync.Mutex
		order []string
		wg    sync.WaitGroup
	)
	queue := []struct {
		name string
		p    Priority
	}{
		{"maint-1", Maintenance}, {"bg-1", Background}, {"int-1", Interactive},
		{"bg-2", Background}, {"int-2", Interactive}, {"maint-2", Maintenance},
	}
	for i, w := range queue {
		wg.Add(1)
		go func() {
			defer wg.Done()
			release, d := g.Acquire(context.Background(), w.p)
			if d != nil {
				t.Errorf("%s: %v", w.name, d)
				return
			}
			mu.Lock()
			order = append(order, w.name)
			mu.Unlock()
			release()
		}()
		waitQueued(t, g, i+1)
	}
	hold()
	wg.Wait()
	want := "int-1 int-2 bg-1 bg-2 maint-1 maint-2"
	if got := strings.Join(order, " "); got != want {
		t.Fatalf("order %q, want %q", got, want)
	}
	if l := g.Load(); l.Inflight != 0 || l.Queued != 0 || l.Saturated() {
		t.Fatalf("load after everyone left: %+v", l)
	}
}

// TestGateRefusesWithRetryAfterFromQueueDepth: a queue full of interactive
// work refuses at once with Retry-After = queue rounds × average hold.
func TestGateRefusesWithRetryAfterFromQueueDepth(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	g := NewGate(GateConfig{MaxInflight: 2, MaxQueue: 3}, nil, clk.Now)
	// Teach the gate that a slot is held 4 s.
	r, _ := g.Acquire(context.Background(), Interactive)
	clk.Advance(4 * time.Second)
	r()
	a, _ := g.Acquire(context.Background(), Interactive)
	b, _ := g.Acquire(context.Background(), Interactive)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, d := g.Acquire(ctx, Interactive); d == nil || d.Status != 503 || d.Code != apierr.CodeOverloaded {
				t.Errorf("cancelled waiter: %+v, want 503 %s", d, apierr.CodeOverloaded)
			}
		}()
		waitQueued(t, g, i+1)
	}
	_, d := g.Acquire(context.Background(), Interactive)
	// (3 queued + this one) / 2 slots × 4 s = 8 s.
	if d == nil || d.Status != 503 || d.Code != apierr.CodeOverloaded || d.RetryAfter != 8 {
		t.Fatalf("full queue: %+v, want 503 %s Retry-After 8", d, apierr.CodeOverloaded)
	}
	cancel()
	wg.Wait()
	if l := g.Load(); l.Queued != 0 || l.Inflight != 2 {
		t.Fatalf("after cancellations: %+v, want 2 in flight, none queued", l)
	}
	a()
	b()
	if l := g.Load(); l.Inflight != 0 {
		t.Fatalf("after releases: %+v", l)
	}
}

// TestLimiterUsesGate: admitted engine work holds a slot until Done;
// pulls and uncounted requests do not take one.
func TestLimiterUsesGate(t *testing.T) {
	c := cluster(t, 1, nil)
	caller := createKey(t, c, "key_gate", consensus.Limits{})
	g := NewGate(GateConfig{MaxInflight: 1, MaxWait: time.Hour}, nil, nil)
	l, _ := newLimiter(t, c.Peer("n1"), Config{Gate: g}, nil)
	first, d := l.Admit(context.Background(), chat(caller))
	if d != nil {
		t.Fatal(d)
	}
	pull := chat(caller)
	pull.Class = auth.ClassPull
	if d := admit(l, pull); d != nil {
		t.Fatalf("pull while busy: %v", d)
	}
	bg := chat(caller)
	bg.Priority = ParsePriority("background")
	got := make(chan *auth.Denial, 1)
	go func() {
		tk, d := l.Admit(context.Background(), bg)
		if d == nil {
			tk.Done(Usage{Status: 200})
		}
		got <- d
	}()
	waitQueued(t, g, 1)
	first.Done(Usage{Status: 200})
	if d := <-got; d != nil {
		t.Fatalf("background request after the slot freed: %v", d)
	}
	if g.Load().Inflight != 0 {
		t.Fatalf("slots still taken: %+v", g.Load())
	}
}

package limits

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/auth"
)

func gauge(reg *prometheus.Registry, name string, labels map[string]string) float64 {
	mfs, _ := reg.Gather()
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			sum += m.GetGauge().GetValue()
		}
	}
	return sum
}

// acquireAsync starts an Acquire and returns where its outcome arrives.
func acquireAsync(g *Gate, ctx context.Context, p Priority) chan gateResult {
	out := make(chan gateResult, 1)
	go func() {
		release, d := g.Acquire(ctx, p)
		out <- gateResult{release, d}
	}()
	return out
}

type gateResult struct {
	release func()
	d       *auth.Denial
}

func recv(t *testing.T, ch chan gateResult) gateResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(consensustest.WaitLimit):
		t.Fatal("no gate outcome")
	}
	return gateResult{}
}

func pending(ch chan gateResult) bool {
	select {
	case r := <-ch:
		ch <- r // put it back for a later recv
		return false
	case <-time.After(20 * time.Millisecond):
		return true
	}
}

// TestGateReservesSlotsForInteractive: background and maintenance work
// start only below MaxInflight-Reserve; interactive work takes the
// reserved slots at once while unattended work waits.
func TestGateReservesSlotsForInteractive(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := NewGate(GateConfig{MaxInflight: 4}, reg, nil) // Reserve defaults to 1
	if got := g.Config().Reserve; got != 1 {
		t.Fatalf("default reserve %d, want 1", got)
	}
	var held []func()
	for i := 0; i < 3; i++ {
		r, d := g.Acquire(context.Background(), Background)
		if d != nil {
			t.Fatalf("background %d on an idle node: %v", i, d)
		}
		held = append(held, r)
	}
	bg := acquireAsync(g, context.Background(), Background)
	maint := acquireAsync(g, context.Background(), Maintenance)
	waitQueued(t, g, 2)
	r, d := g.Acquire(context.Background(), Interactive)
	if d != nil {
		t.Fatalf("interactive with the reserved slot free: %v", d)
	}
	if got := gauge(reg, "infermesh_gate_waiting", map[string]string{"priority": "background"}); got != 1 {
		t.Fatalf("waiting{background} = %v, want 1", got)
	}
	if got := gauge(reg, "infermesh_gate_inflight", nil); got != 4 {
		t.Fatalf("inflight = %v, want 4", got)
	}
	// The interactive slot frees: still not below MaxInflight-Reserve for
	// background work (3 background requests run).
	r()
	if !pending(bg) {
		t.Fatal("background work took the reserved slot")
	}
	// A background slot frees: the waiting background request goes first,
	// maintenance still waits.
	held[0]()
	got := recv(t, bg)
	if got.d != nil {
		t.Fatal(got.d)
	}
	if !pending(maint) {
		t.Fatal("maintenance started before background")
	}
	held[1]()
	if got := recv(t, maint); got.d != nil {
		t.Fatal(got.d)
	} else {
		got.release()
	}
	held[2]()
	got.release()
	if l := g.Load(); l.Inflight != 0 || l.Queued != 0 {
		t.Fatalf("load after everyone left: %+v", l)
	}
	if n := counter(reg, "infermesh_gate_admitted_total", map[string]string{"priority": "background", "waited": "true"}); n != 1 {
		t.Fatalf("admitted{background,waited} = %v, want 1", n)
	}
}

// TestGateShedsBackgroundFirst: with the queue full, an arrival takes the
// place of the most recent waiter of a lower priority (shed 503: lowest
// priority first) instead of being refused; an arrival with nobody below
// it is refused.
func TestGateShedsBackgroundFirst(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := NewGate(GateConfig{MaxInflight: 1, MaxQueue: 3, MaxWait: time.Hour}, reg, nil)
	hold, _ := g.Acquire(context.Background(), Interactive)
	maint := acquireAsync(g, context.Background(), Maintenance)
	waitQueued(t, g, 1)
	bg1 := acquireAsync(g, context.Background(), Background)
	waitQueued(t, g, 2)
	bg2 := acquireAsync(g, context.Background(), Background)
	waitQueued(t, g, 3)

	// Background arriving at a full queue sheds maintenance.
	bg3 := acquireAsync(g, context.Background(), Background)
	if got := recv(t, maint); got.d == nil || got.d.Status != 503 || got.d.Code != apierr.CodeOverloaded || got.d.RetryAfter < 1 {
		t.Fatalf("maintenance waiter: %+v, want shed 503 %s with Retry-After", got.d, apierr.CodeOverloaded)
	}
	waitQueued(t, g, 3)
	// Nobody below background: refused at once.
	if _, d := g.Acquire(context.Background(), Background); d == nil || d.Status != 503 || d.Code != apierr.CodeOverloaded {
		t.Fatalf("background to a queue full of background work: %+v, want 503 %s", d, apierr.CodeOverloaded)
	}
	// Interactive arrivals shed the newest background waiter each.
	var in []chan gateResult
	for i, bg := range []chan gateResult{bg3, bg2, bg1} {
		in = append(in, acquireAsync(g, context.Background(), Interactive))
		if got := recv(t, bg); got.d == nil || got.d.Status != 503 {
			t.Fatalf("background waiter %d: %+v, want shed 503", 3-i, got.d)
		}
		waitQueued(t, g, 3)
	}
	if _, d := g.Acquire(context.Background(), Interactive); d == nil || d.Code != apierr.CodeOverloaded {
		t.Fatalf("interactive to a queue full of interactive work: %v", d)
	}
	hold()
	for i, ch := range in {
		got := recv(t, ch)
		if got.d != nil {
			t.Fatalf("interactive %d: %v", i, got.d)
		}
		got.release()
	}
	for _, c := range []struct {
		p, reason string
		want      float64
	}{
		{"maintenance", ShedDisplaced, 1}, {"background", ShedDisplaced, 3},
		{"background", ShedQueueFull, 1}, {"interactive", ShedQueueFull, 1}, {"interactive", ShedDisplaced, 0},
	} {
		if n := counter(reg, "infermesh_gate_shed_total", map[string]string{"priority": c.p, "reason": c.reason}); n != c.want {
			t.Errorf("shed{%s,%s} = %v, want %v", c.p, c.reason, n, c.want)
		}
	}
	if l := g.Load(); l.Inflight != 0 || l.Queued != 0 {
		t.Fatalf("load: %+v", l)
	}
}

// TestGateWaitIsNeverShed: a batch-job chunk (Wait at Background) waits
// behind interactive work, outside MaxQueue, and is never shed; it gives
// up only when its context ends.
func TestGateWaitIsNeverShed(t *testing.T) {
	g := NewGate(GateConfig{MaxInflight: 1, MaxQueue: 1, MaxWait: time.Hour}, nil, nil)
	hold, _ := g.Acquire(context.Background(), Interactive)
	job := make(chan error, 1)
	var jobRelease func()
	go func() {
		r, err := g.Wait(context.Background(), Background)
		jobRelease = r
		job <- err
	}()
	waitQueued(t, g, 1)
	// The job does not fill the queue: one interactive request still
	// queues, and does not shed the job.
	in := acquireAsync(g, context.Background(), Interactive)
	waitQueued(t, g, 2)
	hold()
	got := recv(t, in)
	if got.d != nil {
		t.Fatal(got.d)
	}
	select {
	case err := <-job:
		t.Fatalf("job ran before the interactive request finished (err %v)", err)
	case <-time.After(20 * time.Millisecond):
	}
	got.release()
	if err := <-job; err != nil {
		t.Fatal(err)
	}
	jobRelease()

	// A job whose context ends gives up with its error.
	hold, _ = g.Acquire(context.Background(), Interactive)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := g.Wait(ctx, Background); err != context.DeadlineExceeded {
		t.Fatalf("Wait with an ended context: %v", err)
	}
	hold()
	if l := g.Load(); l.Inflight != 0 || l.Queued != 0 {
		t.Fatalf("load: %+v", l)
	}
}

// TestGateTimeoutAndCancel: waits end with 503 on BackgroundWait and on
// the request's end; a slot granted to a cancelled request passes on.
func TestGateTimeoutAndCancel(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := NewGate(GateConfig{MaxInflight: 1, MaxWait: time.Hour, BackgroundWait: 20 * time.Millisecond}, reg, nil)
	hold, _ := g.Acquire(context.Background(), Interactive)
	if _, d := g.Acquire(context.Background(), Background); d == nil || d.Code != apierr.CodeOverloaded {
		t.Fatalf("background past BackgroundWait: %v", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := acquireAsync(g, ctx, Interactive)
	waitQueued(t, g, 1)
	cancel()
	if got := recv(t, ch); got.d == nil {
		t.Fatal("cancelled waiter got a slot")
	}
	hold()
	if l := g.Load(); l.Inflight != 0 || l.Queued != 0 {
		t.Fatalf("load: %+v", l)
	}
	if n := counter(reg, "infermesh_gate_shed_total", map[string]string{"priority": "background", "reason": ShedTimeout}); n != 1 {
		t.Fatalf("shed{background,timeout} = %v", n)
	}
	if n := counter(reg, "infermesh_gate_shed_total", map[string]string{"priority": "interactive", "reason": ShedCanceled}); n != 1 {
		t.Fatalf("shed{interactive,canceled} = %v", n)
	}
}

// TestGateUnderSaturation: many requests of both priorities against a
// small gate; interactive work keeps succeeding while background work is
// shed. Prints both success rates.
func TestGateUnderSaturation(t *testing.T) {
	g := NewGate(GateConfig{MaxInflight: 2, MaxQueue: 4, MaxWait: 5 * time.Second, BackgroundWait: 5 * time.Second}, nil, nil)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ok   = map[Priority]int{}
		sent = map[Priority]int{}
	)
	for i := 0; i < 60; i++ {
		p := Interactive
		if i%2 == 1 {
			p = Background
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			release, d := g.Acquire(context.Background(), p)
			mu.Lock()
			sent[p]++
			if d == nil {
				ok[p]++
			}
			mu.Unlock()
			if d == nil {
				time.Sleep(5 * time.Millisecond)
				release()
			}
		}()
		if i%6 == 5 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	wg.Wait()
	rate := func(p Priority) float64 { return float64(ok[p]) / float64(sent[p]) }
	fmt.Printf("gate saturation: interactive %d/%d (%.0f%%), background %d/%d (%.0f%%)\n",
		ok[Interactive], sent[Interactive], 100*rate(Interactive), ok[Background], sent[Background], 100*rate(Background))
	if rate(Interactive) <= rate(Background) {
		t.Fatalf("interactive success %.2f not above background %.2f", rate(Interactive), rate(Background))
	}
}

// TestBatchRunsAsBackground: Request.Batch lowers an interactive request
// to Background in the gate; it never raises maintenance.
func TestBatchRunsAsBackground(t *testing.T) {
	c := cluster(t, 1, nil)
	caller := createKey(t, c, "key_batch", consensus.Limits{})
	g := NewGate(GateConfig{MaxInflight: 4, MaxWait: time.Hour}, nil, nil) // 3 for background
	l, _ := newLimiter(t, c.Peer("n1"), Config{Gate: g}, nil)
	var tickets []*Ticket
	for i := 0; i < 3; i++ {
		r := chat(caller)
		r.Class, r.Batch = auth.ClassEmbeddings, true
		tk, d := l.Admit(context.Background(), r)
		if d != nil {
			t.Fatal(d)
		}
		tickets = append(tickets, tk)
	}
	// A fourth batch request waits: the last slot is interactive work's.
	r := chat(caller)
	r.Class, r.Batch = auth.ClassEmbeddings, true
	done := make(chan *auth.Denial, 1)
	go func() {
		tk, d := l.Admit(context.Background(), r)
		if d == nil {
			tk.Done(Usage{Status: 200})
		}
		done <- d
	}()
	waitQueued(t, g, 1)
	if d := admit(l, chat(caller)); d != nil {
		t.Fatalf("interactive request next to batch work: %v", d)
	}
	tickets[0].Done(Usage{Status: 200})
	if d := <-done; d != nil {
		t.Fatal(d)
	}
	for _, tk := range tickets[1:] {
		tk.Done(Usage{Status: 200})
	}
	if (Request{Priority: Maintenance, Batch: true}).effective() != Maintenance {
		t.Fatal("Batch raised maintenance work")
	}
}

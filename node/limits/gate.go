package limits

import (
	"container/list"
	"context"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/node/auth"
)

// Defaults of GateConfig.
const (
	DefaultGateQueueFactor = 4                // MaxQueue = 4 × MaxInflight
	DefaultGateMaxWait     = 30 * time.Second // longest wait for a slot
)

// GateConfig configures a Gate.
type GateConfig struct {
	// MaxInflight is the node's busy capacity: how many requests run at
	// once. Zero or less means no cap (the gate only counts).
	MaxInflight int
	// Reserve is how many of the MaxInflight slots only interactive work
	// may take: background and maintenance work starts only while fewer
	// than MaxInflight-Reserve requests run, so people never find the
	// node filled by unattended work. Zero takes the default,
	// a quarter of MaxInflight and at least one (none when MaxInflight is
	// 1); negative reserves none.
	Reserve int
	// MaxQueue is how many requests may wait for a slot (default
	// 4×MaxInflight). When it is full an arriving request takes the place
	// of the most recent waiter of the lowest priority below its own
	// (maintenance first, then background), which is shed; a request
	// with nobody below it is refused at once.
	MaxQueue int
	// MaxWait bounds one interactive wait for a slot (default 30s).
	MaxWait time.Duration
	// BackgroundWait bounds one background or maintenance wait (default
	// MaxWait).
	BackgroundWait time.Duration
}

func (c GateConfig) withDefaults() GateConfig {
	if c.MaxInflight < 0 {
		c.MaxInflight = 0
	}
	switch {
	case c.Reserve < 0 || c.MaxInflight <= 1:
		c.Reserve = 0
	case c.Reserve == 0:
		c.Reserve = max(1, c.MaxInflight/4)
	}
	c.Reserve = min(c.Reserve, max(c.MaxInflight-1, 0))
	if c.MaxQueue <= 0 {
		c.MaxQueue = DefaultGateQueueFactor * max(c.MaxInflight, 1)
	}
	if c.MaxWait <= 0 {
		c.MaxWait = DefaultGateMaxWait
	}
	if c.BackgroundWait <= 0 {
		c.BackgroundWait = c.MaxWait
	}
	return c
}

// GateLoad is a gate's state, for gossip (saturation) and the dashboard.
type GateLoad struct {
	Inflight int // requests holding a slot
	Cap      int // MaxInflight; zero means no cap
	Queued   int // requests waiting
}

// Saturated reports whether every slot is taken.
func (g GateLoad) Saturated() bool { return g.Cap > 0 && g.Inflight >= g.Cap }

// Reasons a gate sheds a request (label "reason" of
// infermesh_gate_shed_total).
const (
	ShedQueueFull = "queue_full" // the queue was full on arrival
	ShedDisplaced = "displaced"  // an interactive request took its place in the queue
	ShedTimeout   = "timeout"    // waited MaxWait (or BackgroundWait)
	ShedCanceled  = "canceled"   // the request ended while waiting
)

// Gate is the node's busy gate: an in-flight cap with priorities. When
// every slot is taken, waiting interactive work gets the next free slot
// before background work, and background before maintenance (FIFO within
// one priority); background and maintenance work never take the slots
// reserved for interactive work; and when the queue is full, an arriving
// request sheds the most recent waiter of a lower priority instead of
// being refused, so unattended work is always shed first. Refusals are 503 server_overloaded with a Retry-After
// from the queue depth. Wrap engine work with it, including work forwarded
// by peers and batch-job chunks (Wait), so the cap is the node's real load.
type Gate struct {
	cfg   GateConfig
	clock func() time.Time

	mu       sync.Mutex
	inflight int
	running  [numPriorities]int
	queues   [numPriorities]list.List // of *gateWaiter
	queued   int                      // waiters counted against MaxQueue
	// avgHold is a moving average of how long a slot is held, for
	// Retry-After.
	avgHold time.Duration

	m gateMetrics
}

type gateMetrics struct {
	inflight *prometheus.GaugeVec
	waiting  *prometheus.GaugeVec
	admitted *prometheus.CounterVec
	shed     *prometheus.CounterVec
}

type gateWaiter struct {
	p       Priority
	job     bool // Wait: never shed, not counted against MaxQueue
	ready   chan struct{}
	granted bool
	shed    bool // displaced by interactive work
}

// NewGate returns a gate. reg receives its metrics (nil registers none):
// infermesh_gate_capacity, infermesh_gate_inflight{priority},
// infermesh_gate_waiting{priority}, infermesh_gate_admitted_total{priority,
// waited} and infermesh_gate_shed_total{priority,reason}. clock nil uses
// time.Now.
func NewGate(cfg GateConfig, reg prometheus.Registerer, clock func() time.Time) *Gate {
	cfg = cfg.withDefaults()
	if clock == nil {
		clock = time.Now
	}
	g := &Gate{cfg: cfg, clock: clock}
	g.m = gateMetrics{
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "infermesh_gate_inflight", Help: "Requests holding a busy-gate slot, by priority.",
		}, []string{"priority"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "infermesh_gate_waiting", Help: "Requests waiting for a busy-gate slot, by priority.",
		}, []string{"priority"}),
		admitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_gate_admitted_total", Help: "Requests that got a busy-gate slot, by priority and whether they waited.",
		}, []string{"priority", "waited"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_gate_shed_total", Help: "Requests refused 503 by the busy gate, by priority and reason.",
		}, []string{"priority", "reason"}),
	}
	capacity := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "infermesh_gate_capacity", Help: "Busy-gate capacity (in-flight cap; 0 means none).",
	}, func() float64 { return float64(cfg.MaxInflight) })
	for p := Priority(0); p < numPriorities; p++ {
		// Every series exists from the start, at zero.
		g.m.inflight.WithLabelValues(p.String())
		g.m.waiting.WithLabelValues(p.String())
		g.m.admitted.WithLabelValues(p.String(), "false")
		g.m.admitted.WithLabelValues(p.String(), "true")
		for _, r := range []string{ShedQueueFull, ShedDisplaced, ShedTimeout, ShedCanceled} {
			g.m.shed.WithLabelValues(p.String(), r)
		}
	}
	if reg != nil {
		reg.MustRegister(capacity, g.m.inflight, g.m.waiting, g.m.admitted, g.m.shed)
	}
	return g
}

// Config returns the gate's configuration with defaults filled in.
func (g *Gate) Config() GateConfig { return g.cfg }

// Load reports the gate's state.
func (g *Gate) Load() GateLoad {
	g.mu.Lock()
	defer g.mu.Unlock()
	return GateLoad{Inflight: g.inflight, Cap: g.cfg.MaxInflight, Queued: g.waitingLocked()}
}

func (g *Gate) waitingLocked() int {
	n := 0
	for p := range g.queues {
		n += g.queues[p].Len()
	}
	return n
}

func clampPriority(p Priority) Priority {
	if p >= numPriorities {
		return Maintenance
	}
	return p
}

// limitFor is how many requests may run for work of priority p to start.
func (g *Gate) limitFor(p Priority) int {
	if p == Interactive {
		return g.cfg.MaxInflight
	}
	return g.cfg.MaxInflight - g.cfg.Reserve
}

// canStartLocked: a free slot for p, and nobody of p's or a higher
// priority waiting (they are first).
func (g *Gate) canStartLocked(p Priority) bool {
	if g.cfg.MaxInflight <= 0 {
		return true
	}
	if g.inflight >= g.limitFor(p) {
		return false
	}
	for q := Interactive; q <= p; q++ {
		if g.queues[q].Len() > 0 {
			return false
		}
	}
	return true
}

func (g *Gate) startLocked(p Priority) {
	g.inflight++
	g.running[p]++
	g.m.inflight.WithLabelValues(p.String()).Set(float64(g.running[p]))
}

// Acquire takes a slot for a request of priority p, waiting behind
// higher-priority work when the node is busy. It returns the function
// that gives the slot back (call it once), or a 503 server_overloaded
// denial with a Retry-After from the queue depth when the queue is full,
// the request was shed for interactive work, the wait exceeded MaxWait
// (BackgroundWait), or ctx ended.
func (g *Gate) Acquire(ctx context.Context, p Priority) (func(), *auth.Denial) {
	p = clampPriority(p)
	g.mu.Lock()
	if g.canStartLocked(p) {
		g.startLocked(p)
		g.mu.Unlock()
		g.m.admitted.WithLabelValues(p.String(), "false").Inc()
		return g.releaser(p), nil
	}
	if g.queued >= g.cfg.MaxQueue && !g.displaceLocked(p) {
		retry := g.retryAfterLocked()
		g.mu.Unlock()
		g.m.shed.WithLabelValues(p.String(), ShedQueueFull).Inc()
		return nil, denyBusy(retry, "every in-flight slot is taken and the queue is full")
	}
	w, el := g.enqueueLocked(p, false)
	g.mu.Unlock()

	wait := g.cfg.MaxWait
	if p != Interactive {
		wait = g.cfg.BackgroundWait
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var reason, why string
	select {
	case <-w.ready:
	case <-ctx.Done():
		reason, why = ShedCanceled, "the request ended while queued"
	case <-timer.C:
		reason, why = ShedTimeout, "waited too long for an in-flight slot"
	}
	g.mu.Lock()
	switch {
	case w.granted && reason != ShedCanceled:
		// Granted, possibly just as the wait timed out: the work is still
		// wanted, so keep the slot.
		g.mu.Unlock()
		g.m.admitted.WithLabelValues(p.String(), "true").Inc()
		return g.releaser(p), nil
	case w.granted:
		// Granted as the request ended: pass the slot on.
		g.mu.Unlock()
		g.releaser(p)()
		g.mu.Lock()
	case w.shed:
		reason, why = ShedDisplaced, "lower-priority work is shed while interactive work waits"
	default:
		g.removeLocked(w, el)
	}
	retry := g.retryAfterLocked()
	g.mu.Unlock()
	g.m.shed.WithLabelValues(p.String(), reason).Inc()
	return nil, denyBusy(retry, why)
}

// Wait takes a slot for work the node schedules itself, such as the
// chunks of a batch job (use Background): it queues at priority p like
// Acquire but is never shed, does not count against MaxQueue and waits as
// long as ctx allows. It returns ctx.Err() when ctx ends first.
func (g *Gate) Wait(ctx context.Context, p Priority) (func(), error) {
	p = clampPriority(p)
	g.mu.Lock()
	if g.canStartLocked(p) {
		g.startLocked(p)
		g.mu.Unlock()
		g.m.admitted.WithLabelValues(p.String(), "false").Inc()
		return g.releaser(p), nil
	}
	w, el := g.enqueueLocked(p, true)
	g.mu.Unlock()
	select {
	case <-w.ready:
		g.m.admitted.WithLabelValues(p.String(), "true").Inc()
		return g.releaser(p), nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	if w.granted {
		g.mu.Unlock()
		g.releaser(p)()
	} else {
		g.removeLocked(w, el)
		g.mu.Unlock()
	}
	return nil, ctx.Err()
}

func (g *Gate) enqueueLocked(p Priority, job bool) (*gateWaiter, *list.Element) {
	w := &gateWaiter{p: p, job: job, ready: make(chan struct{})}
	el := g.queues[p].PushBack(w)
	if !job {
		g.queued++
	}
	g.m.waiting.WithLabelValues(p.String()).Set(float64(g.queues[p].Len()))
	return w, el
}

func (g *Gate) removeLocked(w *gateWaiter, el *list.Element) {
	g.queues[w.p].Remove(el)
	if !w.job {
		g.queued--
	}
	g.m.waiting.WithLabelValues(w.p.String()).Set(float64(g.queues[w.p].Len()))
}

// displaceLocked makes room in a full queue for work of priority p by
// shedding the most recent waiter of the lowest priority below p (never a
// Wait job). It reports whether it did.
func (g *Gate) displaceLocked(p Priority) bool {
	for q := Maintenance; q > p; q-- {
		for el := g.queues[q].Back(); el != nil; el = el.Prev() {
			w := el.Value.(*gateWaiter)
			if w.job {
				continue
			}
			g.removeLocked(w, el)
			w.shed = true
			close(w.ready)
			return true
		}
	}
	return false
}

// releaser returns the slot's release function; it times the hold.
func (g *Gate) releaser(p Priority) func() {
	start := g.clock()
	var once sync.Once
	return func() {
		once.Do(func() { g.release(p, g.clock().Sub(start)) })
	}
}

func (g *Gate) release(p Priority, held time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if held > 0 {
		if g.avgHold == 0 {
			g.avgHold = held
		} else {
			g.avgHold += (held - g.avgHold) / 8
		}
	}
	g.inflight--
	g.running[p]--
	g.m.inflight.WithLabelValues(p.String()).Set(float64(g.running[p]))
	g.grantLocked()
}

// grantLocked hands free slots to waiters, highest priority first; a
// lower priority is served only when no higher one waits.
func (g *Gate) grantLocked() {
	for q := Interactive; q < numPriorities; q++ {
		for g.queues[q].Len() > 0 {
			if g.cfg.MaxInflight > 0 && g.inflight >= g.limitFor(q) {
				return // lower priorities have an equal or lower limit
			}
			el := g.queues[q].Front()
			w := el.Value.(*gateWaiter)
			g.removeLocked(w, el)
			g.startLocked(q)
			w.granted = true
			close(w.ready)
		}
	}
}

// retryAfterLocked estimates when a new request would get a slot: the
// queue ahead of it, drained MaxInflight at a time, each taking the
// average hold. At least 1 s, at most 60 s.
func (g *Gate) retryAfterLocked() int {
	if g.avgHold <= 0 || g.cfg.MaxInflight <= 0 {
		return 1
	}
	rounds := float64(g.waitingLocked()+1) / float64(g.cfg.MaxInflight)
	s := int(math.Ceil(rounds * g.avgHold.Seconds()))
	return min(max(s, 1), 60)
}

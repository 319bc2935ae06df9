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

// GateConfig configures a Gate.
type GateConfig struct {
	// MaxInflight is how many requests run at once; zero or less means no
	// cap (the gate only counts).
	MaxInflight int
	// MaxQueue is how many may wait for a slot (default 4×MaxInflight);
	// beyond it requests are refused at once.
	MaxQueue int
	// MaxWait bounds one wait for a slot (default 30s).
	MaxWait time.Duration
}

// GateLoad is a gate's state, for gossip (saturation) and the dashboard.
type GateLoad struct {
	Inflight int // requests holding a slot
	Cap      int // MaxInflight; zero means no cap
	Queued   int // requests waiting
}

// Saturated reports whether every slot is taken.
func (g GateLoad) Saturated() bool { return g.Cap > 0 && g.Inflight >= g.Cap }

// Gate is a priority semaphore: an in-flight cap where, when every slot is
// taken, waiting interactive work gets the next free slot before
// background work, and background before maintenance (FIFO within one
// priority). Wrap local engine work with it, including work forwarded by
// peers, so the cap is the node's real load.
type Gate struct {
	cfg   GateConfig
	clock func() time.Time

	mu       sync.Mutex
	inflight int
	queues   [numPriorities]list.List // of *gateWaiter
	queued   int
	// avgHold is a moving average of how long a slot is held, for
	// Retry-After.
	avgHold time.Duration

	mInflight prometheus.Gauge
	mQueued   prometheus.Gauge
	mRefused  prometheus.Counter
	mWaited   *prometheus.CounterVec
}

type gateWaiter struct {
	ready   chan struct{}
	granted bool
}

// NewGate returns a gate; reg receives its metrics (nil registers none),
// clock nil uses time.Now.
func NewGate(cfg GateConfig, reg prometheus.Registerer, clock func() time.Time) *Gate {
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = 4 * max(cfg.MaxInflight, 1)
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 30 * time.Second
	}
	if clock == nil {
		clock = time.Now
	}
	g := &Gate{
		cfg: cfg, clock: clock,
		mInflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "infermesh_gate_inflight", Help: "Requests holding an in-flight slot.",
		}),
		mQueued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "infermesh_gate_queued", Help: "Requests waiting for an in-flight slot.",
		}),
		mRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infermesh_gate_refused_total", Help: "Requests refused because the node was busy.",
		}),
		mWaited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infermesh_gate_waited_total", Help: "Requests that waited for a slot, by priority.",
		}, []string{"priority"}),
	}
	if reg != nil {
		reg.MustRegister(g.mInflight, g.mQueued, g.mRefused, g.mWaited)
	}
	return g
}

// Load reports the gate's state.
func (g *Gate) Load() GateLoad {
	g.mu.Lock()
	defer g.mu.Unlock()
	return GateLoad{Inflight: g.inflight, Cap: max(g.cfg.MaxInflight, 0), Queued: g.queued}
}

// Acquire takes a slot, waiting behind higher-priority work when all are
// taken. It returns the function that gives the slot back (call it once),
// or a 503 denial with a Retry-After from the queue depth when the queue
// is full, the wait exceeds MaxWait, or ctx ends.
func (g *Gate) Acquire(ctx context.Context, p Priority) (func(), *auth.Denial) {
	if p >= numPriorities {
		p = Maintenance
	}
	g.mu.Lock()
	if g.cfg.MaxInflight <= 0 || g.inflight < g.cfg.MaxInflight {
		// A free slot means nobody waits: release hands slots to waiters.
		g.inflight++
		g.mInflight.Set(float64(g.inflight))
		g.mu.Unlock()
		return g.releaser(), nil
	}
	if g.queued >= g.cfg.MaxQueue {
		retry := g.retryAfterLocked()
		g.mu.Unlock()
		g.mRefused.Inc()
		return nil, denyBusy(retry, "every in-flight slot is taken and the queue is full")
	}
	w := &gateWaiter{ready: make(chan struct{})}
	el := g.queues[p].PushBack(w)
	g.queued++
	g.mQueued.Set(float64(g.queued))
	g.mu.Unlock()
	g.mWaited.WithLabelValues(p.String()).Inc()

	timer := time.NewTimer(g.cfg.MaxWait)
	defer timer.Stop()
	var why string
	select {
	case <-w.ready:
		return g.releaser(), nil
	case <-ctx.Done():
		why = "the request ended while queued"
	case <-timer.C:
		why = "waited too long for an in-flight slot"
	}
	g.mu.Lock()
	if w.granted {
		// The slot arrived as we gave up: pass it on.
		g.mu.Unlock()
		g.releaser()()
	} else {
		g.queues[p].Remove(el)
		g.queued--
		g.mQueued.Set(float64(g.queued))
		g.mu.Unlock()
	}
	g.mu.Lock()
	retry := g.retryAfterLocked()
	g.mu.Unlock()
	g.mRefused.Inc()
	return nil, denyBusy(retry, why)
}

// releaser returns the slot's release function; it times the hold.
func (g *Gate) releaser() func() {
	start := g.clock()
	var once sync.Once
	return func() {
		once.Do(func() { g.release(g.clock().Sub(start)) })
	}
}

func (g *Gate) release(held time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if held > 0 {
		if g.avgHold == 0 {
			g.avgHold = held
		} else {
			g.avgHold += (held - g.avgHold) / 8
		}
	}
	for p := range g.queues {
		if el := g.queues[p].Front(); el != nil {
			w := g.queues[p].Remove(el).(*gateWaiter)
			g.queued--
			g.mQueued.Set(float64(g.queued))
			w.granted = true
			close(w.ready)
			return // the slot passes to the waiter
		}
	}
	g.inflight--
	g.mInflight.Set(float64(g.inflight))
}

// retryAfterLocked estimates when a new request would get a slot: the
// queue ahead of it, drained MaxInflight at a time, each taking the
// average hold. At least 1 s, at most 60 s.
func (g *Gate) retryAfterLocked() int {
	if g.avgHold <= 0 || g.cfg.MaxInflight <= 0 {
		return 1
	}
	rounds := float64(g.queued+1) / float64(g.cfg.MaxInflight)
	s := int(math.Ceil(rounds * g.avgHold.Seconds()))
	return min(max(s, 1), 60)
}

package limits

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/node/auth"
)

// Limiter admits counted requests against rate limits, daily quotas and
// monthly budgets, and batches their usage to the cluster.
type Limiter struct {
	cfg    Config
	leaser Leaser
	log    *slog.Logger
	clock  func() time.Time
	m      *metrics

	keyBuckets    *buckets
	clientBuckets *buckets
	freeBuckets   *buckets // the Free allowance's per-client minute

	mu       sync.RWMutex
	accounts map[acctKey]*account

	settleMu sync.Mutex
	settleQ  []consensus.Settlement
	settling bool

	usage *usageBatcher

	draining atomic.Bool
	opCtx    context.Context // lease and usage commands
	opCancel context.CancelFunc
	ops      tracker // lease commands in flight
	loopStop context.CancelFunc
	loops    sync.WaitGroup
	stopOnce sync.Once
}

// New returns a Limiter that takes leases and reports usage through
// leaser, and starts its background upkeep (usage flushes, lease renewals
// and returns). leaser is required. reg receives its metrics (nil
// registers none); clock nil uses time.Now; logger nil discards. Stop it
// with Drain, or Close.
func New(cfg Config, leaser Leaser, logger *slog.Logger, reg prometheus.Registerer, clock func() time.Time) *Limiter {
	if leaser == nil {
		panic("limits: New needs a Leaser")
	}
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if clock == nil {
		clock = time.Now
	}
	l := &Limiter{
		cfg: cfg, leaser: leaser, log: logger, clock: clock,
		keyBuckets:    newBuckets(cfg.TrackedBuckets),
		clientBuckets: newBuckets(cfg.TrackedBuckets),
		freeBuckets:   newBuckets(cfg.TrackedBuckets),
		accounts:      map[acctKey]*account{},
	}
	l.usage = newUsageBatcher(l)
	l.m = newMetrics(reg, l)
	l.opCtx, l.opCancel = context.WithCancel(context.Background())
	loopCtx, stop := context.WithCancel(context.Background())
	l.loopStop = stop
	l.loops.Add(2)
	go l.flushLoop(loopCtx)
	go l.maintainLoop(loopCtx)
	return l
}

// Ticket is an admitted request. Call Done once when it finishes.
type Ticket struct {
	l      *Limiter
	record bool // usage is recorded on Done
	key    usageKey

	price  consensus.Price
	priced bool

	rpm [3]*rate.Reservation // client, key and Free-minute tokens taken

	quota       *account
	quotaPeriod string

	budget       *account
	budgetPeriod string
	estimate     int64

	free       *account // the Free allowance's ledger
	freePeriod string

	release func()
	done    atomic.Bool
}

// Done records what the request used and frees its in-flight slot. The
// budget is charged the real cost (the estimate was held at admission).
// Calls after the first do nothing.
func (t *Ticket) Done(u Usage) {
	if t == nil || t.l == nil || !t.done.CompareAndSwap(false, true) {
		return
	}
	if t.release != nil {
		t.release()
	}
	if !t.record {
		return
	}
	var cost int64
	if t.priced {
		cost = t.price.Cost(max(0, u.PromptTokens), max(0, u.CompletionTokens))
	}
	if t.budget != nil && cost != t.estimate {
		t.budget.charge(t.budgetPeriod, cost-t.estimate)
	}
	var errs int64
	if u.Status >= 400 {
		errs = 1
	}
	k := t.key
	k.worker, k.day = u.Worker, consensus.DayOf(t.l.clock())
	t.l.usage.record(k, consensus.Counters{
		Requests: 1, InputTokens: max(0, u.PromptTokens), OutputTokens: max(0, u.CompletionTokens),
		CostMicros: cost, Errors: errs,
	})
}

// undo gives back what an admission took when a later check refuses it.
func (t *Ticket) undo(now time.Time) {
	for _, r := range t.rpm {
		if r != nil {
			r.CancelAt(now)
		}
	}
	if t.quota != nil {
		t.quota.refund(t.quotaPeriod, 1)
	}
	if t.budget != nil {
		t.budget.refund(t.budgetPeriod, t.estimate)
	}
	if t.free != nil {
		t.free.refund(t.freePeriod, 1)
	}
	if t.release != nil {
		t.release()
	}
}

var noop = &Ticket{}

// Admit decides whether a request may run. Uncounted requests and public
// callers pass at once and record nothing. Forwarded requests were
// admitted by the node that forwarded them: they only enter the gate. The
// local operator is limited by nothing but the Free plan (when its
// User-Agent names a third-party tool) and the gate; its usage is
// recorded. For everyone else, in order: client-address rate, key rate
// (the key's own rpm, else Config.KeyRPM), the Free plan (Classify; a
// third-party caller takes its client's minute and one request of the
// mesh-wide daily allowance), daily quota (one request) and monthly budget
// (the estimated cost, when the model has a price), then the gate at the
// request's priority (Batch work at Background at most). A refusal gives
// back what earlier steps took and says which limit refused and when to
// retry; Upgrade tells whether it is one a paid plan would lift. Admit
// may wait for a lease command or a gate slot, never longer than ctx
// allows.
func (l *Limiter) Admit(ctx context.Context, r Request) (*Ticket, *auth.Denial) {
	c := r.Caller
	if !r.Counted || c.Public {
		return noop, nil
	}
	if c.Forwarded {
		t := &Ticket{l: l}
		if d := l.enterGate(ctx, r, t); d != nil {
			return nil, d
		}
		return t, nil
	}
	if l.draining.Load() {
		return nil, l.refuse(denyDraining())
	}
	now := l.clock()
	t := &Ticket{l: l, record: true, key: usageKey{app: c.App, model: r.Model, keyID: c.KeyID}}
	if l.cfg.Prices != nil && r.Model != "" {
		t.price, t.priced = l.cfg.Prices.Price(r.Model)
	}
	if c.Local {
		if d := l.checkFree(ctx, r, now, t); d != nil {
			t.undo(now)
			return nil, l.refuse(d)
		}
		if d := l.enterGate(ctx, r, t); d != nil {
			t.undo(now)
			return nil, d
		}
		l.m.exempt.Inc()
		return t, nil
	}
	if d := l.checkRates(r, now, t); d != nil {
		return nil, l.refuse(d)
	}
	if d := l.checkFree(ctx, r, now, t); d != nil {
		t.undo(now)
		return nil, l.refuse(d)
	}
	if q := c.Limits.DailyQuota; q > 0 {
		a, period, d := l.take(ctx, now, c.KeyID, consensus.LeaseDailyRequests, 1, q)
		if d != nil {
			t.undo(now)
			return nil, l.refuse(d)
		}
		t.quota, t.quotaPeriod = a, period
	}
	if b := c.Limits.MonthlyBudgetMicros; b > 0 && t.priced {
		out := r.MaxOutputTokens
		if out <= 0 {
			out = l.cfg.DefaultOutputTokens
		}
		if est := t.price.Cost(max(0, r.InputTokens), out); est > 0 {
			a, period, d := l.take(ctx, now, c.KeyID, consensus.LeaseMonthlyBudget, est, b)
			if d != nil {
				t.undo(now)
				return nil, l.refuse(d)
			}
			t.budget, t.budgetPeriod = a, period
			if a != nil {
				t.estimate = est
			}
		}
	}
	if d := l.enterGate(ctx, r, t); d != nil {
		t.undo(now)
		return nil, d
	}
	l.m.admitted.Inc()
	return t, nil
}

func (l *Limiter) refuse(d *auth.Denial) *auth.Denial {
	l.m.decisions.WithLabelValues(d.Code).Inc()
	return d
}

func (l *Limiter) checkRates(r Request, now time.Time, t *Ticket) *auth.Denial {
	if rpm := l.cfg.ClientRPM; rpm > 0 && r.ClientAddr != "" {
		res, wait := l.clientBuckets.reserve(clientKey(r.ClientAddr), rpm, now)
		if res == nil {
			return denyClientRate(rpm, wait)
		}
		t.rpm[0] = res
	}
	if r.Caller.KeyID == "" {
		return nil // keyless (the legacy API): the address is its only name
	}
	rpm := r.Caller.Limits.RPM
	if rpm <= 0 {
		rpm = l.cfg.KeyRPM
	}
	if rpm > 0 {
		res, wait := l.keyBuckets.reserve(r.Caller.KeyID, rpm, now)
		if res == nil {
			t.undo(now)
			return denyKeyRate(r.Caller.KeyID, rpm, wait)
		}
		t.rpm[1] = res
	}
	return nil
}

// gated classes run on an engine and take an in-flight slot; pulls are
// downloads and do not.
// Gated reports whether requests of class c are engine work that passes
// the busy gate.
func Gated(c auth.Class) bool { return gated(c) }

func gated(c auth.Class) bool {
	switch c {
	case auth.ClassChat, auth.ClassEmbeddings, auth.ClassImages, auth.ClassAudio, auth.ClassVision:
		return true
	}
	return false
}

func (l *Limiter) enterGate(ctx context.Context, r Request, t *Ticket) *auth.Denial {
	if l.cfg.Gate == nil || !gated(r.Class) {
		return nil
	}
	release, d := l.cfg.Gate.Acquire(ctx, r.effective())
	if d != nil {
		return l.refuse(d)
	}
	t.release = release
	return nil
}

// Flush sends the usage recorded so far to the cluster now.
func (l *Limiter) Flush(ctx context.Context) error { return l.usage.flush(ctx) }

func (l *Limiter) flushLoop(ctx context.Context) {
	defer l.loops.Done()
	tick := time.NewTicker(l.cfg.FlushInterval)
	defer tick.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-l.usage.kick:
			if !l.usage.full() {
				continue // a kick left over from before the last cut
			}
		}
		_, err := l.usage.flushOnce(l.opCtx)
		switch {
		case err != nil && !failing:
			l.log.Warn("usage batch not recorded yet; it is kept and retried", "err", err)
		case err == nil && failing:
			l.log.Info("usage batches recorded again")
		}
		failing = err != nil
	}
}

func (l *Limiter) maintainLoop(ctx context.Context) {
	defer l.loops.Done()
	tick := time.NewTicker(l.cfg.MaintainInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			l.maintain()
		}
	}
}

func (l *Limiter) stopLoops() {
	l.stopOnce.Do(func() {
		l.loopStop()
		l.loops.Wait()
	})
}

// Close stops the background work without returning anything: what this
// node holds expires and counts as used, as after a crash.
func (l *Limiter) Close() {
	l.draining.Store(true)
	l.stopLoops()
	l.opCancel()
	<-l.ops.idle()
}

// Drain refuses new counted requests (503 server_draining), waits for
// lease commands in flight, reports everything admitted and returns every
// holding of this node (including ones left by an earlier run of the
// node, counted as used), then sends the last usage. Call it once the
// node's in-flight requests have finished. On ctx's end it gives up; what
// it could not return expires and counts as used.
func (l *Limiter) Drain(ctx context.Context) error {
	l.draining.Store(true)
	l.stopLoops()
	defer l.opCancel()
	select {
	case <-l.ops.idle():
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := retry(ctx, func() error { return l.returnAll(ctx) }); err != nil {
		return err
	}
	return retry(ctx, func() error { return l.usage.flush(ctx) })
}

func retry(ctx context.Context, f func() error) error {
	backoff := 50 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

type holdingKey struct {
	keyID, period string
	kind          consensus.LeaseKind
}

// returnAll settles and releases everything in one command.
func (l *Limiter) returnAll(ctx context.Context) error {
	var (
		s     []consensus.Settlement
		known = map[holdingKey]bool{}
	)
	l.mu.RLock()
	for _, a := range l.accounts {
		a.mu.Lock()
		if a.period != "" && (a.held > 0 || a.pending > 0) {
			s = append(s, consensus.Settlement{
				KeyID: a.key.keyID, Kind: a.key.kind, Period: a.period, Consumed: max(0, a.pending), Release: true,
			})
		}
		if a.period != "" {
			known[holdingKey{a.key.keyID, a.period, a.key.kind}] = true
		}
		a.mu.Unlock()
	}
	l.mu.RUnlock()
	l.settleMu.Lock()
	queued := len(l.settleQ)
	s = append(s, l.settleQ...)
	l.settleMu.Unlock()
	for _, h := range l.leaser.Holdings() {
		if h.Held > 0 && !known[holdingKey{h.KeyID, h.Period, h.Kind}] {
			// Not this run's: what was admitted against it is unknown.
			s = append(s, consensus.Settlement{KeyID: h.KeyID, Kind: h.Kind, Period: h.Period, Consumed: h.Held, Release: true})
		}
	}
	if len(s) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.LeaseTimeout)
	_, err := l.leaser.Settle(ctx, s)
	cancel()
	l.m.leaseCommand(true, err)
	if err != nil {
		return err
	}
	l.mu.RLock()
	for _, a := range l.accounts {
		a.mu.Lock()
		a.held, a.pending = 0, 0
		a.mu.Unlock()
	}
	l.mu.RUnlock()
	l.settleMu.Lock()
	l.settleQ = l.settleQ[queued:]
	l.settleMu.Unlock()
	return nil
}

// tracker counts commands in flight and tells when there are none. Unlike
// a WaitGroup it may gain work while someone waits.
type tracker struct {
	mu   sync.Mutex
	n    int
	zero chan struct{}
}

func (t *tracker) add() {
	t.mu.Lock()
	if t.n == 0 {
		t.zero = make(chan struct{})
	}
	t.n++
	t.mu.Unlock()
}

func (t *tracker) done() {
	t.mu.Lock()
	t.n--
	if t.n == 0 {
		close(t.zero)
	}
	t.mu.Unlock()
}

// idle is closed once nothing is in flight (already, when nothing is).
func (t *tracker) idle() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	return t.zero
}

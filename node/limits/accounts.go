package limits

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/node/auth"
)

type acctKey struct {
	keyID string
	kind  consensus.LeaseKind
}

// account is this node's side of one key's ledger of one kind (daily
// requests or monthly budget), following the protocol in
// consensus/DESIGN.md: held is the holding from the last result, pending
// what was admitted and not yet reported, and one lease command at most is
// in flight.
type account struct {
	key acctKey

	mu        sync.Mutex
	period    string    // period of the holding (the leader's)
	held      int64     // holding after the last result
	pending   int64     // admitted, not yet reported
	expires   time.Time // end of the holding
	remaining int64     // left to grant in the period at the last result; -1 unknown
	limit     int64     // the key's limit as the last request saw it
	checkedAt time.Time // when the last result arrived
	lastUse   time.Time // last admission

	unlimitedUntil time.Time // the leader said the key has no such limit
	op             chan struct{}
	releasing      bool // the command in flight gives the holding back
	unusable       bool // the last grant could not be used (clock skew at a period's end)
	failedAt       time.Time
	failErr        error
	inactive       bool // the leader refused the key (revoked, expired, unknown)
	gone           bool // dropped from the limiter's map

	// crowded: at the last grant, at least crowdedHolders other nodes held
	// part of the limit. Slices are then sized by this node's own demand
	// (what it admitted in the last second), so nodes that see a key
	// rarely do not strand slices others could use.
	crowded bool
	// crowdedIn is the period in which the ledger was last seen crowded:
	// until it ends, a refusal while others hold part of the limit is
	// retryable even when few holders are left.
	crowdedIn  string
	demandAt   time.Time // start of the current one-second demand window
	demandCur  int64     // admitted in the current window
	demandPrev int64     // admitted in the previous window (0 if further back)
}

// crowdedRecheck is how long a node of a crowded ledger trusts "nothing
// left to grant" while others still hold part of the limit.
const crowdedRecheck = 200 * time.Millisecond

// crowdedKeep is the demand (admissions a second) from which a node of a
// crowded ledger holds more than it needs now.
const crowdedKeep = 4

// crowdedIdle is how long a crowded account's holding may go unused
// before it is returned.
const crowdedIdle = time.Second

// crowdedHolders is how many other holders make a ledger crowded.
const crowdedHolders = 4

// noteDemand counts an admission of amount in the demand windows.
func (a *account) noteDemand(now time.Time, amount int64) {
	if d := now.Sub(a.demandAt); d >= time.Second {
		a.demandPrev = 0
		if d < 2*time.Second {
			a.demandPrev = a.demandCur
		}
		a.demandAt, a.demandCur = now, 0
	}
	a.demandCur += amount
}

// demand is this node's admissions per second, recently.
func (a *account) demand() int64 { return max(a.demandCur, a.demandPrev) }

// leaseOp is one lease command with what it reported.
type leaseOp struct {
	release    bool
	snapshot   int64 // pending reported as consumed
	heldBefore int64
	period     string
	want       int64
}

func (l *Limiter) account(k acctKey) *account {
	l.mu.RLock()
	a := l.accounts[k]
	l.mu.RUnlock()
	if a != nil {
		return a
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if a = l.accounts[k]; a == nil {
		a = &account{key: k, remaining: -1}
		l.accounts[k] = a
	}
	return a
}

// slice is how much to hold: a share of the limit, smaller as the period
// runs out so no node strands what others could use.
func (l *Limiter) slice(a *account) int64 {
	s := a.limit / l.cfg.SliceFraction
	if a.remaining >= 0 {
		s = min(s, a.remaining/4)
	}
	if a.crowded {
		// A node that admits fewer than crowdedKeep a second asks for
		// what each request needs: a spare unit it holds is one a client
		// of another node waits for.
		d := a.demand()
		if d < crowdedKeep {
			d = 1
		}
		s = min(s, d)
	}
	return max(s, 1)
}

func (a *account) usable(now time.Time, amount int64) bool {
	return !a.releasing && now.Before(a.expires) && a.held-a.pending >= amount
}

// take admits amount against the key's holding of kind, asking the leader
// for more when the holding does not cover it. It returns the account and
// the period charged (nil when nothing is counted).
func (l *Limiter) take(ctx context.Context, now time.Time, keyID string, kind consensus.LeaseKind, amount, limit int64) (*account, string, *auth.Denial) {
	a := l.account(acctKey{keyID, kind})
	ran := 0
	for first := true; ; first = false {
		if !first {
			now = l.clock()
		}
		a.mu.Lock()
		if a.gone {
			a.mu.Unlock()
			a = l.account(acctKey{keyID, kind})
			continue
		}
		a.limit = limit
		if now.Before(a.unlimitedUntil) {
			a.lastUse = now
			a.mu.Unlock()
			return nil, "", nil
		}
		if a.usable(now, amount) {
			a.pending += amount
			a.lastUse = now
			a.noteDemand(now, amount)
			period := a.period
			var op *leaseOp
			if a.op == nil && l.shouldRenew(a, now, amount) {
				o := l.beginAcquire(a, 0, now)
				op = &o
			}
			a.mu.Unlock()
			if op != nil {
				l.goOp(a, *op)
			}
			return a, period, nil
		}
		if ch := a.op; ch != nil {
			a.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, "", denyCanceled(ctx.Err())
			}
		}
		if d := l.refusal(a, now, amount, ran); d != nil {
			a.mu.Unlock()
			return nil, "", d
		}
		op := l.beginAcquire(a, amount, now)
		a.mu.Unlock()
		if ok, period := l.runOp(a, op, amount); ok {
			return a, period, nil
		}
		ran++
	}
}

// maxOpsPerRequest bounds the lease commands one request runs itself.
const maxOpsPerRequest = 3

// refusal decides, with no command in flight and a holding that does not
// cover amount, whether to refuse without asking the leader.
func (l *Limiter) refusal(a *account, now time.Time, amount int64, ran int) *auth.Denial {
	k := a.key
	if a.inactive && now.Sub(a.checkedAt) < l.cfg.RecheckExhausted {
		return denyInactive()
	}
	if !a.failedAt.IsZero() && now.Sub(a.failedAt) < l.cfg.RetryBackoff {
		return denyUnavailable(k.keyID, k.kind, a.failErr)
	}
	if a.remaining >= 0 && now.Sub(a.checkedAt) < l.cfg.RecheckExhausted {
		local, _ := consensus.Period(k.kind, now)
		avail := int64(0)
		if now.Before(a.expires) {
			avail = max(0, a.held-a.pending)
		}
		if local <= a.period && avail+a.remaining < amount {
			if lr, ok := l.leaser.(LedgerReader); ok {
				if used, others, ok := lr.LedgerShare(k.keyID, k.kind, a.period); ok && others > 0 && a.crowdedIn == a.period && used+amount <= a.limit {
					if now.Sub(a.checkedAt) >= crowdedRecheck {
						return nil // ask again: holders return spare units every second
					}
					// Not used up: other nodes hold the rest of a ledger
					// that was crowded this period, and return what they
					// do not use within crowdedIdle. (Where it never was,
					// the refusal stays final: with few holders, a holder
					// that died keeps its share until the TTL, when it
					// counts as used.)
					return denyRetry(k.keyID, k.kind, "the rest of it is held by other nodes, which return what they do not use")
				}
			}
			return denyExhausted(k.keyID, k.kind, a.limit, now)
		}
	}
	if a.unusable && now.Sub(a.checkedAt) < l.cfg.RetryBackoff {
		return denyRetry(k.keyID, k.kind, "its period is changing over on this node")
	}
	if ran >= maxOpsPerRequest {
		return denyRetry(k.keyID, k.kind, "other requests used each share this node obtained")
	}
	return nil
}

// shouldRenew: after an admission, renew in the background when the
// holding runs low or is half way to its expiry, unless the leader just
// said nothing is left.
func (l *Limiter) shouldRenew(a *account, now time.Time, amount int64) bool {
	if now.Sub(a.checkedAt) >= l.cfg.LeaseTTL/2 {
		return true
	}
	if a.remaining == 0 && now.Sub(a.checkedAt) < l.cfg.RecheckExhausted {
		return false
	}
	return a.held-a.pending < max(l.slice(a)/4, amount, 1)
}

// beginAcquire marks a command in flight and builds it: report everything
// pending, top the holding up to a slice (or to need).
func (l *Limiter) beginAcquire(a *account, need int64, now time.Time) leaseOp {
	// A negative avail is cost charged beyond the holding (a request that
	// cost more than its estimate): ask for it too, so the next report
	// finds a holding to count it against.
	avail := int64(0)
	if now.Before(a.expires) {
		avail = a.held - a.pending
	}
	l.checkCrowded(a, now)
	want := max(1, max(l.slice(a), need)-avail)
	a.op = make(chan struct{})
	l.ops.add()
	return leaseOp{snapshot: a.reportable(), heldBefore: a.held, period: a.period, want: want}
}

// beginRelease marks a command in flight that reports everything pending
// and returns the holding. Nothing is admitted until it ends.
func (l *Limiter) beginRelease(a *account) leaseOp {
	a.op = make(chan struct{})
	a.releasing = true
	l.ops.add()
	return leaseOp{release: true, snapshot: a.reportable(), heldBefore: a.held, period: a.period}
}

// reportable is what the next command reports as consumed: everything
// pending, up to the holding (the leader counts nothing beyond a holding;
// the rest stays pending for the next one).
func (a *account) reportable() int64 { return min(max(0, a.pending), max(0, a.held)) }

func (l *Limiter) goOp(a *account, op leaseOp) { go l.runOp(a, op, 0) }

// runOp sends one lease command begun by beginAcquire or beginRelease and
// applies its result. With claim > 0
// (a request waiting for this command) it admits claim against the new
// holding before anyone else can, and reports whether it did.
func (l *Limiter) runOp(a *account, op leaseOp, claim int64) (bool, string) {
	defer l.ops.done()
	ctx, cancel := context.WithTimeout(l.opCtx, l.cfg.LeaseTimeout)
	var (
		g   consensus.LeaseGrant
		err error
	)
	if op.release {
		var gs []consensus.LeaseGrant
		gs, err = l.leaser.Settle(ctx, []consensus.Settlement{{
			KeyID: a.key.keyID, Kind: a.key.kind, Period: op.period, Consumed: op.snapshot, Release: true,
		}})
		if err == nil {
			g = gs[0]
		}
	} else {
		g, err = l.leaser.Acquire(ctx, consensus.LeaseRequest{
			KeyID: a.key.keyID, Kind: a.key.kind, Want: op.want, Consumed: op.snapshot, TTL: l.cfg.LeaseTTL,
		})
	}
	cancel()
	l.m.leaseCommand(op.release, err)
	now := l.clock()
	a.mu.Lock()
	switch {
	case err != nil:
		l.failOp(a, err, now)
	case op.release:
		a.held = g.Held
		a.pending = max(0, a.pending-op.snapshot)
		a.remaining, a.checkedAt = g.Remaining, now
		a.failedAt, a.failErr = time.Time{}, nil
	default:
		l.applyGrant(a, g, op, now)
	}
	ch := a.op
	a.op, a.releasing = nil, false
	claimed, period := false, a.period
	if claim > 0 && a.usable(now, claim) {
		a.pending += claim
		a.lastUse = now
		a.noteDemand(now, claim)
		claimed = true
	}
	a.mu.Unlock()
	close(ch)
	return claimed, period
}

// failOp keeps everything pending (reporting twice is safe, forgetting is
// not) and remembers the failure for RetryBackoff.
func (l *Limiter) failOp(a *account, err error, now time.Time) {
	if errors.Is(err, consensus.ErrInactive) || errors.Is(err, consensus.ErrNotFound) {
		a.inactive, a.checkedAt = true, now
		return
	}
	if a.failedAt.IsZero() {
		l.log.Warn("lease command failed; serving only what this node holds",
			"key", a.key.keyID, "kind", a.key.kind.String(), "err", err)
	}
	a.failedAt, a.failErr = now, err
}

// applyGrant takes a successful AcquireLease result. A holding larger than
// this node can account for (one left by an earlier run of the node, or a
// grant whose answer was lost) is treated as already used.
func (l *Limiter) applyGrant(a *account, g consensus.LeaseGrant, op leaseOp, now time.Time) {
	a.inactive, a.failedAt, a.failErr = false, time.Time{}, nil
	a.checkedAt = now
	if g.Unlimited {
		a.unlimitedUntil = now.Add(l.cfg.LeaseTTL / 2)
		a.period, a.held, a.pending, a.expires, a.remaining = g.Period, 0, 0, time.Time{}, -1
		return
	}
	var expected int64
	if op.period != "" && g.Period != op.period {
		// The leader is in a new period: the old holding ended with its
		// period (and counts as used). Settle it for the record.
		if a.held > 0 || a.pending > 0 {
			l.queueSettle(consensus.Settlement{
				KeyID: a.key.keyID, Kind: a.key.kind, Period: op.period, Consumed: max(0, a.pending), Release: true,
			})
		}
		a.pending = 0
		expected = g.Granted
	} else {
		a.pending = max(0, a.pending-op.snapshot)
		expected = max(0, op.heldBefore-op.snapshot) + g.Granted
	}
	if g.Held > expected {
		a.pending += g.Held - expected
	}
	a.period, a.held, a.expires, a.remaining = g.Period, g.Held, g.ExpiresAt, g.Remaining
	a.unusable = !now.Before(g.ExpiresAt) && g.Held > 0
	l.checkCrowded(a, now)
}

// checkCrowded looks at the key's ledger in the local replica: does it
// have crowdedHolders other holders?
func (l *Limiter) checkCrowded(a *account, now time.Time) {
	lr, ok := l.leaser.(LedgerReader)
	if !ok {
		return
	}
	period := a.period
	if period == "" {
		period, _ = consensus.Period(a.key.kind, now)
	}
	_, others, ok := lr.LedgerShare(a.key.keyID, a.key.kind, period)
	a.crowded = ok && others >= crowdedHolders
	if a.crowded {
		a.crowdedIn = period
	}
}

// refund gives back an admission that was not used, when nothing has
// reported it yet (a later report then counts it anyway, which is safe).
func (a *account) refund(period string, n int64) {
	a.mu.Lock()
	if a.period == period {
		a.pending = max(0, a.pending-n)
	}
	a.mu.Unlock()
}

// charge adds the difference between a request's real and estimated cost.
func (a *account) charge(period string, delta int64) {
	a.mu.Lock()
	if a.period == period {
		a.pending = max(0, a.pending+delta)
	}
	a.mu.Unlock()
}

// maintain renews active holdings at half their TTL, returns holdings idle
// for a quarter of it (a second when the ledger is crowded) and, in a
// crowded ledger, holdings well above this node's demand; it forgets
// long-idle accounts and settles past periods.
func (l *Limiter) maintain() {
	now := l.clock()
	ttl := l.cfg.LeaseTTL
	l.mu.RLock()
	accts := make([]*account, 0, len(l.accounts))
	for _, a := range l.accounts {
		accts = append(accts, a)
	}
	l.mu.RUnlock()
	for _, a := range accts {
		a.mu.Lock()
		if a.op != nil {
			a.mu.Unlock()
			continue
		}
		live := now.Before(a.expires)
		if live && a.held-a.pending > crowdedKeep {
			// A holding taken before the ledger grew crowded (a slice of
			// the limit) would otherwise drain at this node's own pace
			// while clients of other nodes wait.
			l.checkCrowded(a, now)
		}
		spare := a.crowded && live && a.held-a.pending > max(2*a.demand(), crowdedKeep)
		idleAfter := ttl / 4
		if a.crowded {
			// Others want this limit too: return a spare holding after a
			// second without use rather than a quarter of the TTL.
			idleAfter = min(idleAfter, crowdedIdle)
		}
		idle := now.Sub(a.lastUse) >= idleAfter
		var op *leaseOp
		switch {
		case (idle || spare) && live && (a.held > 0 || a.pending > 0):
			o := l.beginRelease(a)
			op = &o
		case idle && !live:
			// The leader counts an expired holding as used; a later
			// grant's orphan check covers clock skew.
			a.held, a.pending = 0, 0
			if now.Sub(a.lastUse) >= 2*ttl && now.After(a.unlimitedUntil) {
				a.gone = true
				l.mu.Lock()
				if l.accounts[a.key] == a {
					delete(l.accounts, a.key)
				}
				l.mu.Unlock()
			}
		case !idle && live && now.Sub(a.checkedAt) >= ttl/2:
			o := l.beginAcquire(a, 0, now)
			op = &o
		}
		a.mu.Unlock()
		if op != nil {
			l.goOp(a, *op)
		}
	}
	l.settleQueued(now)
}

func (l *Limiter) queueSettle(s consensus.Settlement) {
	l.settleMu.Lock()
	l.settleQ = append(l.settleQ, s)
	l.settleMu.Unlock()
}

// settleQueued sends the queued settlements of past periods as one
// command; on failure they stay queued until their ledger is pruned.
func (l *Limiter) settleQueued(now time.Time) {
	l.settleMu.Lock()
	if l.settling || len(l.settleQ) == 0 {
		l.settleMu.Unlock()
		return
	}
	batch := append([]consensus.Settlement(nil), l.settleQ...)
	l.settling = true
	l.ops.add()
	l.settleMu.Unlock()
	go func() {
		defer l.ops.done()
		ctx, cancel := context.WithTimeout(l.opCtx, l.cfg.LeaseTimeout)
		_, err := l.leaser.Settle(ctx, batch)
		cancel()
		l.m.leaseCommand(true, err)
		l.settleMu.Lock()
		defer l.settleMu.Unlock()
		l.settling = false
		if err == nil {
			l.settleQ = l.settleQ[len(batch):]
			return
		}
		kept := l.settleQ[:0]
		for _, s := range l.settleQ {
			if s.Period >= previousPeriod(s.Kind, now) {
				kept = append(kept, s)
			}
		}
		l.settleQ = kept
	}()
}

// previousPeriod is the period before the one containing now; consensus
// keeps ledgers of the current and the previous period only.
func previousPeriod(kind consensus.LeaseKind, now time.Time) string {
	y, m, d := now.UTC().Date()
	if kind == consensus.LeaseMonthlyBudget {
		p, _ := consensus.Period(kind, time.Date(y, m-1, 1, 0, 0, 0, 0, time.UTC))
		return p
	}
	p, _ := consensus.Period(kind, time.Date(y, m, d-1, 0, 0, 0, 0, time.UTC))
	return p
}

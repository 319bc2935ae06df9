package limits

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/infermesh/infermesh/consensus"
)

type usageKey struct {
	app, model, keyID, worker string
	day                       int32 // UTC day the request finished
}

// usageBatcher sums finished requests by app, model and key and sends the
// sums as one raft entry per batch, one batch at a time, with a sequence
// number that grows per node: a batch retried after an unknown outcome is
// refused as a duplicate instead of counted twice.
type usageBatcher struct {
	l *Limiter

	mu     sync.Mutex
	totals map[usageKey]*consensus.Counters
	count  int           // requests recorded since the last cut
	kick   chan struct{} // asks the flusher to run now

	sendMu  sync.Mutex // one batch at a time
	batch   []consensus.UsageEntry
	seq     uint64 // sequence of batch
	lastSeq uint64
}

func newUsageBatcher(l *Limiter) *usageBatcher {
	return &usageBatcher{l: l, totals: map[usageKey]*consensus.Counters{}, kick: make(chan struct{}, 1)}
}

func (u *usageBatcher) record(k usageKey, c consensus.Counters) {
	u.mu.Lock()
	t := u.totals[k]
	if t == nil {
		t = &consensus.Counters{}
		u.totals[k] = t
	}
	t.Requests += c.Requests
	t.InputTokens += c.InputTokens
	t.OutputTokens += c.OutputTokens
	t.CostMicros += c.CostMicros
	t.Errors += c.Errors
	u.count++
	full := u.count >= u.l.cfg.FlushEntries
	u.mu.Unlock()
	if full {
		select {
		case u.kick <- struct{}{}:
		default:
		}
	}
}

// full reports whether FlushEntries requests wait to be sent.
func (u *usageBatcher) full() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.count >= u.l.cfg.FlushEntries
}

// cut takes the sums recorded so far as the next batch.
func (u *usageBatcher) cut() []consensus.UsageEntry {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.totals) == 0 {
		return nil
	}
	out := make([]consensus.UsageEntry, 0, len(u.totals))
	for k, c := range u.totals {
		out = append(out, consensus.UsageEntry{
			App: k.app, Model: k.model, KeyID: k.keyID, Worker: k.worker, Day: k.day, Requests: c.Requests,
			InputTokens: c.InputTokens, OutputTokens: c.OutputTokens, CostMicros: c.CostMicros, Errors: c.Errors,
		})
	}
	slices.SortFunc(out, func(a, b consensus.UsageEntry) int {
		return cmp.Or(cmp.Compare(a.App, b.App), cmp.Compare(a.Model, b.Model), cmp.Compare(a.KeyID, b.KeyID), cmp.Compare(a.Worker, b.Worker), cmp.Compare(a.Day, b.Day))
	})
	u.totals = map[usageKey]*consensus.Counters{}
	u.count = 0
	return out
}

// nextSeq starts from the clock so a restarted node continues above the
// sequence it used before (consensus refuses anything at or below).
func (u *usageBatcher) nextSeq() uint64 {
	s := max(u.lastSeq+1, uint64(max(0, u.l.clock().UnixNano())))
	u.lastSeq = s
	return s
}

// flushOnce sends the batch kept from a failed attempt, or else a new one.
// It reports whether there was anything to send.
func (u *usageBatcher) flushOnce(ctx context.Context) (bool, error) {
	u.sendMu.Lock()
	defer u.sendMu.Unlock()
	if u.batch == nil {
		u.batch = u.cut()
		if u.batch == nil {
			return false, nil
		}
		u.seq = u.nextSeq()
	}
	ctx, cancel := context.WithTimeout(ctx, u.l.cfg.LeaseTimeout)
	err := u.l.leaser.RecordUsage(ctx, u.seq, u.batch)
	cancel()
	if err == nil || errors.Is(err, consensus.ErrDuplicate) {
		u.l.m.usageBatches.WithLabelValues("ok").Inc()
		u.batch = nil
		return true, nil
	}
	u.l.m.usageBatches.WithLabelValues("error").Inc()
	return true, err
}

// flush sends what was recorded before the call: a batch kept from a
// failed attempt, then the sums so far.
func (u *usageBatcher) flush(ctx context.Context) error {
	for range 2 {
		sent, err := u.flushOnce(ctx)
		if err != nil || !sent {
			return err
		}
	}
	return nil
}

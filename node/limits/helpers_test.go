package limits

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
	"github.com/infermesh/infermesh/node/auth"
)

// noon is a fixed time far from any period boundary.
var noon = time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)

func cluster(t testing.TB, n int, clk consensus.Clock) *consensustest.Cluster {
	t.Helper()
	c := consensustest.New(t, consensustest.Options{Clock: clk})
	c.Start(n)
	if n > 1 {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("n%d", i+1)
		}
		c.WaitServers(ids, nil)
	}
	return c
}

// createKey stores a key through the leader and returns the caller auth
// would establish for it.
func createKey(t testing.TB, c *consensustest.Cluster, id string, lim consensus.Limits) auth.Caller {
	t.Helper()
	_, h := auth.NewKey()
	cmd, err := consensus.CreateKey(consensus.KeySpec{
		ID: id, Hash: consensus.KeyHash(h), Name: id, App: "app-" + id, Limits: lim,
	})
	if err != nil {
		t.Fatal(err)
	}
	c.Apply(c.Leader(), cmd)
	return auth.Caller{
		KeyID: id, Name: id, App: "app-" + id,
		Limits: auth.Limits{RPM: lim.RPM, DailyQuota: lim.DailyQuota, MonthlyBudgetMicros: lim.MonthlyBudgetMicros},
	}
}

func newLimiter(t testing.TB, p *consensustest.Peer, cfg Config, clock func() time.Time) (*Limiter, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	l := New(cfg, NewConsensusLeaser(p.Node), nil, reg, clock)
	t.Cleanup(l.Close)
	return l, reg
}

func chat(c auth.Caller) Request {
	return Request{Caller: c, ClientAddr: "192.0.2.10", Class: auth.ClassChat, Counted: true, Model: "m"}
}

// admit admits r and finishes it at once with a 200.
func admit(l *Limiter, r Request) *auth.Denial {
	t, d := l.Admit(context.Background(), r)
	if d == nil {
		t.Done(Usage{PromptTokens: 3, CompletionTokens: 5, Status: 200})
	}
	return d
}

func ledger(t testing.TB, p *consensustest.Peer, keyID string, kind consensus.LeaseKind, period string) consensus.LeaseLedger {
	t.Helper()
	l, _ := p.Node.State().Ledger(keyID, kind, period)
	return l
}

func held(l consensus.LeaseLedger) int64 {
	var sum int64
	for _, h := range l.Holds {
		sum += h.Amount
	}
	return sum
}

// waitIdle waits until the limiter has no lease command in flight.
func waitIdle(t testing.TB, l *Limiter) {
	t.Helper()
	select {
	case <-l.ops.idle():
	case <-time.After(consensustest.WaitLimit):
		t.Fatal("lease commands still in flight")
	}
}

func counter(reg *prometheus.Registry, name string, labels map[string]string) float64 {
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
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func drain(t testing.TB, l *Limiter) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), consensustest.WaitLimit)
	defer cancel()
	if err := l.Drain(ctx); err != nil {
		t.Fatalf("drain: %v", err)
	}
}

// createCaller is the caller of a key created with createKey and no limits.
func createCaller(id string) auth.Caller { return auth.Caller{KeyID: id, Name: id, App: "app-" + id} }

// applies counts the commands peer p has applied through raft (its
// consensus apply latency histogram's samples): raft entries written,
// without raft's own configuration and barrier entries.
func applies(p *consensustest.Peer) uint64 {
	mfs, _ := p.Registry.Gather()
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == "infermesh_consensus_apply_seconds" {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

package limits

import (
	"fmt"
	"testing"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
	"github.com/infermesh/infermesh/node/apierr"
)

// TestCrowdedLedgerSlicesByDemandAndRefusesRetryably: once crowdedHolders
// other nodes hold part of a key's quota, a node that sees the key once
// asks for what it needs (not a slice of the limit), and a node refused
// while others still hold the rest answers 503 with Retry-After, not a
// final 429.
func TestCrowdedLedgerSlicesByDemandAndRefusesRetryably(t *testing.T) {
	const n = crowdedHolders + 2
	c := consensustest.New(t, consensustest.Options{})
	c.Start(n)
	c.WaitServers([]string{"n1", "n2", "n3"}, []string{"n4", "n5", "n6"}) // three voters, the rest non-voters
	caller := createKey(t, c, "key_crowd", consensus.Limits{DailyQuota: 64})
	c.Converged()
	var lims []*Limiter
	for i := range n {
		l, _ := newLimiter(t, c.Peer(fmt.Sprintf("n%d", i+1)), Config{}, nil)
		lims = append(lims, l)
	}
	for _, l := range lims[:n-1] {
		if d := admit(l, chat(caller)); d != nil {
			t.Fatalf("first request: %v", d)
		}
		waitIdle(t, l)
	}
	c.Converged()
	last := lims[n-1]
	if d := admit(last, chat(caller)); d != nil {
		t.Fatalf("first request on the last node: %v", d)
	}
	waitIdle(t, last)
	c.Converged()
	period, _ := consensus.Period(consensus.LeaseDailyRequests, time.Now())
	lg := ledger(t, c.Leader(), "key_crowd", consensus.LeaseDailyRequests, period)
	self := c.Peer(fmt.Sprintf("n%d", n)).ID
	for _, h := range lg.Holds {
		if h.NodeID == self && h.Amount != 1 {
			t.Fatalf("the last node holds %d after one request in a crowded ledger, want 1: %+v", h.Amount, lg)
		}
	}
	// Spend on the last node until it is refused: others still hold
	// their slices, so the refusal must be retryable.
	for i := 0; ; i++ {
		d := admit(last, chat(caller))
		if d == nil {
			if i > 64 {
				t.Fatal("more admitted than the quota")
			}
			continue
		}
		if d.Status != 503 || d.Code != apierr.CodeQuotaUnavailable || d.RetryAfter < 1 {
			t.Fatalf("refusal with others holding: %+v, want 503 %s", d, apierr.CodeQuotaUnavailable)
		}
		break
	}
}

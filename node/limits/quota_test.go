package limits

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
	"github.com/infermesh/infermesh/node/apierr"
)

// TestDailyQuotaExactAcrossThreeNodes: three limiters on three nodes share
// one key's daily quota of N under concurrent load; exactly N requests are
// admitted, and after Drain the ledger says N used and nothing held.
func TestDailyQuotaExactAcrossThreeNodes(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := cluster(t, 3, clk)
	const N = 300
	caller := createKey(t, c, "key_q", consensus.Limits{DailyQuota: N})
	c.Converged()
	var lims []*Limiter
	for _, id := range []string{"n1", "n2", "n3"} {
		l, _ := newLimiter(t, c.Peer(id), Config{}, clk.Now)
		lims = append(lims, l)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 12; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				got := 0
				for i := range lims {
					d := admit(lims[(i+w)%len(lims)], chat(caller))
					if d == nil {
						admitted.Add(1)
						got++
						continue
					}
					if d.Status != 429 || d.Code != apierr.CodeDailyQuota || d.RetryAfter != 12*3600 {
						t.Errorf("refusal %+v, want 429 %s with Retry-After until midnight", d, apierr.CodeDailyQuota)
						return
					}
				}
				if got == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != N {
		t.Fatalf("admitted %d requests, want exactly %d", got, N)
	}
	for _, l := range lims {
		drain(t, l)
	}
	c.Converged()
	period, _ := consensus.Period(consensus.LeaseDailyRequests, noon)
	lg := ledger(t, c.Peer("n1"), "key_q", consensus.LeaseDailyRequests, period)
	if lg.Used != N || lg.Expired != 0 || len(lg.Holds) != 0 {
		t.Fatalf("ledger after drain = %+v, want %d used, nothing expired or held", lg, N)
	}
	rows := c.Peer("n2").Node.State().Usage(consensus.ByKey)
	if len(rows) != 1 || rows[0].Group != "key_q" || rows[0].Requests != N || rows[0].InputTokens != 3*N {
		t.Fatalf("usage by key = %+v, want %d requests of key_q", rows, N)
	}
}

// TestDailyQuotaWithLeaderKilled: the same load with the leader's node
// killed mid-run. Its limiter serves at most what it holds; the others go
// on under a new leader; no more than N are admitted in all.
func TestDailyQuotaWithLeaderKilled(t *testing.T) {
	c := cluster(t, 3, nil)
	const N = 300
	caller := createKey(t, c, "key_k", consensus.Limits{DailyQuota: N})
	c.Converged()
	leader := c.Leader().ID
	ids := []string{"n1", "n2", "n3"}
	var lims []*Limiter
	victim := -1
	for i, id := range ids {
		l, _ := newLimiter(t, c.Peer(id), Config{RetryBackoff: 100 * time.Millisecond, LeaseTimeout: 2 * time.Second}, nil)
		lims = append(lims, l)
		if id == leader {
			victim = i
		}
	}
	var (
		admitted    atomic.Int64
		killed      atomic.Bool
		quotaSeen   atomic.Bool
		unavailable atomic.Int64
		wg          sync.WaitGroup
	)
	deadline := time.Now().Add(consensustest.WaitLimit)
	for w := 0; w < 12; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				got, survivorsRefused := 0, 0
				for i := range lims {
					k := (i + w) % len(lims)
					d := admit(lims[k], chat(caller))
					switch {
					case d == nil:
						admitted.Add(1)
						got++
					case d.Status == 429 && d.Code == apierr.CodeDailyQuota:
						if k != victim {
							survivorsRefused++
							if killed.Load() {
								quotaSeen.Store(true)
							}
						}
					case d.Status == 503 && d.Code == apierr.CodeQuotaUnavailable && d.RetryAfter > 0:
						if !strings.Contains(d.Message, "leader") && !strings.Contains(d.Message, "retry") {
							t.Errorf("503 without a reason: %q", d.Message)
						}
						unavailable.Add(1)
						time.Sleep(20 * time.Millisecond) // a client honouring Retry-After, shortened
					default:
						t.Errorf("unexpected refusal %+v", d)
						return
					}
				}
				if got == 0 && survivorsRefused == len(lims)-1 && killed.Load() {
					return
				}
			}
			t.Errorf("worker still running at the liveness bound")
		}()
	}
	for admitted.Load() < N/3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	c.Kill(leader)
	killed.Store(true)
	wg.Wait()
	if got := admitted.Load(); got > N {
		t.Fatalf("admitted %d requests with a quota of %d", got, N)
	}
	if !quotaSeen.Load() {
		t.Fatal("the survivors never reached the quota after the kill")
	}
	t.Logf("admitted %d of %d; %d answers 503 while the leader was gone", admitted.Load(), N, unavailable.Load())
	nl := c.Leader()
	period, _ := consensus.Period(consensus.LeaseDailyRequests, time.Now())
	lg := ledger(t, nl, "key_k", consensus.LeaseDailyRequests, period)
	if lg.Used+held(lg) > N {
		t.Fatalf("ledger %+v exceeds the quota", lg)
	}
}

// TestCutOffNodeServesItsLeaseThenSaysWhy: a node that loses the majority
// admits exactly what it holds, then refuses with 503 naming the cause;
// what it admitted meanwhile is reported once the cluster is back.
func TestCutOffNodeServesItsLeaseThenSaysWhy(t *testing.T) {
	c := cluster(t, 3, nil)
	caller := createKey(t, c, "key_c", consensus.Limits{DailyQuota: 1000})
	c.Converged()
	p := c.Leader()
	l, _ := newLimiter(t, p, Config{LeaseTimeout: time.Second, RetryBackoff: time.Hour}, nil)
	if d := admit(l, chat(caller)); d != nil {
		t.Fatalf("first request: %v", d)
	}
	waitIdle(t, l)
	period, _ := consensus.Period(consensus.LeaseDailyRequests, time.Now())
	hold := held(ledger(t, p, "key_c", consensus.LeaseDailyRequests, period))
	if hold != 1000/DefaultSliceFraction {
		t.Fatalf("holding %d, want a slice of %d", hold, 1000/DefaultSliceFraction)
	}
	var stopped []string
	for _, f := range c.Followers() {
		stopped = append(stopped, f.ID)
		c.Kill(f.ID)
	}
	// Once it has stepped down nothing it sends reaches a log, so the
	// count below is exact.
	c.WaitFor("the cut-off leader to step down", func() bool { return !p.Node.IsLeader() })
	n := int64(1)
	for {
		d := admit(l, chat(caller))
		if d == nil {
			n++
			continue
		}
		if d.Status != 503 || d.Code != apierr.CodeQuotaUnavailable || d.RetryAfter < 1 || !strings.Contains(d.Message, "leader could not be reached") {
			t.Fatalf("refusal %+v, want 503 %s saying the leader is unreachable", d, apierr.CodeQuotaUnavailable)
		}
		break
	}
	if n != hold {
		t.Fatalf("admitted %d while cut off, want exactly the holding of %d", n, hold)
	}
	for _, id := range stopped {
		c.StartPeer(id, true)
	}
	c.Leader()
	drain(t, l)
	c.Converged()
	lg := ledger(t, p, "key_c", consensus.LeaseDailyRequests, period)
	if lg.Used != hold || len(lg.Holds) != 0 {
		t.Fatalf("ledger after the cluster came back = %+v, want %d used and nothing held", lg, hold)
	}
	rows := p.Node.State().Usage(consensus.ByKey)
	if len(rows) != 1 || rows[0].Requests != hold {
		t.Fatalf("usage = %+v, want %d requests, counted once", rows, hold)
	}
}

// TestMidnightRollover: the quota refuses until midnight UTC, with
// Retry-After counting down to it, and starts afresh after.
func TestMidnightRollover(t *testing.T) {
	clk := consensustest.NewManualClock(time.Date(2026, 3, 14, 23, 59, 0, 0, time.UTC))
	c := cluster(t, 1, clk)
	caller := createKey(t, c, "key_m", consensus.Limits{DailyQuota: 5})
	l, _ := newLimiter(t, c.Peer("n1"), Config{}, clk.Now)
	for i := 0; i < 5; i++ {
		if d := admit(l, chat(caller)); d != nil {
			t.Fatalf("request %d: %v", i, d)
		}
	}
	d := admit(l, chat(caller))
	if d == nil || d.Status != 429 || d.Code != apierr.CodeDailyQuota || d.RetryAfter != 60 || !strings.Contains(d.Message, "midnight UTC") {
		t.Fatalf("sixth request: %+v, want 429 %s Retry-After 60", d, apierr.CodeDailyQuota)
	}
	clk.Advance(61 * time.Second)
	for i := 0; i < 5; i++ {
		if d := admit(l, chat(caller)); d != nil {
			t.Fatalf("new day, request %d: %v", i, d)
		}
	}
	d = admit(l, chat(caller))
	if d == nil || d.Code != apierr.CodeDailyQuota || d.RetryAfter != 24*3600-1 {
		t.Fatalf("new day, sixth request: %+v, want 429 Retry-After %d", d, 24*3600-1)
	}
	// The old day's holding is settled in the background.
	l.maintain()
	waitIdle(t, l)
	old := ledger(t, c.Peer("n1"), "key_m", consensus.LeaseDailyRequests, "2026-03-14")
	if old.Used != 5 || len(old.Holds) != 0 {
		t.Fatalf("old day's ledger = %+v, want 5 used, nothing held", old)
	}
	drain(t, l)
	cur := ledger(t, c.Peer("n1"), "key_m", consensus.LeaseDailyRequests, "2026-03-15")
	if cur.Used != 5 || len(cur.Holds) != 0 {
		t.Fatalf("new day's ledger = %+v, want 5 used", cur)
	}
}

// TestMonthlyBudget: estimated cost is held at admission, the real cost
// charged at Done, and refusals last until the 1st of next month.
func TestMonthlyBudget(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := cluster(t, 1, clk)
	prices := StaticPrices{
		"flat":   {RequestMicros: 1000},
		"tokens": {InputPerMillionMicros: 1_000_000, OutputPerMillionMicros: 2_000_000},
	}
	l, _ := newLimiter(t, c.Peer("n1"), Config{Prices: prices}, clk.Now)
	untilApril := int(time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC).Sub(noon).Seconds())

	flat := createKey(t, c, "key_flat", consensus.Limits{MonthlyBudgetMicros: 10_000})
	r := chat(flat)
	r.Model = "flat"
	for i := 0; i < 10; i++ {
		if d := admit(l, r); d != nil {
			t.Fatalf("flat request %d: %v", i, d)
		}
	}
	d := admit(l, r)
	if d == nil || d.Status != 429 || d.Code != apierr.CodeMonthlyBudget || d.RetryAfter != untilApril {
		t.Fatalf("eleventh flat request: %+v, want 429 %s Retry-After %d", d, apierr.CodeMonthlyBudget, untilApril)
	}
	// An unpriced model costs nothing and passes.
	r.Model = "free"
	if d := admit(l, r); d != nil {
		t.Fatalf("unpriced model: %v", d)
	}

	tok := createKey(t, c, "key_tok", consensus.Limits{MonthlyBudgetMicros: 1000})
	r = chat(tok)
	r.Model, r.InputTokens, r.MaxOutputTokens = "tokens", 100, 100 // estimate 300
	tk, d := l.Admit(context.Background(), r)
	if d != nil {
		t.Fatalf("token-priced request: %v", d)
	}
	tk.Done(Usage{PromptTokens: 100, CompletionTokens: 400, Status: 200}) // cost 900
	if d := admit(l, r); d == nil || d.Code != apierr.CodeMonthlyBudget {
		t.Fatalf("estimate 300 with 100 left: %v, want %s", d, apierr.CodeMonthlyBudget)
	}
	r.InputTokens, r.MaxOutputTokens = 50, 25 // estimate 100
	tk, d = l.Admit(context.Background(), r)
	if d != nil {
		t.Fatalf("estimate 100 with 100 left: %v", d)
	}
	tk.Done(Usage{PromptTokens: 50, CompletionTokens: 25, Status: 200})
	r.InputTokens, r.MaxOutputTokens = 1, 1
	if d := admit(l, r); d == nil || d.Code != apierr.CodeMonthlyBudget {
		t.Fatalf("budget spent: %v, want %s", d, apierr.CodeMonthlyBudget)
	}
	drain(t, l)
	lg := ledger(t, c.Peer("n1"), "key_tok", consensus.LeaseMonthlyBudget, "2026-03")
	if lg.Used != 1000 || len(lg.Holds) != 0 {
		t.Fatalf("budget ledger = %+v, want 1000 used (900 + 100)", lg)
	}
	for _, row := range c.Peer("n1").Node.State().Usage(consensus.ByKey) {
		if row.Group == "key_tok" && row.CostMicros != 1000 {
			t.Fatalf("usage cost of key_tok = %d, want 1000", row.CostMicros)
		}
	}
}

// TestHoldingsOfAnEarlierRunCountAsUsed: a limiter that crashed left a
// holding with unreported admissions; the next limiter on the same node
// must not admit against it again.
func TestHoldingsOfAnEarlierRunCountAsUsed(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := cluster(t, 1, clk)
	p := c.Peer("n1")
	const N = 160
	caller := createKey(t, c, "key_o", consensus.Limits{DailyQuota: N})
	first, _ := newLimiter(t, p, Config{}, clk.Now)
	for i := 0; i < 7; i++ {
		if d := admit(first, chat(caller)); d != nil {
			t.Fatalf("first run, request %d: %v", i, d)
		}
	}
	waitIdle(t, first)
	first.Close() // a crash: nothing reported or returned
	period, _ := consensus.Period(consensus.LeaseDailyRequests, noon)
	lg := ledger(t, p, "key_o", consensus.LeaseDailyRequests, period)
	if held(lg) == 0 {
		t.Fatalf("the first run left no holding: %+v", lg)
	}
	second, _ := newLimiter(t, p, Config{}, clk.Now)
	var n int64
	for admit(second, chat(caller)) == nil {
		n++
	}
	if want := N - lg.Used - held(lg); n != want {
		t.Fatalf("second run admitted %d, want %d (quota %d − used %d − the earlier holding %d)", n, want, N, lg.Used, held(lg))
	}
	drain(t, second)
	after := ledger(t, p, "key_o", consensus.LeaseDailyRequests, period)
	if after.Used != N || len(after.Holds) != 0 {
		t.Fatalf("ledger after drain = %+v, want all %d used", after, N)
	}
}

// TestDrainReturnsHoldingsOfAnEarlierRun: Drain settles holdings the
// limiter does not know, as used.
func TestDrainReturnsHoldingsOfAnEarlierRun(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := cluster(t, 1, clk)
	p := c.Peer("n1")
	caller := createKey(t, c, "key_d", consensus.Limits{DailyQuota: 1600})
	first, _ := newLimiter(t, p, Config{}, clk.Now)
	for i := 0; i < 3; i++ {
		admit(first, chat(caller))
	}
	waitIdle(t, first)
	first.Close()
	period, _ := consensus.Period(consensus.LeaseDailyRequests, noon)
	before := ledger(t, p, "key_d", consensus.LeaseDailyRequests, period)
	second, _ := newLimiter(t, p, Config{}, clk.Now)
	drain(t, second)
	after := ledger(t, p, "key_d", consensus.LeaseDailyRequests, period)
	if len(after.Holds) != 0 || after.Used != before.Used+held(before) {
		t.Fatalf("ledger %+v after drain, from %+v: want the earlier holding counted as used", after, before)
	}
}

// TestRenewalAndIdleReturn: the holding is topped up in the background
// before it runs dry, and returned when the key goes idle.
func TestRenewalAndIdleReturn(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := cluster(t, 1, clk)
	p := c.Peer("n1")
	caller := createKey(t, c, "key_r", consensus.Limits{DailyQuota: 1600}) // slices of 100
	l, reg := newLimiter(t, p, Config{}, clk.Now)
	for i := 0; i < 90; i++ {
		if d := admit(l, chat(caller)); d != nil {
			t.Fatalf("request %d: %v", i, d)
		}
	}
	waitIdle(t, l)
	period, _ := consensus.Period(consensus.LeaseDailyRequests, noon)
	lg := ledger(t, p, "key_r", consensus.LeaseDailyRequests, period)
	if lg.Used+held(lg) < 100+25 {
		t.Fatalf("ledger %+v: the holding was not renewed before running low", lg)
	}
	if acq := counter(reg, "infermesh_limits_lease_commands_total", map[string]string{"command": "acquire", "result": "ok"}); acq < 2 {
		t.Fatalf("%v acquire commands, want a renewal after the first", acq)
	}
	clk.Advance(consensus.DefaultLeaseTTL / 4)
	l.maintain()
	waitIdle(t, l)
	lg = ledger(t, p, "key_r", consensus.LeaseDailyRequests, period)
	if lg.Used != 90 || len(lg.Holds) != 0 {
		t.Fatalf("ledger after going idle = %+v, want 90 used and the rest returned", lg)
	}
	// After the return, the next request takes a fresh slice.
	if d := admit(l, chat(caller)); d != nil {
		t.Fatalf("after the return: %v", d)
	}
}

// TestRevokedKeyIsRefusedByTheLeader: a key revoked on the leader but not
// yet on this replica gets 401 once the holding is used.
func TestRevokedKeyIsRefusedByTheLeader(t *testing.T) {
	clk := consensustest.NewManualClock(noon)
	c := cluster(t, 1, clk)
	caller := createKey(t, c, "key_v", consensus.Limits{DailyQuota: 10})
	l, _ := newLimiter(t, c.Peer("n1"), Config{}, clk.Now)
	cmd, _ := consensus.RevokeKey("key_v")
	c.Apply(c.Leader(), cmd)
	d := admit(l, chat(caller))
	if d == nil || d.Status != 401 || d.Code != "invalid_api_key" {
		t.Fatalf("revoked key: %+v, want 401 invalid_api_key", d)
	}
}

func TestDrainRefusesNewWork(t *testing.T) {
	c := cluster(t, 1, nil)
	caller := createKey(t, c, "key_x", consensus.Limits{})
	l, _ := newLimiter(t, c.Peer("n1"), Config{}, nil)
	drain(t, l)
	d := admit(l, chat(caller))
	if d == nil || d.Status != 503 || d.Code != apierr.CodeDraining || d.RetryAfter < 1 {
		t.Fatalf("after drain: %+v, want 503 %s", d, apierr.CodeDraining)
	}
}

func ExampleParsePriority() {
	for _, h := range []string{"", "background", "MAINTENANCE", "urgent"} {
		fmt.Println(ParsePriority(h))
	}
	// Output:
	// interactive
	// background
	// maintenance
	// interactive
}

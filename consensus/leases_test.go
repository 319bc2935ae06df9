package consensus

import (
	"math/rand/v2"
	"testing"
	"time"

	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

func quotaKey(m *machine, id string, daily, budget int64) {
	m.t.Helper()
	m.ok(must(CreateKey(KeySpec{ID: id, Hash: hashKey("sk-" + id), Name: id, Limits: Limits{DailyQuota: daily, MonthlyBudgetMicros: budget}})), t0)
}

func acquire(m *machine, node, key string, kind LeaseKind, want, consumed int64, ttl time.Duration, at time.Time) *pb.ApplyResult {
	m.t.Helper()
	return m.apply(must(AcquireLease(LeaseRequest{NodeID: node, KeyID: key, Kind: kind, Want: want, Consumed: consumed, TTL: ttl})), at)
}

func TestLeaseGrantSettleRelease(t *testing.T) {
	m := newMachine(t)
	quotaKey(m, "k", 10, 0)
	step := func(res *pb.ApplyResult, granted, held, remaining int64) {
		t.Helper()
		g := res.GetLease()
		if res.GetRejectionCode() != "" || g.GetGranted() != granted || g.GetHeld() != held || g.GetRemaining() != remaining || g.GetLimit() != 10 || g.GetPeriod() != "2026-11-22" {
			t.Fatalf("got %v (%s), want granted %d held %d remaining %d", g, res.GetRejectionCode(), granted, held, remaining)
		}
	}
	step(acquire(m, "n1", "k", LeaseDailyRequests, 4, 0, time.Hour, t0), 4, 4, 6)
	step(acquire(m, "n2", "k", LeaseDailyRequests, 10, 0, time.Hour, t0), 6, 6, 0)
	step(acquire(m, "n3", "k", LeaseDailyRequests, 1, 0, time.Hour, t0), 0, 0, 0)
	// n1 used everything it held: settled first, nothing left to grant.
	step(acquire(m, "n1", "k", LeaseDailyRequests, 2, 4, time.Hour, t0), 0, 0, 0)

	res := m.ok(must(SettleLeases("n2", []Settlement{{KeyID: "k", Kind: LeaseDailyRequests, Period: "2026-11-22", Consumed: 2, Release: true}})), t0)
	if s := res.GetSettled(); len(s) != 1 || s[0].GetHeld() != 0 || s[0].GetRemaining() != 4 {
		t.Fatalf("settle: %v", s)
	}
	step(acquire(m, "n3", "k", LeaseDailyRequests, 5, 0, time.Hour, t0), 4, 4, 0)
	l, ok := m.view().Ledger("k", LeaseDailyRequests, "2026-11-22")
	if !ok || l.Used != 6 || len(l.Holds) != 1 || l.Holds[0].NodeID != "n3" || l.Holds[0].Amount != 4 || !l.Holds[0].ExpiresAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("ledger %+v", l)
	}
	if h := m.view().Holdings("n3"); len(h) != 1 || h[0].Held != 4 || h[0].KeyID != "k" {
		t.Fatalf("holdings of n3: %+v", h)
	}
	// Over-reporting cannot push used past the holding.
	m.ok(must(SettleLeases("n3", []Settlement{{KeyID: "k", Kind: LeaseDailyRequests, Period: "2026-11-22", Consumed: 99}})), t0)
	if l, _ := m.view().Ledger("k", LeaseDailyRequests, "2026-11-22"); l.Used != 10 || len(l.Holds) != 0 {
		t.Fatalf("ledger after over-report %+v", l)
	}
}

func TestLeaseKeyStates(t *testing.T) {
	m := newMachine(t)
	quotaKey(m, "limited", 10, 0)
	m.ok(must(CreateKey(KeySpec{ID: "free", Hash: hashKey("sk-free"), Name: "free"})), t0)
	res := acquire(m, "n1", "free", LeaseDailyRequests, 7, 0, 0, t0)
	if g := res.GetLease(); !g.GetUnlimited() || g.GetGranted() != 7 {
		t.Fatalf("unlimited key: %v", g)
	}
	if _, ok := m.view().Ledger("free", LeaseDailyRequests, "2026-11-22"); ok {
		t.Fatal("an unlimited key got a ledger")
	}
	if code := acquire(m, "n1", "nope", LeaseDailyRequests, 1, 0, 0, t0).GetRejectionCode(); code != codeNotFound {
		t.Fatalf("missing key: %q", code)
	}
	acquire(m, "n1", "limited", LeaseDailyRequests, 3, 0, 0, t0)
	m.ok(must(RevokeKey("limited")), t0)
	if code := acquire(m, "n1", "limited", LeaseDailyRequests, 1, 0, 0, t0).GetRejectionCode(); code != codeInactive {
		t.Fatalf("revoked key: %q", code)
	}
	if len(m.view().Ledgers()) != 0 {
		t.Fatal("revocation kept the key's ledgers")
	}
	exp := t0.Add(time.Minute)
	m.ok(must(CreateKey(KeySpec{ID: "short", Hash: hashKey("sk-short"), Name: "short", Limits: Limits{DailyQuota: 5}, ExpiresAt: exp})), t0)
	if code := acquire(m, "n1", "short", LeaseDailyRequests, 1, 0, 0, exp).GetRejectionCode(); code != codeInactive {
		t.Fatalf("expired key: %q", code)
	}
}

func TestLeaseExpiryCountsAsUsed(t *testing.T) {
	m := newMachine(t)
	quotaKey(m, "k", 10, 0)
	acquire(m, "n1", "k", LeaseDailyRequests, 6, 0, time.Minute, t0)
	// n1 went silent. Once its holding expired, it counts as fully used:
	// n1 may have admitted all of it, so only the rest is granted.
	res := acquire(m, "n2", "k", LeaseDailyRequests, 10, 0, time.Hour, t0.Add(time.Minute))
	if g := res.GetLease(); g.GetGranted() != 4 || g.GetRemaining() != 0 {
		t.Fatalf("grant after expiry: %v", g)
	}
	l, _ := m.view().Ledger("k", LeaseDailyRequests, "2026-11-22")
	if l.Used != 6 || l.Expired != 6 {
		t.Fatalf("ledger %+v", l)
	}
	// n1's late report cannot count its requests twice.
	m.ok(must(SettleLeases("n1", []Settlement{{KeyID: "k", Kind: LeaseDailyRequests, Period: "2026-11-22", Consumed: 6}})), t0.Add(2*time.Minute))
	if l, _ := m.view().Ledger("k", LeaseDailyRequests, "2026-11-22"); l.Used != 6 {
		t.Fatalf("late settle changed used: %+v", l)
	}
	// Renewal extends the whole holding.
	res = acquire(m, "n2", "k", LeaseDailyRequests, 1, 0, time.Hour, t0.Add(90*time.Second))
	if g := res.GetLease(); g.GetHeld() != 4 || g.GetExpiresUnixNano() != t0.Add(90*time.Second+time.Hour).UnixNano() {
		t.Fatalf("renewal: %v", g)
	}
}

func TestLeasePeriods(t *testing.T) {
	m := newMachine(t)
	quotaKey(m, "k", 10, 1000)
	late := time.Date(2026, 11, 22, 23, 59, 30, 0, time.UTC)
	res := acquire(m, "n1", "k", LeaseDailyRequests, 10, 0, time.Hour, late)
	midnight := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	if g := res.GetLease(); g.GetGranted() != 10 || g.GetExpiresUnixNano() != midnight.UnixNano() {
		t.Fatalf("the holding must end at midnight UTC: %v", g)
	}
	res = acquire(m, "n2", "k", LeaseDailyRequests, 10, 0, time.Hour, midnight.Add(10*time.Second))
	if g := res.GetLease(); g.GetPeriod() != "2026-11-23" || g.GetGranted() != 10 {
		t.Fatalf("new day: %v", g)
	}
	// Yesterday's ledger stays for late settlements...
	if _, ok := m.view().Ledger("k", LeaseDailyRequests, "2026-11-22"); !ok {
		t.Fatal("previous day's ledger pruned too early")
	}
	// ...and goes two days later.
	acquire(m, "n1", "k", LeaseDailyRequests, 1, 0, time.Hour, midnight.Add(25*time.Hour))
	if _, ok := m.view().Ledger("k", LeaseDailyRequests, "2026-11-22"); ok {
		t.Fatal("old ledger kept")
	}

	res = acquire(m, "n1", "k", LeaseMonthlyBudget, 600, 0, 0, late)
	if g := res.GetLease(); g.GetPeriod() != "2026-11" || g.GetGranted() != 600 || g.GetLimit() != 1000 ||
		g.GetExpiresUnixNano() != late.Add(DefaultLeaseTTL).UnixNano() {
		t.Fatalf("budget lease: %v", g)
	}
	res = acquire(m, "n2", "k", LeaseMonthlyBudget, 600, 0, 0, late)
	if g := res.GetLease(); g.GetGranted() != 400 {
		t.Fatalf("budget lease beyond the budget: %v", g)
	}
	dec := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if p, end := Period(LeaseMonthlyBudget, dec.Add(-time.Nanosecond)); p != "2026-11" || !end.Equal(dec) {
		t.Fatalf("Period = %s, %v", p, end)
	}
	if p, _ := Period(LeaseMonthlyBudget, dec); p != "2026-12" {
		t.Fatalf("Period(dec) = %s", p)
	}
	if p := previousPeriod(LeaseMonthlyBudget, time.Date(2027, 1, 31, 0, 0, 0, 0, time.UTC)); p != "2026-12" {
		t.Fatalf("previous month of 2027-01-31 = %s", p)
	}
}

// simNode is a node following the lease protocol: it admits only what its
// last known holding covers, before the holding's expiry, and reports what
// it admitted. Results can be lost (the command applied, the node never
// heard), as in a partition.
type simNode struct {
	id      string
	held    int64
	pending int64
	period  string
	expires time.Time
}

func TestLeaseInvariantUnderRandomSequences(t *testing.T) {
	const limit = 40
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		m := newMachine(t)
		quotaKey(m, "k", limit, 0)
		nodes := []*simNode{{id: "n1"}, {id: "n2"}, {id: "n3"}}
		admitted := map[string]int64{} // by period
		now := time.Date(2026, 11, 22, 22, 0, 0, 0, time.UTC)
		for step := 0; step < 400; step++ {
			now = now.Add(time.Duration(rng.IntN(int(3 * time.Minute))))
			period, _ := Period(LeaseDailyRequests, now)
			n := nodes[rng.IntN(len(nodes))]
			lost := rng.IntN(6) == 0
			switch rng.IntN(4) {
			case 0, 1: // admit requests
				for range rng.IntN(5) {
					if n.period == period && now.Before(n.expires) && n.held-n.pending > 0 {
						n.pending++
						admitted[period]++
					}
				}
			case 2: // renew: settle what was admitted, ask for more
				if n.period != "" && n.period != period {
					m.ok(must(SettleLeases(n.id, []Settlement{{KeyID: "k", Kind: LeaseDailyRequests, Period: n.period, Consumed: n.pending}})), now)
					*n = simNode{id: n.id}
				}
				res := acquire(m, n.id, "k", LeaseDailyRequests, int64(1+rng.IntN(15)), n.pending, time.Duration(1+rng.IntN(20))*time.Minute, now)
				if g := res.GetLease(); !lost && res.GetRejectionCode() == "" {
					n.held, n.pending, n.period, n.expires = g.GetHeld(), 0, g.GetPeriod(), timeFromNanos(g.GetExpiresUnixNano())
				}
			case 3: // settle, sometimes giving the rest back
				if n.period == "" {
					continue
				}
				release := rng.IntN(2) == 0
				res := m.ok(must(SettleLeases(n.id, []Settlement{{KeyID: "k", Kind: LeaseDailyRequests, Period: n.period, Consumed: n.pending, Release: release}})), now)
				if !lost {
					n.held, n.pending = res.GetSettled()[0].GetHeld(), 0
					if release {
						*n = simNode{id: n.id}
					}
				}
			}
			for _, l := range m.view().Ledgers() {
				total := l.Used
				for _, h := range l.Holds {
					total += h.Amount
				}
				if total > limit {
					t.Fatalf("seed %d step %d: ledger %s used %d + held %d exceeds the limit %d", seed, step, l.Period, l.Used, total-l.Used, limit)
				}
			}
			for p, a := range admitted {
				if a > limit {
					t.Fatalf("seed %d step %d: %d requests admitted in %s, limit %d", seed, step, a, p, limit)
				}
			}
		}
		if len(admitted) == 0 {
			t.Fatalf("seed %d: nothing admitted; the test would prove little", seed)
		}
	}
}

// TestLeaseExactness: nodes that renew before expiry and report faithfully
// get exactly the whole quota between them, no more and no less.
func TestLeaseExactness(t *testing.T) {
	for _, limit := range []int64{1, 7, 50, 333} {
		m := newMachine(t)
		quotaKey(m, "k", limit, 0)
		nodes := []*simNode{{id: "a"}, {id: "b"}, {id: "c"}}
		var admitted int64
		for round := 0; round < 1000; round++ {
			progress := false
			for i, n := range nodes {
				res := acquire(m, n.id, "k", LeaseDailyRequests, int64(1+i*3), n.pending, time.Hour, t0)
				n.held, n.pending = res.GetLease().GetHeld(), 0
				for n.held-n.pending > 0 {
					n.pending++
					admitted++
					progress = true
				}
			}
			if !progress {
				break
			}
		}
		if admitted != limit {
			t.Errorf("limit %d: %d admitted", limit, admitted)
		}
		l, _ := m.view().Ledger("k", LeaseDailyRequests, "2026-11-22")
		if l.Used != limit {
			t.Errorf("limit %d: ledger %+v", limit, l)
		}
	}
}

func TestLeaseRejectsMalformed(t *testing.T) {
	m := newMachine(t)
	quotaKey(m, "k", 5, 0)
	bad := []*pb.LeaseAcquire{
		{KeyId: "k", Kind: LeaseDailyRequests, Want: 1},
		{NodeId: "n", KeyId: "k", Kind: pb.LeaseKind(9), Want: 1},
		{NodeId: "n", KeyId: "k", Kind: LeaseDailyRequests, Want: -1},
	}
	for i, a := range bad {
		cmd := must(newCommand(pb.CommandType_COMMAND_TYPE_LEASE_ACQUIRE, a))
		if code := m.apply(cmd, t0).GetRejectionCode(); code != codeInvalid {
			t.Errorf("case %d: %q, want invalid", i, code)
		}
	}
	before := m.view().Digest()
	// One bad settlement refuses the whole command, before any change.
	cmd := must(newCommand(pb.CommandType_COMMAND_TYPE_LEASE_SETTLE, &pb.LeaseSettle{NodeId: "n", Settlements: []*pb.LeaseSettlement{
		{KeyId: "k", Kind: LeaseDailyRequests, Period: "2026-11-22", Consumed: 1},
		{KeyId: "k", Kind: LeaseDailyRequests, Period: "2026-11-22", Consumed: -1},
	}}))
	if code := m.apply(cmd, t0).GetRejectionCode(); code != codeInvalid {
		t.Fatalf("settle with a bad entry: %q", code)
	}
	if m.view().Digest() != before {
		t.Fatal("a refused settle changed the state")
	}
}

package route

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

func ready(id string, models ...string) Peer {
	p := Peer{ID: id, Health: HealthReady, Models: map[string]Model{}}
	for _, m := range models {
		p.Models[m] = Model{Warm: true}
	}
	return p
}

func ids(ps []Peer) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.ID
	}
	return out
}

func TestRankFilters(t *testing.T) {
	cold := ready("cold")
	cold.Models["m"] = Model{Warm: false}
	notReady := ready("alive", "m")
	notReady.Health = HealthAlive
	unknown := ready("unknown", "m")
	unknown.Health = HealthUnknown
	draining := ready("draining", "m")
	draining.Health = HealthDraining
	ejected := ready("ejected", "m")
	ejected.Ejected = true
	full := ready("full", "m")
	full.MaxInFlight, full.InFlight = 2, 2
	selfSat := ready("selfsat", "m")
	selfSat.Health = HealthSaturated
	// Surely full: this node's own calls fill the cap, or it is this node.
	sureFull := ready("surefull", "m")
	sureFull.MaxInFlight, sureFull.InFlight, sureFull.Outbound = 2, 2, 2
	selfFull := ready("selffull", "m")
	selfFull.Self, selfFull.MaxInFlight, selfFull.InFlight = true, 2, 2
	other := ready("other", "x")

	cases := []struct {
		name      string
		model     string
		peers     []Peer
		want      []string
		saturated bool
	}{
		{"only ready peers with the model", "m", []Peer{notReady, unknown, draining, ejected, other, ready("a", "m")}, []string{"a"}, false},
		{"warm before cold", "m", []Peer{cold, ready("b", "m")}, []string{"b", "cold"}, false},
		{"peers reported full go last", "m", []Peer{full, selfSat, ready("c", "m")}, []string{"c", "full", "selfsat"}, false},
		{"peers known full are left out", "m", []Peer{sureFull, selfFull, ready("c", "m")}, []string{"c"}, false},
		{"all known full is reported", "m", []Peer{sureFull, selfFull, draining}, nil, true},
		{"nobody has the model", "nope", []Peer{ready("a", "m"), full}, nil, false},
		{"empty model matches every routable peer", "", []Peer{ready("a", "m"), other, draining}, []string{"a", "other"}, false},
		{"a peer below its cap has room", "m", []Peer{{ID: "capped", Health: HealthReady, MaxInFlight: 3, InFlight: 2, Models: map[string]Model{"m": {Warm: true}}}}, []string{"capped"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := Rank(RoundRobin, Facts{Model: tc.model}, tc.peers)
			got := ids(res.Candidates)
			if len(got) == 0 {
				got = nil
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("candidates = %v, want %v", got, tc.want)
			}
			if res.Saturated != tc.saturated {
				t.Fatalf("saturated = %v, want %v", res.Saturated, tc.saturated)
			}
			if tc.saturated && res.RetryAfter < time.Second {
				t.Fatalf("retry after = %v, want >= 1s", res.RetryAfter)
			}
		})
	}
}

func TestRankColdOnlyAfterWarmForEveryStrategy(t *testing.T) {
	cold1, cold2 := ready("c1"), ready("c2")
	cold1.Models["m"] = Model{}
	cold2.Models["m"] = Model{}
	warm := ready("w", "m")
	warm.InFlight = 50 // the busiest, slowest and lightest, yet warm
	warm.Models["m"] = Model{Warm: true, Latency: time.Second}
	for _, s := range Strategies() {
		for c := uint64(0); c < 20; c++ {
			res := Rank(s, Facts{Model: "m", Caller: fmt.Sprint("caller", c), Counter: c, Seed: Seed(c, 1)}, []Peer{cold1, warm, cold2})
			if len(res.Candidates) != 3 || res.Candidates[0].ID != "w" {
				t.Fatalf("%s: candidates = %v, want the warm node first of three", s, ids(res.Candidates))
			}
		}
	}
}

func TestRankIgnoresInputOrder(t *testing.T) {
	peers := []Peer{ready("a", "m"), ready("b", "m"), ready("c", "m"), ready("d", "m")}
	peers[1].Weight = 3
	peers[2].InFlight = 1
	for _, s := range Strategies() {
		f := Facts{Model: "m", Caller: "k", Counter: 7, Seed: 99}
		want := ids(Rank(s, f, peers).Candidates)
		rev := slices.Clone(peers)
		slices.Reverse(rev)
		if got := ids(Rank(s, f, rev).Candidates); !slices.Equal(got, want) {
			t.Fatalf("%s: order depends on input order: %v vs %v", s, got, want)
		}
	}
}

func TestRoundRobinCyclesEvenly(t *testing.T) {
	peers := []Peer{ready("a", "m"), ready("b", "m"), ready("c", "m")}
	counts := map[string]int{}
	for c := uint64(0); c < 300; c++ {
		res := Rank(RoundRobin, Facts{Model: "m", Counter: c}, peers)
		counts[res.Candidates[0].ID]++
		if len(res.Candidates) != 3 {
			t.Fatalf("want all three candidates for failover, got %v", ids(res.Candidates))
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		if counts[id] != 100 {
			t.Fatalf("round robin first picks = %v, want 100 each", counts)
		}
	}
	// Consecutive counters give consecutive nodes.
	a := Rank(RoundRobin, Facts{Model: "m", Counter: 4}, peers).Candidates
	b := Rank(RoundRobin, Facts{Model: "m", Counter: 5}, peers).Candidates
	if a[1].ID != b[0].ID {
		t.Fatalf("rotation is not cyclic: %v then %v", ids(a), ids(b))
	}
}

func TestLeastLatency(t *testing.T) {
	a, b, c := ready("a", "m"), ready("b", "m"), ready("c", "m")
	a.Models["m"] = Model{Warm: true, Latency: 30 * time.Millisecond}
	b.Models["m"] = Model{Warm: true, Latency: 10 * time.Millisecond}
	c.Models["m"] = Model{Warm: true, Latency: 20 * time.Millisecond}
	for ctr := uint64(0); ctr < 5; ctr++ {
		got := ids(Rank(LeastLatency, Facts{Model: "m", Counter: ctr}, []Peer{a, b, c}).Candidates)
		if !slices.Equal(got, []string{"b", "c", "a"}) {
			t.Fatalf("least latency = %v, want [b c a]", got)
		}
	}
	// A node without a measurement is tried first so it gets measured.
	d := ready("d", "m")
	if got := Rank(LeastLatency, Facts{Model: "m"}, []Peer{a, b, c, d}).Candidates[0].ID; got != "d" {
		t.Fatalf("unmeasured node first = %s, want d", got)
	}
	// Ties rotate.
	e, g := ready("e", "m"), ready("g", "m")
	firsts := map[string]bool{}
	for ctr := uint64(0); ctr < 4; ctr++ {
		firsts[Rank(LeastLatency, Facts{Model: "m", Counter: ctr}, []Peer{e, g}).Candidates[0].ID] = true
	}
	if len(firsts) != 2 {
		t.Fatalf("ties do not rotate: %v", firsts)
	}
}

func TestLeastConnections(t *testing.T) {
	a, b, c := ready("a", "m"), ready("b", "m"), ready("c", "m")
	a.InFlight, b.InFlight, c.InFlight = 5, 0, 2
	got := ids(Rank(LeastConnections, Facts{Model: "m", Counter: 3}, []Peer{a, b, c}).Candidates)
	if !slices.Equal(got, []string{"b", "c", "a"}) {
		t.Fatalf("least connections = %v, want [b c a]", got)
	}
}

func TestWeightedDistribution(t *testing.T) {
	a, b := ready("a", "m"), ready("b", "m")
	a.Weight, b.Weight = 3, 1
	const n = 10000
	counts := map[string]int{}
	for i := uint64(0); i < n; i++ {
		res := Rank(Weighted, Facts{Model: "m", Seed: Seed(i, 42)}, []Peer{a, b})
		counts[res.Candidates[0].ID]++
		if len(res.Candidates) != 2 {
			t.Fatalf("want both candidates for failover")
		}
	}
	share := float64(counts["a"]) / n
	// Binomial sd at p=.75, n=10k is ~0.0043; allow ~4.5 sd.
	if math.Abs(share-0.75) > 0.02 {
		t.Fatalf("weight 3:1 gave a share of %.4f for a, want 0.75±0.02 (%v)", share, counts)
	}
	// Weight 0 counts as 1.
	c, d := ready("c", "m"), ready("d", "m")
	c.Weight = 0
	d.Weight = 1
	counts = map[string]int{}
	for i := uint64(0); i < n; i++ {
		counts[Rank(Weighted, Facts{Model: "m", Seed: Seed(i, 7)}, []Peer{c, d}).Candidates[0].ID]++
	}
	if share := float64(counts["c"]) / n; math.Abs(share-0.5) > 0.02 {
		t.Fatalf("weights 0 and 1 gave %.4f, want 0.5±0.02", share)
	}
}

func TestWeightedThreeWay(t *testing.T) {
	peers := []Peer{ready("a", "m"), ready("b", "m"), ready("c", "m")}
	peers[0].Weight, peers[1].Weight, peers[2].Weight = 1, 2, 5
	const n = 16000
	counts := map[string]int{}
	for i := uint64(0); i < n; i++ {
		counts[Rank(Weighted, Facts{Model: "m", Seed: Seed(i, 3)}, peers).Candidates[0].ID]++
	}
	for id, w := range map[string]float64{"a": 1, "b": 2, "c": 5} {
		if share := float64(counts[id]) / n; math.Abs(share-w/8) > 0.02 {
			t.Fatalf("share of %s = %.4f, want %.4f±0.02 (%v)", id, share, w/8, counts)
		}
	}
}

func TestStickyIsStableAndSpreads(t *testing.T) {
	peers := []Peer{ready("a", "m"), ready("b", "m"), ready("c", "m"), ready("d", "m")}
	counts := map[string]int{}
	const callers = 4000
	for i := 0; i < callers; i++ {
		caller := fmt.Sprintf("key-%d", i)
		first := Rank(Sticky, Facts{Model: "m", Caller: caller, Counter: 0, Seed: 1}, peers).Candidates
		counts[first[0].ID]++
		// The same caller lands on the same node whatever the counter, the
		// seed or the order of the peer list.
		rev := slices.Clone(peers)
		slices.Reverse(rev)
		again := Rank(Sticky, Facts{Model: "m", Caller: caller, Counter: uint64(i), Seed: uint64(i * 31)}, rev).Candidates
		if again[0].ID != first[0].ID {
			t.Fatalf("caller %s moved from %s to %s", caller, first[0].ID, again[0].ID)
		}
		// Removing a node the caller is not on does not move the caller;
		// removing its node moves it to its second choice.
		var without []Peer
		var withoutFirst []Peer
		for _, p := range peers {
			if p.ID != first[1].ID {
				without = append(without, p)
			}
			if p.ID != first[0].ID {
				withoutFirst = append(withoutFirst, p)
			}
		}
		if got := Rank(Sticky, Facts{Model: "m", Caller: caller}, without).Candidates[0].ID; got != first[0].ID {
			t.Fatalf("caller %s moved to %s when an unrelated node left", caller, got)
		}
		if got := Rank(Sticky, Facts{Model: "m", Caller: caller}, withoutFirst).Candidates[0].ID; got != first[1].ID {
			t.Fatalf("caller %s went to %s, want its second choice %s", caller, got, first[1].ID)
		}
	}
	for id, c := range counts {
		// Expect 1000 each; sd ~27.
		if c < 880 || c > 1120 {
			t.Fatalf("sticky spread is uneven for %s: %v", id, counts)
		}
	}
}

func TestStickySkipsSaturatedNode(t *testing.T) {
	peers := []Peer{ready("a", "m"), ready("b", "m"), ready("c", "m")}
	first := Rank(Sticky, Facts{Model: "m", Caller: "alice"}, peers).Candidates
	for i := range peers {
		if peers[i].ID == first[0].ID {
			peers[i].MaxInFlight, peers[i].InFlight = 1, 1
		}
	}
	got := Rank(Sticky, Facts{Model: "m", Caller: "alice"}, peers).Candidates
	if got[0].ID != first[1].ID {
		t.Fatalf("with %s full, alice went to %s, want %s", first[0].ID, got[0].ID, first[1].ID)
	}
}

func TestStickyWithoutCallerRotates(t *testing.T) {
	peers := []Peer{ready("a", "m"), ready("b", "m")}
	firsts := map[string]bool{}
	for c := uint64(0); c < 4; c++ {
		firsts[Rank(Sticky, Facts{Model: "m", Counter: c}, peers).Candidates[0].ID] = true
	}
	if len(firsts) != 2 {
		t.Fatalf("anonymous sticky requests all went to %v", firsts)
	}
}

func TestCanarySliceIsConsistentAndSized(t *testing.T) {
	for _, pct := range []int{5, 20, 50} {
		t.Run(fmt.Sprint(pct), func(t *testing.T) {
			canary := ready("canary", "m")
			canary.Canary, canary.CanaryPercent = true, pct
			peers := []Peer{ready("s1", "m"), ready("s2", "m"), canary}
			const callers = 20000
			onCanary := 0
			for i := 0; i < callers; i++ {
				caller := fmt.Sprintf("caller-%d", i)
				first := ""
				for _, s := range Strategies() {
					for c := uint64(0); c < 3; c++ {
						res := Rank(s, Facts{Model: "m", Caller: caller, Counter: c, Seed: Seed(c, uint64(i))}, peers)
						got := res.Candidates[0].ID == "canary"
						if first == "" {
							first = res.Candidates[0].ID
							if got {
								onCanary++
							}
						} else if got != (first == "canary") {
							t.Fatalf("caller %s switched sides (%s then %s with %s)", caller, first, res.Candidates[0].ID, s)
						}
						if len(res.Candidates) != 3 {
							t.Fatalf("the other side must stay as fallback: %v", ids(res.Candidates))
						}
					}
				}
			}
			share := float64(onCanary) / callers
			want := float64(pct) / 100
			sd := math.Sqrt(want * (1 - want) / callers)
			if math.Abs(share-want) > 5*sd+0.002 {
				t.Fatalf("canary share %.4f, want %.2f (±%.4f)", share, want, 5*sd)
			}
		})
	}
}

func TestCanaryEdgeCases(t *testing.T) {
	canary := ready("canary", "m")
	canary.Canary, canary.CanaryPercent = true, 100
	stable := ready("stable", "m")
	// Anonymous callers never go to a canary.
	if got := Rank(RoundRobin, Facts{Model: "m"}, []Peer{canary, stable}).Candidates[0].ID; got != "stable" {
		t.Fatalf("anonymous caller went to %s", got)
	}
	// 100% canary takes every identified caller.
	if got := Rank(RoundRobin, Facts{Model: "m", Caller: "x"}, []Peer{canary, stable}).Candidates[0].ID; got != "canary" {
		t.Fatalf("100%% canary missed a caller: %s", got)
	}
	// A canary whose record says full is tried only after the stable side
	// (it may have freed a slot since the record); one this node knows is
	// full (its own calls fill the cap) is not tried at all.
	canary.MaxInFlight, canary.InFlight = 1, 1
	if got := Rank(RoundRobin, Facts{Model: "m", Caller: "x"}, []Peer{canary, stable}).Candidates; len(got) != 2 || got[0].ID != "stable" || got[1].ID != "canary" {
		t.Fatalf("canary reported full: got %v, want [stable canary]", ids(got))
	}
	canary.Outbound = 1
	if got := Rank(RoundRobin, Facts{Model: "m", Caller: "x"}, []Peer{canary, stable}).Candidates; len(got) != 1 || got[0].ID != "stable" {
		t.Fatalf("surely full canary: got %v, want [stable]", ids(got))
	}
	// When only canary nodes have the model, stable callers still get served.
	c0 := ready("c0", "m")
	c0.Canary, c0.CanaryPercent = true, 0
	if got := Rank(RoundRobin, Facts{Model: "m", Caller: "x"}, []Peer{c0}).Candidates; len(got) != 1 {
		t.Fatalf("0%% canary as the only holder: got %v", ids(got))
	}
	// Two canaries: a caller is eligible for a canary only inside its slice.
	small, big := ready("small", "m"), ready("big", "m")
	small.Canary, small.CanaryPercent = true, 10
	big.Canary, big.CanaryPercent = true, 30
	for i := 0; i < 2000; i++ {
		caller := fmt.Sprint("c", i)
		b := CanaryBucket(caller)
		res := Rank(RoundRobin, Facts{Model: "m", Caller: caller, Counter: uint64(i)}, []Peer{small, big, stable})
		first := res.Candidates[0].ID
		switch {
		case b < 10 && first == "stable", b >= 10 && b < 30 && first != "big", b >= 30 && first != "stable":
			t.Fatalf("bucket %d went to %s", b, first)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	p := ready("a", "m")
	p.MaxInFlight, p.InFlight, p.QueueDepth = 4, 4, 7
	p.Models["m"] = Model{Warm: true, Latency: 2 * time.Second}
	// (7 queued + 1) * 2s / 4 = 4s.
	if got := RetryAfter("m", []Peer{p}); got != 4*time.Second {
		t.Fatalf("retry after = %v, want 4s", got)
	}
	q := p
	q.ID = "b"
	q.QueueDepth = 0
	q.Models = map[string]Model{"m": {Warm: true, Latency: 100 * time.Millisecond}}
	if got := RetryAfter("m", []Peer{p, q}); got != time.Second {
		t.Fatalf("retry after = %v, want the 1s floor from the faster peer", got)
	}
	slow := p
	slow.Models = map[string]Model{"m": {Warm: true, Latency: time.Hour}}
	if got := RetryAfter("m", []Peer{slow}); got != time.Minute {
		t.Fatalf("retry after = %v, want the 60s ceiling", got)
	}
	if got := RetryAfter("m", nil); got != time.Minute {
		t.Fatalf("retry after with no peers = %v, want 60s", got)
	}
	// Reported full: still a candidate (the record may be stale).
	if res := Rank(RoundRobin, Facts{Model: "m"}, []Peer{p}); res.Saturated || len(res.Candidates) != 1 {
		t.Fatalf("reported-full peer: %+v, want it as the last-resort candidate", res)
	}
	p.Outbound = 4 // this node's own calls fill the cap: surely full
	res := Rank(RoundRobin, Facts{Model: "m"}, []Peer{p})
	if !res.Saturated || res.RetryAfter != 4*time.Second {
		t.Fatalf("rank: saturated=%v retry=%v, want true 4s", res.Saturated, res.RetryAfter)
	}
}

func TestParseStrategy(t *testing.T) {
	for in, want := range map[string]Strategy{"": RoundRobin, "Least_Latency": LeastLatency, "sticky": Sticky, " weighted ": Weighted, "least-connections": LeastConnections} {
		got, err := ParseStrategy(in)
		if err != nil || got != want {
			t.Fatalf("ParseStrategy(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseStrategy("random"); err == nil {
		t.Fatal("ParseStrategy accepted an unknown name")
	}
}

func TestCanaryBucketRange(t *testing.T) {
	seen := map[int]bool{}
	for i := 0; i < 5000; i++ {
		b := CanaryBucket(fmt.Sprint(i))
		if b < 0 || b >= 100 {
			t.Fatalf("bucket %d out of range", b)
		}
		seen[b] = true
	}
	if len(seen) != 100 {
		t.Fatalf("only %d of 100 buckets used", len(seen))
	}
	if CanaryBucket("") != -1 {
		t.Fatal("the empty caller must have no bucket")
	}
}

func TestLeastQueuedPrefersTheShortestQueue(t *testing.T) {
	peers := []Peer{ready("a", "m"), ready("b", "m"), ready("c", "m")}
	peers[0].QueueDepth, peers[1].QueueDepth, peers[2].QueueDepth = 3, 0, 1
	for n := uint64(0); n < 6; n++ {
		got := ids(Rank(RoundRobin, Facts{Model: "m", Counter: n, LeastQueued: true}, peers).Candidates)
		if !slices.Equal(got, []string{"b", "c", "a"}) {
			t.Fatalf("counter %d: %v, want b c a", n, got)
		}
	}
	// Equal queues leave the strategy's order.
	peers[0].QueueDepth, peers[1].QueueDepth, peers[2].QueueDepth = 0, 0, 0
	seen := map[string]bool{}
	for n := uint64(0); n < 3; n++ {
		seen[Rank(RoundRobin, Facts{Model: "m", Counter: n, LeastQueued: true}, peers).Candidates[0].ID] = true
	}
	if len(seen) != 3 {
		t.Fatalf("round-robin under equal queues reached %v", seen)
	}
}

package route

import (
	"fmt"
	"slices"
	"testing"
)

// conv is a request's prefix hashes: 5 messages.
var conv = []uint64{101, 102, 103, 104, 105}

func holding(p Peer, hashes ...uint64) Peer {
	p.Prefixes = NewPrefixDigest(64, hashes)
	return p
}

func TestParsePrefixStrategies(t *testing.T) {
	for in, want := range map[string]Strategy{
		"prefix": Prefix, " Prefix ": Prefix, "prefix.least_connections": "prefix.least-connections",
		"PREFIX.STICKY": "prefix.sticky", "prefix.round-robin": "prefix.round-robin", "prefix.weighted": "prefix.weighted",
		"prefix.least-latency": "prefix.least-latency",
	} {
		got, err := ParseStrategy(in)
		if err != nil || got != want {
			t.Fatalf("ParseStrategy(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"prefix.", "prefix.prefix", "prefix.random", "prefix+sticky", "prefixsticky", "sticky.prefix"} {
		if s, err := ParseStrategy(in); err == nil {
			t.Fatalf("ParseStrategy(%q) accepted %q", in, s)
		}
	}
	cases := []struct {
		s     Strategy
		aware bool
		base  Strategy
	}{{Prefix, true, RoundRobin}, {"prefix.sticky", true, Sticky}, {Sticky, false, Sticky}, {RoundRobin, false, RoundRobin}}
	for _, c := range cases {
		if c.s.PrefixAware() != c.aware || c.s.Base() != c.base {
			t.Fatalf("%s: aware %v base %s", c.s, c.s.PrefixAware(), c.s.Base())
		}
	}
}

func TestPrefixPrefersLongestHolder(t *testing.T) {
	a := holding(ready("a", "m"), 101)      // the system prompt only
	b := holding(ready("b", "m"), 777, 104) // four messages of it
	c := ready("c", "m")                    // nothing
	d := holding(ready("d", "m"), 102)      // two messages
	peers := []Peer{a, b, c, d}
	for _, s := range []Strategy{Prefix, "prefix.least-connections", "prefix.weighted", "prefix.sticky", "prefix.least-latency"} {
		for n := uint64(0); n < 12; n++ {
			res := Rank(s, Facts{Model: "m", Caller: fmt.Sprint("caller", n), Counter: n, Seed: Seed(n, 3), Prefixes: conv}, peers)
			got := ids(res.Candidates)
			if !slices.Equal(got[:3], []string{"b", "d", "a"}) || got[3] != "c" {
				t.Fatalf("%s counter %d: %v, want b d a c", s, n, got)
			}
		}
	}
	// Without prefixes (not a chat), or when nobody holds one, the base
	// strategy alone decides: round-robin spreads the first place.
	for _, f := range []Facts{{Model: "m"}, {Model: "m", Prefixes: []uint64{9, 8}}} {
		firsts := map[string]int{}
		for n := uint64(0); n < 8; n++ {
			f.Counter = n
			firsts[Rank(Prefix, f, peers).Candidates[0].ID]++
		}
		if len(firsts) != 4 {
			t.Fatalf("facts %+v: first places %v, want all four rotated", f, firsts)
		}
		f.Counter = 5
		if want := ids(Rank(RoundRobin, f, peers).Candidates); !slices.Equal(ids(Rank(Prefix, f, peers).Candidates), want) {
			t.Fatalf("prefix without a holder differs from round-robin %v", want)
		}
	}
}

func TestPrefixFallsBackWhenHolderIsBusy(t *testing.T) {
	b := holding(ready("b", "m"), 105)
	a, c := ready("a", "m"), ready("c", "m")
	a.InFlight, c.InFlight = 1, 3
	f := Facts{Model: "m", Prefixes: conv}
	for _, tc := range []struct {
		inFlight, slack int
		preferred       bool
	}{
		{1, 0, true},                         // as loaded as the least loaded
		{1 + DefaultPrefixSlack, 0, true},    // at the default slack
		{2 + DefaultPrefixSlack, 0, false},   // past it
		{9, 8, true},                         // a wider slack
		{10, 8, false},                       // past the wider slack
		{1, -1, true},                        // no slack, among the least loaded
		{2, -1, false},                       // no slack, busier than a
		{0, -1, true},                        // the least loaded itself
		{1 + DefaultPrefixSlack, -1, false},  // no slack
		{100 + DefaultPrefixSlack, 0, false}, // far past it
	} {
		b.InFlight = tc.inFlight
		f.PrefixSlack = tc.slack
		firsts := map[string]int{}
		for n := uint64(0); n < 30; n++ {
			f.Counter = n
			firsts[Rank(Prefix, f, []Peer{a, b, c}).Candidates[0].ID]++
		}
		if tc.preferred && firsts["b"] != 30 {
			t.Fatalf("in flight %d slack %d: first places %v, want always b", tc.inFlight, tc.slack, firsts)
		}
		if !tc.preferred && (firsts["a"] != 10 || firsts["b"] != 10 || firsts["c"] != 10) {
			t.Fatalf("in flight %d slack %d: first places %v, want round-robin", tc.inFlight, tc.slack, firsts)
		}
	}
	// With least-connections as the base, the fallback is the least loaded.
	b.InFlight, f.PrefixSlack = 9, 0
	if got := ids(Rank("prefix.least-connections", f, []Peer{a, b, c}).Candidates); !slices.Equal(got, []string{"a", "c", "b"}) {
		t.Fatalf("least-connections fallback: %v", got)
	}
	// A shorter holder within the slack wins over a longer one past it.
	short := holding(ready("s", "m"), 101)
	short.InFlight = 1
	if got := Rank(Prefix, f, []Peer{a, b, c, short}).Candidates[0].ID; got != "s" {
		t.Fatalf("busy longest holder: first %s, want the idle shorter holder", got)
	}
}

func TestPrefixKeepsRankGroups(t *testing.T) {
	f := Facts{Model: "m", Prefixes: conv}
	// A holder reported full, or holding the model cold, does not jump
	// ahead of peers with room that have the model warm.
	full := holding(ready("full", "m"), 105)
	full.MaxInFlight, full.InFlight = 1, 1
	cold := holding(ready("cold"), 105)
	cold.Models["m"] = Model{}
	if got := ids(Rank(Prefix, f, []Peer{full, cold, ready("w", "m")}).Candidates); !slices.Equal(got, []string{"w", "cold", "full"}) {
		t.Fatalf("candidates %v, want w cold full", got)
	}
	// A canary holder does not draw a stable caller.
	canary := holding(ready("canary", "m"), 105)
	canary.Canary = true
	f.Caller = "anyone"
	if got := Rank(Prefix, f, []Peer{canary, ready("stable", "m")}).Candidates[0].ID; got != "stable" {
		t.Fatalf("stable caller went to %s", got)
	}
	// The holder's own view of itself counts like any other.
	self := holding(ready("self", "m"), 103)
	self.Self = true
	if got := Rank(Prefix, Facts{Model: "m", Prefixes: conv}, []Peer{ready("x", "m"), self}).Candidates[0].ID; got != "self" {
		t.Fatalf("first %s, want self", got)
	}
}

func TestPrefixDigest(t *testing.T) {
	var zero PrefixDigest
	if !zero.Valid() || !zero.Empty() || zero.Contains(1) || zero.Longest(conv) != 0 || zero.FalsePositiveRate() != 0 {
		t.Fatal("the zero digest must be valid and hold nothing")
	}
	if d := NewPrefixDigest(512, nil); !d.Empty() {
		t.Fatal("a digest of nothing must be empty")
	}
	d := NewPrefixDigest(1, []uint64{1, 2, 3}) // clamped up to 8 bytes
	if len(d.Bits) != 8 || !d.Contains(1) || !d.Contains(3) || d.Longest([]uint64{1, 9, 3, 99}) < 3 {
		t.Fatalf("digest %+v", d)
	}
	if d := NewPrefixDigest(1<<20, []uint64{1}); len(d.Bits) != MaxDigestBytes || d.Hashes != MaxDigestHashes {
		t.Fatalf("clamped digest: %d bytes, %d hashes", len(d.Bits), d.Hashes)
	}
	// Malformed digests from a peer count as empty, even with every bit set.
	ones := make([]byte, 16)
	for i := range ones {
		ones[i] = 0xff
	}
	for _, bad := range []PrefixDigest{{Bits: ones}, {Bits: ones, Hashes: MaxDigestHashes + 1}, {Bits: make([]byte, MaxDigestBytes+1), Hashes: 3}, {Hashes: 2}} {
		if bad.Valid() || !bad.Empty() || bad.Contains(1) {
			t.Fatalf("malformed digest (%d bytes, %d hashes) accepted", len(bad.Bits), bad.Hashes)
		}
	}
	if !(PrefixDigest{Bits: ones, Hashes: 3}).Contains(12345) {
		t.Fatal("a full filter must contain everything")
	}
}

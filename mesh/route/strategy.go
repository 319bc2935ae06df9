package route

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Strategy names how candidates of equal standing are ordered.
type Strategy string

// The routing strategies.
const (
	// RoundRobin rotates through the candidates by a per-request counter.
	RoundRobin Strategy = "round-robin"
	// LeastLatency prefers the lowest moving-average latency for the model.
	LeastLatency Strategy = "least-latency"
	// LeastConnections prefers the fewest requests in flight.
	LeastConnections Strategy = "least-connections"
	// Weighted picks at random in proportion to each node's weight.
	Weighted Strategy = "weighted"
	// Sticky sends a caller to the same node while that node is healthy
	// (rendezvous hashing of the caller over the candidates).
	Sticky Strategy = "sticky"
	// Prefix puts the candidate holding the longest cached prefix of a
	// chat request first while its load is within Facts.PrefixSlack of the
	// least loaded candidate, and orders everything else round-robin.
	// "prefix.<strategy>" (for example "prefix.least-connections") orders
	// everything else by that strategy instead; see prefix.go.
	Prefix Strategy = "prefix"
)

// prefixSep joins the prefix modifier to its base strategy. It is a dot
// because replicated policy allows only [a-z0-9._-] in strategy names.
const prefixSep = "."

// DefaultStrategy is used when none is configured.
const DefaultStrategy = RoundRobin

// Strategies lists every known strategy.
func Strategies() []Strategy {
	return []Strategy{RoundRobin, LeastLatency, LeastConnections, Weighted, Sticky, Prefix}
}

// baseStrategies are the strategies a prefix strategy can fall back to.
func baseStrategies() []Strategy {
	return []Strategy{RoundRobin, LeastLatency, LeastConnections, Weighted, Sticky}
}

// PrefixAware reports whether s is Prefix or "prefix.<strategy>".
func (s Strategy) PrefixAware() bool {
	return s == Prefix || strings.HasPrefix(string(s), string(Prefix)+prefixSep)
}

// Base returns the strategy that orders candidates apart from the prefix
// preference: RoundRobin for Prefix, X for "prefix.X", s itself for a
// strategy that is not prefix-aware.
func (s Strategy) Base() Strategy {
	switch {
	case s == Prefix:
		return RoundRobin
	case s.PrefixAware():
		return s[len(Prefix)+len(prefixSep):]
	}
	return s
}

// ParseStrategy accepts a strategy name (case-insensitive, "_" for "-"); the
// empty string means DefaultStrategy. Besides Strategies it accepts
// "prefix.<strategy>" for each strategy that is not prefix-aware itself.
func ParseStrategy(s string) (Strategy, error) {
	if s == "" {
		return DefaultStrategy, nil
	}
	n := Strategy(strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "_", "-"))
	if slices.Contains(Strategies(), n) || n.PrefixAware() && slices.Contains(baseStrategies(), n.Base()) {
		return n, nil
	}
	return "", fmt.Errorf("route: unknown strategy %q (want one of round-robin, least-latency, least-connections, weighted, sticky, prefix or prefix.<one of the others>)", s)
}

// order sorts peers in place by the strategy. All strategies first sort by id
// so the result depends only on the inputs, never on the order of peers.
func order(s Strategy, f *Facts, peers []*Peer) {
	if len(peers) < 2 {
		return
	}
	slices.SortFunc(peers, func(a, b *Peer) int { return strings.Compare(a.ID, b.ID) })
	if s.PrefixAware() {
		orderBase(s.Base(), f, peers)
		preferPrefix(f, peers)
		return
	}
	orderBase(s, f, peers)
}

// orderBase sorts peers, already sorted by id, by a strategy that is not
// prefix-aware.
func orderBase(s Strategy, f *Facts, peers []*Peer) {
	switch s {
	case LeastLatency:
		rotate(peers, f.Counter)
		slices.SortStableFunc(peers, func(a, b *Peer) int {
			return cmpInt64(int64(a.Models[f.Model].Latency), int64(b.Models[f.Model].Latency))
		})
	case LeastConnections:
		rotate(peers, f.Counter)
		slices.SortStableFunc(peers, func(a, b *Peer) int { return cmpInt64(int64(a.InFlight), int64(b.InFlight)) })
	case Weighted:
		// Weighted random sampling without replacement (Efraimidis-Spirakis):
		// key = u^(1/w) with u uniform in (0,1) drawn from the seed; the
		// largest key goes first, so the first pick has probability w/sum(w).
		type keyed struct {
			p *Peer
			k float64
		}
		ks := make([]keyed, len(peers))
		for i, p := range peers {
			u := unit(mix(f.Seed ^ hashString(p.ID)))
			ks[i] = keyed{p, math.Log(u) / float64(p.weight())}
		}
		slices.SortStableFunc(ks, func(a, b keyed) int { return cmpFloat(b.k, a.k) })
		for i := range ks {
			peers[i] = ks[i].p
		}
	case Sticky:
		if f.Caller == "" {
			rotate(peers, f.Counter)
			return
		}
		ch := hashString(f.Caller)
		slices.SortStableFunc(peers, func(a, b *Peer) int {
			return cmpUint64(mix(ch^hashString(b.ID)), mix(ch^hashString(a.ID)))
		})
	default: // RoundRobin and anything unknown.
		rotate(peers, f.Counter)
	}
}

// rotate moves element counter%len to the front, keeping cyclic order.
func rotate(peers []*Peer, counter uint64) {
	k := int(counter % uint64(len(peers)))
	if k == 0 {
		return
	}
	slices.Reverse(peers[:k])
	slices.Reverse(peers[k:])
	slices.Reverse(peers)
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

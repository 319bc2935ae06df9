package route

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// Facts are the properties of one request that routing looks at.
type Facts struct {
	// Model is the canonical model id; empty for requests not tied to a model.
	Model string
	// Caller is a stable identity of the caller (API key id, else client
	// address). Sticky placement and the canary split hash it; an empty
	// caller is never sent to a canary and sticky falls back to round-robin.
	Caller string
	// Counter is a per-request counter that round-robin rotates by; it also
	// breaks ties in least-latency and least-connections.
	Counter uint64
	// Seed is a per-request random value for the weighted strategy.
	Seed uint64
	// Prefixes are the request's prefix hashes for the prefix strategies
	// (node/prefix computes them), shortest first: Prefixes[k-1]
	// identifies the model, tools and first k messages of a chat request,
	// after the hash of its prompt cache key when it has one. Nil for
	// requests that are not chats; other strategies ignore it.
	Prefixes []uint64
	// PrefixSlack is how many more requests in flight than the least
	// loaded candidate the holder of the longest prefix may have and
	// still come first: 0 means DefaultPrefixSlack, a negative value
	// means none (the holder must be among the least loaded).
	PrefixSlack int
	// LeastQueued orders each group by the peers' gossiped queue depth
	// first (the strategy breaks ties): heavy work such as image
	// generation goes to the holder with the shortest queue.
	LeastQueued bool
}

// Result is the outcome of ranking.
type Result struct {
	// Candidates are the peers to try, best first. Peers without room,
	// not ready, draining or ejected never appear.
	Candidates []Peer
	// Saturated is set when some routable peer has the model but none of
	// them has room; the caller should answer 503 with RetryAfter.
	Saturated bool
	// RetryAfter estimates when a saturated peer will have room (whole
	// seconds, at least one); set only with Saturated.
	RetryAfter time.Duration
}

// Rank orders the peers that can serve f.Model now.
//
// Only routable peers with the model installed are considered, and only
// those with room are returned. Callers are split between canary and stable
// nodes first: a caller whose CanaryBucket is below a canary node's
// CanaryPercent belongs to that canary's side, everyone else to the stable
// (non-canary) side. The result lists, in order: the caller's side with the
// model warm, the caller's side with it cold, then the other side warm and
// cold as a fallback. Within each group the strategy decides the order.
func Rank(s Strategy, f Facts, peers []Peer) Result {
	bucket := CanaryBucket(f.Caller)
	canaryCaller := false
	for i := range peers {
		p := &peers[i]
		if p.Routable() && p.Has(f.Model) && inCanarySlice(p, bucket) {
			canaryCaller = true
			break
		}
	}
	var groups [4][]*Peer // own side warm, own cold, other side warm, other cold
	// full are surely at their cap; maybe reported full in their last
	// record but may have room now: they go last, so work a peer could
	// take is never refused on a stale record.
	var full, maybe []*Peer
	for i := range peers {
		p := &peers[i]
		if !p.Routable() || !p.Has(f.Model) {
			continue
		}
		if p.SurelyFull() {
			full = append(full, p)
			continue
		}
		if !p.HasRoom() {
			full, maybe = append(full, p), append(maybe, p)
			continue
		}
		g := 0
		if own := inCanarySlice(p, bucket) || (!canaryCaller && !p.Canary); !own {
			g = 2
		}
		if !p.Warm(f.Model) {
			g++
		}
		groups[g] = append(groups[g], p)
	}
	var res Result
	n := len(groups[0]) + len(groups[1]) + len(groups[2]) + len(groups[3]) + len(maybe)
	if n == 0 {
		if len(full) > 0 {
			res.Saturated = true
			res.RetryAfter = retryAfter(f.Model, full)
		}
		return res
	}
	res.Candidates = make([]Peer, 0, n)
	for _, g := range append(groups[:], maybe) {
		order(s, &f, g)
		if f.LeastQueued {
			slices.SortStableFunc(g, func(a, b *Peer) int { return cmp.Compare(a.QueueDepth, b.QueueDepth) })
		}
		for _, p := range g {
			res.Candidates = append(res.Candidates, *p)
		}
	}
	return res
}

// inCanarySlice reports whether the caller's bucket falls in canary peer p's
// slice of callers.
func inCanarySlice(p *Peer, bucket int) bool {
	return p.Canary && bucket >= 0 && bucket < p.CanaryPercent
}

// RetryAfter estimates how long until one of the peers that have the model
// has room again: for each peer, the requests ahead of a new one (in flight
// beyond the cap plus the queue, plus one) times the model's average latency,
// divided by the peer's parallelism (its cap). The soonest peer wins. The
// result is rounded up to whole seconds and kept within [1s, 60s]; without
// latency data one second per waiting request wave is assumed.
func RetryAfter(model string, peers []Peer) time.Duration {
	ps := make([]*Peer, 0, len(peers))
	for i := range peers {
		if peers[i].Routable() && peers[i].Has(model) {
			ps = append(ps, &peers[i])
		}
	}
	return retryAfter(model, ps)
}

func retryAfter(model string, peers []*Peer) time.Duration {
	best := math.Inf(1)
	for _, p := range peers {
		ahead := p.QueueDepth + 1
		if p.MaxInFlight > 0 && p.InFlight > p.MaxInFlight {
			ahead += p.InFlight - p.MaxInFlight
		}
		lat := p.Models[model].Latency
		if lat <= 0 {
			lat = time.Second
		}
		par := p.MaxInFlight
		if par < 1 {
			par = 1
		}
		if w := float64(ahead) * lat.Seconds() / float64(par); w < best {
			best = w
		}
	}
	secs := math.Ceil(best)
	switch {
	case math.IsInf(best, 1) || secs > 60:
		secs = 60
	case secs < 1:
		secs = 1
	}
	return time.Duration(secs) * time.Second
}

package route

import (
	"math"
	"slices"
)

// Prefix-aware routing.
//
// A chat request is identified by the hashes of its message prefixes (see
// package node/prefix): Facts.Prefixes[k-1] names the model, the tools and
// the first k messages (a request with OpenAI's prompt_cache_key has the
// key's hash before them, as its shortest prefix). Every node gossips a PrefixDigest, a Bloom filter
// of the prefix hashes it served last (a served conversation is recorded
// with the generated answer, so the next turn's request matches it). The
// prefix strategies put the candidate holding the longest prefix of the
// request first, where the engine's prefix cache can skip the prefill of
// the shared part, as long as that candidate's load stays within a slack of
// the least loaded candidate; otherwise, and for requests no candidate
// holds, the base strategy decides.
//
// Trade-off. Following the prefix concentrates a conversation on one node:
// each follow-up turn prefills only its new tokens there, but a node that
// holds many active conversations gets more than its share of work. The
// slack bounds that: the holder is preferred only while it has at most
// PrefixSlack more requests in flight than the least loaded candidate
// (DefaultPrefixSlack = 4; a negative slack demands it be among the least
// loaded). Past it the request goes where the base strategy sends it and
// pays a full prefill there, which then also records the conversation
// there, so the conversation moves with the load. First turns, requests
// no digest matches, and candidates not ready, full, cold or on the other
// side of a canary split are ranked exactly as by the base strategy; the
// preference only reorders peers within Rank's groups. Digests travel
// with the node record (at most every record interval, 250 ms by
// default), so a turn sent within that time of the previous answer may
// miss; a Bloom false positive (about 5 in 10,000 per lookup at the
// default size) only costs a prefill elsewhere.

// Bloom filter bounds: what a digest may hold, and the most a remote
// digest may claim (larger or malformed ones are ignored).
const (
	// MaxDigestBytes is the largest Bloom filter a digest may carry.
	MaxDigestBytes = 8192
	// MaxDigestHashes is the most hash functions a digest may use.
	MaxDigestHashes = 32
)

// DefaultPrefixSlack is how many more requests in flight the holder of the
// longest prefix may have than the least loaded candidate and still come
// first, when Facts.PrefixSlack is 0.
const DefaultPrefixSlack = 4

// PrefixDigest is a Bloom filter over 64-bit prefix hashes. It is immutable
// once built (views share its bytes); the zero value holds nothing.
type PrefixDigest struct {
	// Bits is the filter: bit i is bit i%8 (least significant first) of
	// byte i/8. Its length is a whole number of bytes up to MaxDigestBytes.
	Bits []byte
	// Hashes is the number of bit positions each entry sets (1 to
	// MaxDigestHashes).
	Hashes int
	// Entries is how many prefix hashes were added (informational).
	Entries int
}

// NewPrefixDigest builds a filter of size bytes (clamped to 8 ..
// MaxDigestBytes) over hashes, with the number of hash functions that
// minimises false positives for that many entries. No hashes give the
// empty digest.
func NewPrefixDigest(size int, hashes []uint64) PrefixDigest {
	if len(hashes) == 0 {
		return PrefixDigest{}
	}
	size = min(max(size, 8), MaxDigestBytes)
	bits := float64(size * 8)
	k := int(math.Round(bits / float64(len(hashes)) * math.Ln2))
	d := PrefixDigest{Bits: make([]byte, size), Hashes: min(max(k, 1), MaxDigestHashes), Entries: len(hashes)}
	for _, h := range hashes {
		d.positions(h, func(i uint64) bool {
			d.Bits[i>>3] |= 1 << (i & 7)
			return true
		})
	}
	return d
}

// Valid reports whether the digest is well formed: the empty digest, or
// bits and a hash count within bounds.
func (d PrefixDigest) Valid() bool {
	if len(d.Bits) == 0 {
		return d.Hashes == 0
	}
	return len(d.Bits) <= MaxDigestBytes && d.Hashes >= 1 && d.Hashes <= MaxDigestHashes
}

// Empty reports whether the digest holds nothing (or is malformed, which
// routing treats the same way).
func (d PrefixDigest) Empty() bool { return len(d.Bits) == 0 || !d.Valid() }

// Contains reports whether h may have been added: always true for an added
// hash, true for others with the filter's false-positive probability.
func (d PrefixDigest) Contains(h uint64) bool {
	if d.Empty() {
		return false
	}
	found := true
	d.positions(h, func(i uint64) bool {
		if d.Bits[i>>3]&(1<<(i&7)) == 0 {
			found = false
		}
		return found
	})
	return found
}

// Longest returns the largest k such that the digest holds prefixes[k-1],
// 0 when it holds none of them.
func (d PrefixDigest) Longest(prefixes []uint64) int {
	if d.Empty() {
		return 0
	}
	for k := len(prefixes); k > 0; k-- {
		if d.Contains(prefixes[k-1]) {
			return k
		}
	}
	return 0
}

// FalsePositiveRate estimates the chance that Contains is true for a hash
// that was not added: (1 - e^(-k·n/m))^k.
func (d PrefixDigest) FalsePositiveRate() float64 {
	if d.Empty() || d.Entries == 0 {
		return 0
	}
	k, n, m := float64(d.Hashes), float64(d.Entries), float64(len(d.Bits)*8)
	return math.Pow(1-math.Exp(-k*n/m), k)
}

// positions calls f with each bit index of h until f returns false. Each
// index comes from its own splitmix64 output (plain double hashing gave
// about 1.6 times the textbook false-positive rate at the default size).
func (d PrefixDigest) positions(h uint64, f func(uint64) bool) {
	m := uint64(len(d.Bits)) * 8
	for i := 0; i < d.Hashes; i++ {
		if !f(mix(h+uint64(i)*0x9e3779b97f4a7c15) % m) {
			return
		}
	}
}

// preferPrefix moves the peers holding a prefix of the request to the
// front of peers, which the base strategy has ordered: longest prefix
// first, ties in base order, and only peers whose load is within the slack
// of the least loaded peer. The others keep their base order behind them.
func preferPrefix(f *Facts, peers []*Peer) {
	if len(f.Prefixes) == 0 || len(peers) == 0 {
		return
	}
	slack := f.PrefixSlack
	switch {
	case slack == 0:
		slack = DefaultPrefixSlack
	case slack < 0:
		slack = 0
	}
	least := peers[0].InFlight
	for _, p := range peers[1:] {
		least = min(least, p.InFlight)
	}
	type held struct {
		p *Peer
		k int
	}
	var holders []held
	var rest []*Peer
	for _, p := range peers {
		if p.InFlight-least <= slack {
			if k := p.Prefixes.Longest(f.Prefixes); k > 0 {
				holders = append(holders, held{p, k})
				continue
			}
		}
		rest = append(rest, p)
	}
	if len(holders) == 0 {
		return
	}
	slices.SortStableFunc(holders, func(a, b held) int { return b.k - a.k })
	for i, h := range holders {
		peers[i] = h.p
	}
	copy(peers[len(holders):], rest)
}

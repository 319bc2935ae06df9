package prefix

import (
	"sync"

	"github.com/infermesh/infermesh/mesh/route"
)

// Tracker defaults.
const (
	// DefaultCapacity is how many prefix hashes a Tracker remembers.
	DefaultCapacity = 4096
	// DefaultDigestBytes is the size of the Bloom filter a Tracker's
	// digest carries: with the NodeRecord's other fields it keeps the
	// record within one UDP gossip packet for a node with a few models.
	DefaultDigestBytes = 512
	// DefaultDigestEntries is how many of the most recent hashes the
	// digest holds: 256 entries in 4096 bits with 11 hash functions give
	// a false-positive rate of about 5 in 10,000 per lookup. Each served
	// turn records two hashes, so that is the last 128 turns, more
	// conversations than a CPU node's KV prefix cache keeps.
	DefaultDigestEntries = 256
)

// TrackerConfig sizes a Tracker; zero fields take the defaults.
type TrackerConfig struct {
	// Capacity bounds the hashes remembered (least recently used go first).
	Capacity int
	// DigestBytes is the size of the digest's Bloom filter.
	DigestBytes int
	// DigestEntries is how many of the most recent hashes go into the
	// digest.
	DigestEntries int
}

// Tracker is a bounded LRU set of the prefix hashes this node served. It is
// safe for concurrent use.
type Tracker struct {
	cfg TrackerConfig

	mu    sync.Mutex
	index map[uint64]int32 // hash -> slot
	slots []slot           // doubly linked through prev/next, head most recent
	head  int32            // most recent slot, -1 when empty
	tail  int32            // least recent slot
}

type slot struct {
	hash       uint64
	prev, next int32
}

// NewTracker returns an empty Tracker.
func NewTracker(cfg TrackerConfig) *Tracker {
	if cfg.Capacity <= 0 {
		cfg.Capacity = DefaultCapacity
	}
	if cfg.DigestBytes <= 0 {
		cfg.DigestBytes = DefaultDigestBytes
	}
	if cfg.DigestEntries <= 0 {
		cfg.DigestEntries = DefaultDigestEntries
	}
	cfg.DigestBytes = min(cfg.DigestBytes, route.MaxDigestBytes)
	return &Tracker{cfg: cfg, index: make(map[uint64]int32), head: -1, tail: -1}
}

// Record adds hashes, or marks them used when present; the last one given
// is the most recent. The least recently used hashes beyond the capacity
// are forgotten.
func (t *Tracker) Record(hashes ...uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, h := range hashes {
		if i, ok := t.index[h]; ok {
			t.unlink(i)
			t.pushFront(i)
			continue
		}
		var i int32
		if len(t.slots) < t.cfg.Capacity {
			i = int32(len(t.slots))
			t.slots = append(t.slots, slot{})
		} else {
			i = t.tail
			t.unlink(i)
			delete(t.index, t.slots[i].hash)
		}
		t.slots[i].hash = h
		t.index[h] = i
		t.pushFront(i)
	}
}

// Contains reports whether h is remembered, without marking it used.
func (t *Tracker) Contains(h uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.index[h]
	return ok
}

// Longest returns the largest k such that prefixes[k-1] is remembered, 0
// when none is.
func (t *Tracker) Longest(prefixes []uint64) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := len(prefixes); k > 0; k-- {
		if _, ok := t.index[prefixes[k-1]]; ok {
			return k
		}
	}
	return 0
}

// Len returns how many hashes are remembered.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.index)
}

// Recent returns up to n hashes, most recent first.
func (t *Tracker) Recent(n int) []uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]uint64, 0, min(n, len(t.index)))
	for i := t.head; i >= 0 && len(out) < n; i = t.slots[i].next {
		out = append(out, t.slots[i].hash)
	}
	return out
}

// Digest returns the Bloom filter of the most recent hashes to gossip
// (mesh.Mesh.SetPrefixDigest); empty when nothing was recorded.
func (t *Tracker) Digest() route.PrefixDigest {
	return route.NewPrefixDigest(t.cfg.DigestBytes, t.Recent(t.cfg.DigestEntries))
}

func (t *Tracker) unlink(i int32) {
	s := &t.slots[i]
	if s.prev >= 0 {
		t.slots[s.prev].next = s.next
	} else {
		t.head = s.next
	}
	if s.next >= 0 {
		t.slots[s.next].prev = s.prev
	} else {
		t.tail = s.prev
	}
	s.prev, s.next = -1, -1
}

func (t *Tracker) pushFront(i int32) {
	s := &t.slots[i]
	s.prev, s.next = -1, t.head
	if t.head >= 0 {
		t.slots[t.head].prev = i
	}
	t.head = i
	if t.tail < 0 {
		t.tail = i
	}
}

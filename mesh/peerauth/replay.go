package peerauth

import (
	"sync"
	"time"
)

type replayResult int

const (
	replayNew replayResult = iota
	replaySeen
	replayFull
)

// replayCache remembers the nonces of accepted calls for ttl after they
// arrived (twice the skew: a call's timestamp is at most skew ahead of its
// arrival, and a replay more than skew after that timestamp is refused as
// stale). Entries leave in arrival order, so eviction is a walk from the
// head of a ring. It holds at most max nonces.
type replayCache struct {
	mu   sync.Mutex
	ttl  time.Duration
	max  int
	seen map[[nonceLen]byte]struct{}
	ring []replayEntry
	head int // oldest entry
	n    int // entries in the ring
}

type replayEntry struct {
	nonce   [nonceLen]byte
	expires int64 // unix nanoseconds
}

func newReplayCache(ttl time.Duration, max int) *replayCache {
	return &replayCache{ttl: ttl, max: max, seen: map[[nonceLen]byte]struct{}{}, ring: make([]replayEntry, min(max, 1024))}
}

// add records nonce at now unless it is already known or the cache is full.
func (c *replayCache) add(nonce [nonceLen]byte, now time.Time) replayResult {
	t := now.UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.n > 0 && c.ring[c.head].expires <= t {
		delete(c.seen, c.ring[c.head].nonce)
		c.head = (c.head + 1) % len(c.ring)
		c.n--
	}
	if _, ok := c.seen[nonce]; ok {
		return replaySeen
	}
	if c.n == c.max {
		return replayFull
	}
	if c.n == len(c.ring) {
		c.grow()
	}
	c.ring[(c.head+c.n)%len(c.ring)] = replayEntry{nonce: nonce, expires: t + int64(c.ttl)}
	c.n++
	c.seen[nonce] = struct{}{}
	return replayNew
}

// grow doubles the ring (up to max), keeping the order.
func (c *replayCache) grow() {
	bigger := make([]replayEntry, min(2*len(c.ring), c.max))
	for i := 0; i < c.n; i++ {
		bigger[i] = c.ring[(c.head+i)%len(c.ring)]
	}
	c.ring, c.head = bigger, 0
}

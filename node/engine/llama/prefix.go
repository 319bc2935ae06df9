package llama

import (
	"slices"
	"sync"

	"github.com/infermesh/infermesh/node/engine"
)

// prefixCache keeps the keys and values of finished sequences in
// llama.cpp's KV memory under sequence ids of its own, so a new prompt that
// starts with a cached sequence's tokens gets them with
// llama_memory_seq_cp (in the unified buffer a copy only tags the cells
// with one more sequence id) and prefills only the rest. Entries are whole
// sequences (prompt and answer as fed), evicted least recently used to
// stay within a budget of cells. The scheduler calls it under turnMu.
type prefixCache struct {
	lctx     *Context
	free     []int // free cache sequence ids
	entries  []*prefixEntry
	budget   int // cells the entries may hold
	cells    int
	clock    uint64
	minMatch int
	perCell  int // bytes of one cell (keys and values of every layer)

	mu    sync.Mutex // guards stats (read by PrefixStats)
	stats engine.PrefixStats
}

type prefixEntry struct {
	id     int
	tokens []int64
	used   uint64
}

// newPrefixCache makes a cache over sequence ids [first, first+ids).
func newPrefixCache(lctx *Context, first, ids, budget, bytesPerCell int) *prefixCache {
	c := &prefixCache{lctx: lctx, budget: budget, minMatch: 16, perCell: bytesPerCell}
	for i := first + ids - 1; i >= first; i-- {
		c.free = append(c.free, i)
	}
	c.stats.BudgetBytes = int64(budget) * int64(bytesPerCell)
	c.stats.BlockTokens = 1
	return c
}

func commonPrefix(a, b []int64) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// lookup copies the longest cached prefix of prompt (leaving at least its
// last token to compute) into sequence slot and returns its length (0 on
// a miss).
func (c *prefixCache) lookup(slot int, prompt []int64) int {
	var best *prefixEntry
	m := 0
	for _, e := range c.entries {
		if n := commonPrefix(e.tokens, prompt[:len(prompt)-1]); n > m {
			best, m = e, n
		}
	}
	c.mu.Lock()
	c.stats.Lookups++
	if m < c.minMatch {
		m = 0
	}
	c.stats.HitTokens += uint64(m)
	c.stats.MissTokens += uint64(len(prompt) - m)
	c.mu.Unlock()
	if m == 0 {
		return 0
	}
	c.clock++
	best.used = c.clock
	c.lctx.CopySequence(best.id, slot, 0, m)
	return m
}

// store keeps the KV of sequence slot (tokens, positions 0..len-1) under a
// cache id before the slot is freed. An entry whose tokens are a prefix of
// these is replaced; least recently used entries go to make room.
func (c *prefixCache) store(slot int, tokens []int64) {
	if len(tokens) < c.minMatch || len(tokens) > c.budget {
		return
	}
	for _, e := range c.entries {
		if len(e.tokens) <= len(tokens) && commonPrefix(e.tokens, tokens) == len(e.tokens) {
			c.evict(e)
			break
		}
	}
	for len(c.entries) > 0 && (len(c.free) == 0 || c.cells+len(tokens) > c.budget) {
		lru := c.entries[0]
		for _, e := range c.entries {
			if e.used < lru.used {
				lru = e
			}
		}
		c.evict(lru)
		c.mu.Lock()
		c.stats.Evictions++
		c.mu.Unlock()
	}
	if len(c.free) == 0 {
		return
	}
	id := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	c.lctx.CopySequence(slot, id, -1, -1)
	c.clock++
	c.entries = append(c.entries, &prefixEntry{id: id, tokens: slices.Clone(tokens), used: c.clock})
	c.cells += len(tokens)
	c.mu.Lock()
	c.stats.Inserts++
	c.stats.Blocks = len(c.entries)
	c.stats.Bytes = int64(c.cells) * int64(c.perCell)
	c.mu.Unlock()
}

func (c *prefixCache) evict(e *prefixEntry) {
	c.lctx.RemoveSequence(e.id, -1, -1)
	c.free = append(c.free, e.id)
	c.cells -= len(e.tokens)
	if i := slices.Index(c.entries, e); i >= 0 {
		c.entries = slices.Delete(c.entries, i, i+1)
	}
	c.mu.Lock()
	c.stats.Blocks = len(c.entries)
	c.stats.Bytes = int64(c.cells) * int64(c.perCell)
	c.mu.Unlock()
}

// snapshot returns the counters.
func (c *prefixCache) snapshot() engine.PrefixStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

package onnx

import (
	"slices"
	"sync"

	"github.com/infermesh/infermesh/node/engine"
)

// Prefix cache defaults.
const (
	defaultPrefixCacheMB = 256
	defaultPrefixBlock   = 64
)

// prefixCache keeps the keys and values of recent prompts (and of finished
// sequences) of one model in blocks of a fixed number of tokens, so that a
// prompt sharing a prefix with an earlier one (a system prompt, the
// earlier turns of a conversation) prefills only what follows it.
//
// A block is identified by a chained hash: the hash of its parent block's
// hash and its own token ids, so equal hashes mean equal prefixes (the
// tokens are compared too, so a collision is a miss, never a wrong hit).
// Blocks are evicted least recently used first to stay under the budget;
// a lookup touches every block of the chain it follows, so parents stay
// at least as recent as their children. A block's data is, per layer and
// kind, [kvHeads, block, headDim] float32.
//
// The scheduler goroutine does all lookups and inserts; the mutex is for
// the counters read by PrefixStats from other goroutines.
type prefixCache struct {
	block      int   // tokens per block
	planes     int   // layer-kinds (2 * layers)
	plane      int   // floats per block and layer-kind
	blockBytes int64 // memory of one block
	budget     int64

	mu      sync.Mutex
	blocks  map[uint64]*prefixBlock
	head    prefixBlock // LRU sentinel: head.next is the most recent
	epoch   uint64      // stamps the blocks of the current insert
	free    [][]float32 // planes of evicted blocks, for reuse
	bytes   int64
	counts  engine.PrefixStats
	enabled bool
}

// prefixBlock is one cached block.
type prefixBlock struct {
	hash, parent uint64
	tokens       []int64
	kv           [][]float32 // per layer-kind: [kvHeads, block, headDim]
	epoch        uint64
	prev, next   *prefixBlock
}

// newPrefixCache builds a cache of budget bytes for a model of the given
// shape; a budget below one block disables it.
func newPrefixCache(budget int64, block, layers, kvHeads, headDim int) *prefixCache {
	c := &prefixCache{block: block, planes: 2 * layers, plane: kvHeads * block * headDim, budget: budget, blocks: map[uint64]*prefixBlock{}}
	c.blockBytes = int64(c.planes) * int64(c.plane) * 4
	c.enabled = budget >= c.blockBytes
	c.head.next, c.head.prev = &c.head, &c.head
	return c
}

// chainHash is FNV-1a over the parent's hash and the block's token ids
// (each as 8 little-endian bytes): stable across processes and nodes.
func chainHash(parent uint64, tokens []int64) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	mix := func(v uint64) {
		for range 8 {
			h ^= v & 0xff
			h *= prime
			v >>= 8
		}
	}
	mix(parent)
	for _, t := range tokens {
		mix(uint64(t))
	}
	return h
}

func (c *prefixCache) unlink(b *prefixBlock) {
	b.prev.next, b.next.prev = b.next, b.prev
	b.prev, b.next = nil, nil
}

func (c *prefixCache) pushFront(b *prefixBlock) {
	b.prev, b.next = &c.head, c.head.next
	c.head.next.prev = b
	c.head.next = b
}

func (c *prefixCache) touch(b *prefixBlock) {
	c.unlink(b)
	c.pushFront(b)
}

// find returns the cached block that continues parent with tokens.
func (c *prefixCache) find(parent uint64, tokens []int64) (*prefixBlock, uint64) {
	h := chainHash(parent, tokens)
	b := c.blocks[h]
	if b == nil || b.parent != parent || !slices.Equal(b.tokens, tokens) {
		return nil, h
	}
	return b, h
}

// lookup returns the longest chain of cached blocks that prefixes prompt,
// leaving at least one token to compute (its logits start the answer).
// The blocks' data stays valid until the next insert (the caller copies
// it at once).
func (c *prefixCache) lookup(prompt []int64) []*prefixBlock {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled {
		return nil
	}
	c.counts.Lookups++
	var chain []*prefixBlock
	parent := uint64(0)
	for i := 0; (i+1)*c.block < len(prompt); i++ {
		b, _ := c.find(parent, prompt[i*c.block:(i+1)*c.block])
		if b == nil {
			break
		}
		c.touch(b)
		chain = append(chain, b)
		parent = b.hash
	}
	hit := len(chain) * c.block
	c.counts.HitTokens += uint64(hit)
	c.counts.MissTokens += uint64(len(prompt) - hit)
	return chain
}

// insert stores the full blocks of tokens whose keys and values plane
// returns: plane(i, h) is layer-kind i's head h as [len(tokens), headDim]
// (at least). Blocks already cached are touched, not copied. It stops
// early rather than evict a block of the chain it is inserting.
func (c *prefixCache) insert(tokens []int64, headDim int, plane func(i, h int) []float32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled {
		return
	}
	c.epoch++
	heads := c.plane / (c.block * headDim)
	parent := uint64(0)
	for i := 0; (i+1)*c.block <= len(tokens); i++ {
		toks := tokens[i*c.block : (i+1)*c.block]
		b, h := c.find(parent, toks)
		if b != nil {
			b.epoch = c.epoch
			c.touch(b)
			parent = b.hash
			continue
		}
		if c.blocks[h] != nil {
			return // a hash collision: leave the resident block alone
		}
		for c.bytes+c.blockBytes > c.budget {
			last := c.head.prev
			if last == &c.head || last.epoch == c.epoch {
				return
			}
			c.evict(last)
		}
		b = &prefixBlock{hash: h, parent: parent, tokens: slices.Clone(toks), epoch: c.epoch, kv: make([][]float32, c.planes)}
		for p := range b.kv {
			if n := len(c.free); n > 0 {
				b.kv[p], c.free = c.free[n-1], c.free[:n-1]
			} else {
				b.kv[p] = make([]float32, c.plane)
			}
			for hd := range heads {
				src := plane(p, hd)[i*c.block*headDim : (i+1)*c.block*headDim]
				copy(b.kv[p][hd*c.block*headDim:], src)
			}
		}
		c.blocks[h] = b
		c.pushFront(b)
		c.bytes += c.blockBytes
		c.counts.Inserts++
		parent = h
	}
}

// evict drops b and keeps its planes for reuse.
func (c *prefixCache) evict(b *prefixBlock) {
	c.unlink(b)
	delete(c.blocks, b.hash)
	c.free = append(c.free, b.kv...)
	if keep := 2 * c.planes; len(c.free) > keep {
		c.free = c.free[:keep]
	}
	c.bytes -= c.blockBytes
	c.counts.Evictions++
}

// stats returns the counters.
func (c *prefixCache) stats() engine.PrefixStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.counts
	s.Blocks, s.Bytes, s.BlockTokens = len(c.blocks), c.bytes, c.block
	if c.enabled {
		s.BudgetBytes = c.budget
	}
	return s
}

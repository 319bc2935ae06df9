package tokenizer

import (
	"container/heap"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// BPE is Hugging Face's byte-pair-encoding model: a word starts as one
// symbol per character and the merge with the lowest rank among adjacent
// pairs is applied until none is left. With a ByteLevel pre-tokenizer the
// characters are byte stand-ins, so every input is covered.
type BPE struct {
	vocab  map[string]int64
	merges map[uint64]bpeMerge // (left id, right id) -> merge
	unk    int64               // -1: unknown characters are dropped
	// fuseUnk joins runs of unknown characters into one unk token.
	fuseUnk bool
	// byteFallback spells an unknown character as <0xXX> byte tokens.
	byteFallback bool
	// ignoreMerges takes a word that is in the vocabulary as one token.
	ignoreMerges bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix

	mu    sync.RWMutex
	cache map[string][]int64 // word -> ids, bounded by bpeCacheEntries
}

type bpeMerge struct {
	rank int32
	id   int64
}

// bpeCacheEntries bounds the word cache; it is cleared when full.
// bpeCacheWordBytes: longer words are not cached.
const (
	bpeCacheEntries   = 1 << 14
	bpeCacheWordBytes = 64
)

// BPEConfig is the "model" section of a BPE tokenizer.json.
type BPEConfig struct {
	// Vocab maps each token to its id.
	Vocab map[string]int64
	// Merges are the merge rules in rank order, each a pair of tokens.
	Merges [][2]string
	// UnkToken is the token for characters outside the vocabulary; ""
	// drops them.
	UnkToken string
	// FuseUnk joins runs of unknown characters into one UnkToken.
	FuseUnk bool
	// ByteFallback spells an unknown character as <0xXX> byte tokens
	// when the vocabulary has them, before resorting to UnkToken.
	ByteFallback bool
	// IgnoreMerges takes a word that is in the vocabulary as one token,
	// without merging.
	IgnoreMerges bool
	// ContinuingSubwordPrefix is put before every character but a word's
	// first, e.g. "##" ("": none).
	ContinuingSubwordPrefix string
	// EndOfWordSuffix is put after a word's last character, e.g. "</w>"
	// ("": none).
	EndOfWordSuffix string
}

// NewBPE builds a BPE model. Every merge's parts and result must be in the
// vocabulary, as Hugging Face requires.
func NewBPE(c BPEConfig) (*BPE, error) {
	m := &BPE{
		vocab:        c.Vocab,
		merges:       make(map[uint64]bpeMerge, len(c.Merges)),
		unk:          -1,
		fuseUnk:      c.FuseUnk,
		byteFallback: c.ByteFallback,
		ignoreMerges: c.IgnoreMerges,
		prefix:       c.ContinuingSubwordPrefix,
		suffix:       c.EndOfWordSuffix,
		cache:        map[string][]int64{},
	}
	if c.UnkToken != "" {
		id, ok := c.Vocab[c.UnkToken]
		if !ok {
			return nil, fmt.Errorf("bpe: unk_token %q is not in the vocabulary", c.UnkToken)
		}
		m.unk = id
	}
	if len(c.Merges) >= 1<<31 {
		return nil, fmt.Errorf("bpe: too many merges")
	}
	for rank, pair := range c.Merges {
		a, okA := c.Vocab[pair[0]]
		b, okB := c.Vocab[pair[1]]
		if !okA || !okB {
			return nil, fmt.Errorf("bpe: merge %d (%q %q) uses a token that is not in the vocabulary", rank, pair[0], pair[1])
		}
		merged := pair[0] + strings.TrimPrefix(pair[1], m.prefix)
		id, ok := c.Vocab[merged]
		if !ok {
			return nil, fmt.Errorf("bpe: merge %d (%q %q) makes %q, which is not in the vocabulary", rank, pair[0], pair[1], merged)
		}
		key := pairKey(a, b)
		if _, dup := m.merges[key]; !dup { // the first (lowest) rank wins
			m.merges[key] = bpeMerge{rank: int32(rank), id: id}
		}
	}
	return m, nil
}

func pairKey(a, b int64) uint64 { return uint64(a)<<32 | uint64(b) }

// parseMerges reads merges in either serialised form: "a b" strings (older
// files) or ["a", "b"] arrays (newer files, which allow spaces in tokens).
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("bpe merges: %w", err)
	}
	out := make([][2]string, len(items))
	for i, it := range items {
		var s string
		if err := json.Unmarshal(it, &s); err == nil {
			a, b, ok := strings.Cut(s, " ")
			if !ok || a == "" || b == "" || strings.Contains(b, " ") {
				return nil, fmt.Errorf("bpe merge %d %q: want two tokens separated by one space", i, s)
			}
			out[i] = [2]string{a, b}
			continue
		}
		var pair []string
		if err := json.Unmarshal(it, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("bpe merge %d: want \"a b\" or [\"a\", \"b\"]", i)
		}
		out[i] = [2]string{pair[0], pair[1]}
	}
	return out, nil
}

// TokenToID looks token up in the vocabulary.
func (m *BPE) TokenToID(token string) (int64, bool) {
	id, ok := m.vocab[token]
	return id, ok
}

// Tokens returns the vocabulary.
func (m *BPE) Tokens() map[string]int64 { return m.vocab }

// Tokenize appends the BPE ids of word to dst.
func (m *BPE) Tokenize(word string, dst []int64) []int64 {
	if word == "" {
		return dst
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(dst, id)
		}
	}
	cacheable := len(word) <= bpeCacheWordBytes
	if cacheable {
		m.mu.RLock()
		ids, ok := m.cache[word]
		m.mu.RUnlock()
		if ok {
			return append(dst, ids...)
		}
	}
	mark := len(dst)
	dst = m.merge(m.symbols(word), dst)
	if cacheable {
		ids := append([]int64(nil), dst[mark:]...)
		m.mu.Lock()
		if len(m.cache) >= bpeCacheEntries {
			clear(m.cache)
		}
		m.cache[word] = ids
		m.mu.Unlock()
	}
	return dst
}

// symbol is one element of a word during merging, in a doubly linked list.
type symbol struct {
	id         int64
	prev, next int // indexes into the word's symbols; -1 at the ends
	dead       bool
}

// symbols turns word into its initial symbols: one per character (with the
// subword prefix after the first and the suffix on the last), <0xXX> bytes
// or unk for characters outside the vocabulary.
func (m *BPE) symbols(word string) []symbol {
	syms := make([]symbol, 0, len(word))
	lastUnk := false
	var key []byte
	for i, r := range word {
		size := utf8.RuneLen(r)
		if r == utf8.RuneError {
			_, size = utf8.DecodeRuneInString(word[i:])
		}
		key = key[:0]
		if i > 0 {
			key = append(key, m.prefix...)
		}
		key = append(key, word[i:i+size]...)
		if i+size == len(word) {
			key = append(key, m.suffix...)
		}
		if id, ok := m.vocab[string(key)]; ok {
			syms = append(syms, symbol{id: id})
			lastUnk = false
			continue
		}
		if m.byteFallback {
			ok := true
			var ids []int64
			for j := i; j < i+size; j++ {
				id, found := m.vocab[fmt.Sprintf("<0x%02X>", word[j])]
				if !found {
					ok = false
					break
				}
				ids = append(ids, id)
			}
			if ok {
				for _, id := range ids {
					syms = append(syms, symbol{id: id})
				}
				lastUnk = false
				continue
			}
		}
		if m.unk < 0 {
			continue // no unk token: the character is dropped, as in Hugging Face
		}
		if m.fuseUnk && lastUnk {
			continue
		}
		syms = append(syms, symbol{id: m.unk})
		lastUnk = true
	}
	for i := range syms {
		syms[i].prev, syms[i].next = i-1, i+1
	}
	if n := len(syms); n > 0 {
		syms[n-1].next = -1
	}
	return syms
}

// candidate is a possible merge of the symbol at pos with its successor.
type candidate struct {
	rank   int32
	pos    int
	left   int64 // the ids the pair had when queued, to spot stale entries
	right  int64
	result int64
}

type candidateHeap []candidate

func (h candidateHeap) Len() int { return len(h) }
func (h candidateHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h candidateHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *candidateHeap) Push(x any)   { *h = append(*h, x.(candidate)) }
func (h *candidateHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// merge applies merges lowest rank first (leftmost on ties) in
// O(n log n) and appends the resulting ids to dst.
func (m *BPE) merge(syms []symbol, dst []int64) []int64 {
	h := make(candidateHeap, 0, len(syms))
	push := func(pos int) {
		next := syms[pos].next
		if next < 0 {
			return
		}
		if mg, ok := m.merges[pairKey(syms[pos].id, syms[next].id)]; ok {
			h = append(h, candidate{rank: mg.rank, pos: pos, left: syms[pos].id, right: syms[next].id, result: mg.id})
		}
	}
	for i := range syms {
		push(i)
	}
	heap.Init(&h)
	for h.Len() > 0 {
		c := heap.Pop(&h).(candidate)
		s := &syms[c.pos]
		if s.dead || s.id != c.left || s.next < 0 || syms[s.next].id != c.right {
			continue // stale: one side was merged since
		}
		next := &syms[s.next]
		s.id = c.result
		next.dead = true
		s.next = next.next
		if s.next >= 0 {
			syms[s.next].prev = c.pos
		}
		if s.prev >= 0 {
			if mg, ok := m.merges[pairKey(syms[s.prev].id, s.id)]; ok {
				heap.Push(&h, candidate{rank: mg.rank, pos: s.prev, left: syms[s.prev].id, right: s.id, result: mg.id})
			}
		}
		if s.next >= 0 {
			if mg, ok := m.merges[pairKey(s.id, syms[s.next].id)]; ok {
				heap.Push(&h, candidate{rank: mg.rank, pos: c.pos, left: s.id, right: syms[s.next].id, result: mg.id})
			}
		}
	}
	for i := 0; i >= 0 && i < len(syms); i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	return dst
}

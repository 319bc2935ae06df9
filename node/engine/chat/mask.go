package chat

import (
	"slices"

	"github.com/infermesh/infermesh/node/engine/tokenizer"
)

// Vocab is a model's tokens as bytes, computed once per model, with a
// byte trie over them so a constrained step tests every token by walking
// the trie from the current grammar state: a prefix the grammar rejects
// rules out every token under it at once.
type Vocab struct {
	tokens [][]byte // per id; nil for ids that never appear in constrained text
	nodes  []trieNode
}

type trieNode struct {
	edges []trieEdge // sorted by byte
	ids   []int32    // tokens that end here
}

type trieEdge struct {
	b     byte
	child int32
}

// NewVocab reads every id below tok.VocabSize(): special tokens and ids
// without text are left out of constrained generation.
func NewVocab(tok *tokenizer.Tokenizer) *Vocab {
	v := &Vocab{tokens: make([][]byte, tok.VocabSize()), nodes: []trieNode{{}}}
	for id := range v.tokens {
		if tok.IsSpecial(int64(id)) {
			continue
		}
		b := tok.TokenBytes(int64(id))
		if len(b) == 0 {
			continue
		}
		v.tokens[id] = b
		v.insert(b, int32(id))
	}
	return v
}

func (v *Vocab) insert(b []byte, id int32) {
	n := int32(0)
	for _, c := range b {
		edges := v.nodes[n].edges
		i, found := slices.BinarySearchFunc(edges, c, func(e trieEdge, c byte) int { return int(e.b) - int(c) })
		if !found {
			v.nodes = append(v.nodes, trieNode{})
			child := int32(len(v.nodes) - 1)
			v.nodes[n].edges = slices.Insert(v.nodes[n].edges, i, trieEdge{b: c, child: child})
			n = child
			continue
		}
		n = edges[i].child
	}
	v.nodes[n].ids = append(v.nodes[n].ids, id)
}

// Bytes returns the text of id (nil for ids left out).
func (v *Vocab) Bytes(id int64) []byte {
	if id < 0 || id >= int64(len(v.tokens)) {
		return nil
	}
	return v.tokens[id]
}

// Size is the number of ids covered.
func (v *Vocab) Size() int { return len(v.tokens) }

// Allow sets mask[id] for every token that can follow state s and still
// leave room to finish the text within budget-1 more tokens (every byte is
// a token of its own in a byte-level vocabulary, so k bytes take at most k
// tokens); the eos ids are allowed when the text is already complete. It
// clears mask first and returns how many ids it allowed.
func (v *Vocab) Allow(s State, budget int, eos []int64, mask []bool) int {
	clear(mask)
	count := 0
	var walk func(n int32, st State)
	walk = func(n int32, st State) {
		node := &v.nodes[n]
		if len(node.ids) > 0 && st.MinClose() <= budget-1 {
			for _, id := range node.ids {
				if int(id) < len(mask) && !mask[id] {
					mask[id] = true
					count++
				}
			}
		}
		for _, e := range node.edges {
			if next, ok := st.Step(e.b); ok {
				walk(e.child, next)
			}
		}
	}
	walk(0, s)
	if s.Accepting() {
		for _, id := range eos {
			if id >= 0 && int(id) < len(mask) && !mask[id] {
				mask[id] = true
				count++
			}
		}
	}
	return count
}

package tokenizer

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/rivo/uniseg"
)

// Precompiled is Hugging Face's Precompiled normalizer: SentencePiece's
// compiled normalization rules (XLM-R's and T5's "nmt_nfkc" charsmap).
// The charsmap is a little-endian uint32 size, a darts-clone double-array
// trie of that many bytes whose values index the second part, and the
// replacement strings, each ended by a NUL byte.
//
// Normalize works as Hugging Face's does (not as SentencePiece's own
// longest-match loop): the text is cut into extended grapheme clusters; a
// cluster shorter than 6 bytes with a trie entry for one of its prefixes
// is replaced by the replacement of the shortest such prefix, and any
// other cluster is rewritten character by character.
type Precompiled struct {
	array      []uint32 // double-array units
	normalized []byte   // NUL-terminated replacement strings
}

// NewPrecompiled reads a precompiled charsmap.
func NewPrecompiled(charsmap []byte) (*Precompiled, error) {
	if len(charsmap) < 4 {
		return nil, fmt.Errorf("precompiled charsmap: %d bytes, too short", len(charsmap))
	}
	size := binary.LittleEndian.Uint32(charsmap)
	rest := charsmap[4:]
	if size%4 != 0 || uint64(size) > uint64(len(rest)) || size == 0 {
		return nil, fmt.Errorf("precompiled charsmap: trie size %d does not fit %d bytes", size, len(rest))
	}
	p := &Precompiled{array: make([]uint32, size/4), normalized: rest[size:]}
	for i := range p.array {
		p.array[i] = binary.LittleEndian.Uint32(rest[4*i:])
	}
	return p, nil
}

// Double-array unit fields, as darts-clone packs them.
func unitHasLeaf(u uint32) bool  { return (u>>8)&1 == 1 }
func unitValue(u uint32) uint32  { return u & (1<<31 - 1) }
func unitLabel(u uint32) uint32  { return u & (1<<31 | 0xFF) }
func unitOffset(u uint32) uint32 { return (u >> 10) << ((u & (1 << 9)) >> 6) }

// firstMatch returns the value of the shortest key that is a prefix of
// key, as Hugging Face's common_prefix_search()[0] does.
func (p *Precompiled) firstMatch(key string) (uint32, bool) {
	pos := uint32(0)
	if len(p.array) == 0 {
		return 0, false
	}
	pos ^= unitOffset(p.array[0])
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c == 0 {
			break
		}
		pos ^= uint32(c)
		if pos >= uint32(len(p.array)) {
			return 0, false
		}
		u := p.array[pos]
		if unitLabel(u) != uint32(c) {
			return 0, false
		}
		pos ^= unitOffset(u)
		if pos >= uint32(len(p.array)) {
			return 0, false
		}
		if unitHasLeaf(u) {
			return unitValue(p.array[pos]), true
		}
	}
	return 0, false
}

// transform returns the replacement of chunk's shortest matching prefix.
func (p *Precompiled) transform(chunk string) (string, bool) {
	v, ok := p.firstMatch(chunk)
	if !ok || int(v) > len(p.normalized) {
		return "", false
	}
	end := int(v)
	for end < len(p.normalized) && p.normalized[end] != 0 {
		end++
	}
	return string(p.normalized[v:end]), true
}

// Normalize rewrites s with the charsmap.
func (p *Precompiled) Normalize(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	g := uniseg.NewGraphemes(s)
	for g.Next() {
		cluster := g.Str()
		if len(cluster) < 6 {
			if n, ok := p.transform(cluster); ok {
				b.WriteString(n)
				continue
			}
		}
		for i, r := range cluster {
			part := cluster[i : i+len(string(r))]
			if n, ok := p.transform(part); ok {
				b.WriteString(n)
			} else {
				b.WriteString(part)
			}
		}
	}
	return b.String()
}

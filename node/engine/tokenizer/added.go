package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// AddedToken is an entry of tokenizer.json's "added_tokens": a string that
// is cut out of the text as one token before the model sees it.
type AddedToken struct {
	// ID is the token's id.
	ID int64 `json:"id"`
	// Content is the exact text the token stands for.
	Content string `json:"content"`
	// SingleWord matches only when not inside a word.
	SingleWord bool `json:"single_word"`
	// LStrip lets the match absorb the whitespace on its left.
	LStrip bool `json:"lstrip"`
	// RStrip lets the match absorb the whitespace on its right.
	RStrip bool `json:"rstrip"`
	// Normalized tokens are matched in the normalised text; the others in
	// the raw text.
	Normalized bool `json:"normalized"`
	// Special marks control tokens such as [CLS].
	Special bool `json:"special"`
}

// segment is a piece of text that is either an added token (id >= 0) or
// plain text still to be tokenized (id < 0).
type segment struct {
	text string
	id   int64
}

// matcher finds added tokens in text: leftmost match first, the longest
// token at that position, like Hugging Face's Aho-Corasick with
// LeftmostLongest semantics.
type matcher struct {
	root trieNode
	any  bool
}

type trieNode struct {
	next  map[byte]*trieNode
	token *AddedToken // set when a token ends here
}

// add registers the token under pattern (its content, normalised or not).
func (m *matcher) add(pattern string, tok *AddedToken) {
	if pattern == "" {
		return
	}
	n := &m.root
	for i := 0; i < len(pattern); i++ {
		if n.next == nil {
			n.next = map[byte]*trieNode{}
		}
		c, ok := n.next[pattern[i]]
		if !ok {
			c = &trieNode{}
			n.next[pattern[i]] = c
		}
		n = c
	}
	n.token = tok
	m.any = true
}

// longestAt returns the longest token matching s at i and its end.
func (m *matcher) longestAt(s string, i int) (*AddedToken, int) {
	var best *AddedToken
	end := 0
	n := &m.root
	for j := i; j < len(s) && n.next != nil; j++ {
		n = n.next[s[j]]
		if n == nil {
			break
		}
		if n.token != nil {
			best, end = n.token, j+1
		}
	}
	return best, end
}

// split cuts s into added-token and plain segments, honouring single_word,
// lstrip and rstrip as Hugging Face does.
func (m *matcher) split(s string, out []segment) []segment {
	if !m.any {
		return append(out, segment{text: s, id: -1})
	}
	done := 0 // s[:done] has been emitted
	for i := 0; i < len(s); {
		tok, end := m.longestAt(s, i)
		if tok == nil {
			i++
			continue
		}
		start, stop := i, end
		if tok.SingleWord && (endsWithWordChar(s[:start]) || startsWithWordChar(s[stop:])) {
			i = end // matches do not overlap, as with Aho-Corasick's iterator
			continue
		}
		if tok.LStrip {
			for start > done {
				r, size := utf8.DecodeLastRuneInString(s[:start])
				if !unicode.IsSpace(r) {
					break
				}
				start -= size
			}
		}
		if tok.RStrip {
			for stop < len(s) {
				r, size := utf8.DecodeRuneInString(s[stop:])
				if !unicode.IsSpace(r) {
					break
				}
				stop += size
			}
		}
		if done < start {
			out = append(out, segment{text: s[done:start], id: -1})
		}
		out = append(out, segment{text: s[start:stop], id: tok.ID})
		done, i = stop, stop
	}
	if done < len(s) {
		out = append(out, segment{text: s[done:], id: -1})
	}
	return out
}

func isWordChar(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r)
}

func endsWithWordChar(s string) bool {
	r, size := utf8.DecodeLastRuneInString(s)
	return size > 0 && isWordChar(r)
}

func startsWithWordChar(s string) bool {
	r, size := utf8.DecodeRuneInString(s)
	return size > 0 && isWordChar(r)
}

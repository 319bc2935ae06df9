package tokenizer

import (
	"iter"
	"strings"
	"unicode"
	"unicode/utf8"
)

// PreTokenizer splits normalised text into the words a Model encodes.
// Words are yielded in order and are never empty.
type PreTokenizer interface {
	// Words yields the words of s.
	Words(s string) iter.Seq[string]
}

// BertPreTokenizer is Hugging Face's BertPreTokenizer: whitespace separates
// words and is dropped; every punctuation character is a word of its own.
type BertPreTokenizer struct{}

// Words yields the words of s.
func (BertPreTokenizer) Words(s string) iter.Seq[string] {
	return func(yield func(string) bool) {
		start := -1 // start of the current word, -1 when none
		for i, r := range s {
			ws, punct := unicode.IsSpace(r), isBertPunct(r)
			if !ws && !punct {
				if start < 0 {
					start = i
				}
				continue
			}
			if start >= 0 {
				if !yield(s[start:i]) {
					return
				}
				start = -1
			}
			if punct && !yield(s[i:i+utf8.RuneLen(r)]) {
				return
			}
		}
		if start >= 0 {
			yield(s[start:])
		}
	}
}

// WhitespaceSplit is Hugging Face's WhitespaceSplit: words are the runs of
// non-whitespace characters.
type WhitespaceSplit struct{}

// Words yields the whitespace-separated words of s.
func (WhitespaceSplit) Words(s string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for w := range strings.FieldsSeq(s) {
			if !yield(w) {
				return
			}
		}
	}
}

// isBertPunct is ASCII punctuation (which includes symbols such as $ and +)
// or any Unicode punctuation character.
func isBertPunct(r rune) bool {
	if r < utf8.RuneSelf {
		return r >= '!' && r <= '/' || r >= ':' && r <= '@' || r >= '[' && r <= '`' || r >= '{' && r <= '~'
	}
	return unicode.IsPunct(r)
}

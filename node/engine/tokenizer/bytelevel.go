package tokenizer

import (
	"iter"
	"strings"
	"unicode/utf8"
)

// gpt2Pattern is the word-splitting expression of GPT-2's byte-level BPE,
// which Hugging Face's ByteLevel pre-tokenizer applies when use_regex is set.
// `\s+(?!\S)` needs look-ahead, hence regexp2 rather than Go's regexp.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// byteLevelAlphabet maps each byte to the printable character that stands
// for it in byte-level vocabularies (GPT-2's bytes_to_unicode): printable
// Latin-1 bytes stand for themselves, the others for U+0100 onwards.
type byteLevelAlphabet struct {
	enc [256]rune
	dec map[rune]byte
}

// newByteLevelAlphabet builds GPT-2's byte <-> character table.
func newByteLevelAlphabet() *byteLevelAlphabet {
	a := &byteLevelAlphabet{dec: make(map[rune]byte, 256)}
	printable := func(b int) bool {
		return b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF
	}
	n := 0
	for b := range 256 {
		r := rune(b)
		if !printable(b) {
			r = rune(256 + n)
			n++
		}
		a.enc[b] = r
		a.dec[r] = byte(b)
	}
	return a
}

// encode maps every byte of s to its character.
func (a *byteLevelAlphabet) encode(s string) string {
	var b strings.Builder
	b.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		b.WriteRune(a.enc[s[i]])
	}
	return b.String()
}

// decode maps the characters of token back to bytes. A token with a
// character outside the alphabet (an added token such as "<|im_end|>" is
// inside it; one with a space is not) is taken as its own UTF-8 bytes, as
// Hugging Face's ByteLevel decoder does.
func (a *byteLevelAlphabet) decode(dst []byte, token string) []byte {
	mark := len(dst)
	for _, r := range token {
		b, ok := a.dec[r]
		if !ok {
			return append(dst[:mark], token...)
		}
		dst = append(dst, b)
	}
	return dst
}

// ByteLevel is Hugging Face's ByteLevel pre-tokenizer: optionally a space in
// front of the text, optionally GPT-2's word split, then every byte of each
// word mapped to its printable stand-in, so a BPE vocabulary over 256
// symbols covers any input.
type ByteLevel struct {
	// AddPrefixSpace puts a space in front of a text that does not start
	// with one, so the first word is encoded like the others.
	AddPrefixSpace bool
	// UseRegex splits words with GPT-2's pattern first.
	UseRegex bool

	alphabet *byteLevelAlphabet
	split    *Split // GPT-2's pattern, Isolated; nil unless UseRegex
}

// NewByteLevel builds a ByteLevel pre-tokenizer.
func NewByteLevel(addPrefixSpace, useRegex bool) (*ByteLevel, error) {
	b := &ByteLevel{AddPrefixSpace: addPrefixSpace, UseRegex: useRegex, alphabet: newByteLevelAlphabet()}
	if useRegex {
		s, err := NewSplit(gpt2Pattern, true, SplitIsolated, false)
		if err != nil {
			return nil, err
		}
		b.split = s
	}
	return b, nil
}

// Words yields the byte-level encoded words of s.
func (b *ByteLevel) Words(s string) iter.Seq[string] {
	return func(yield func(string) bool) {
		if s == "" {
			return
		}
		if b.AddPrefixSpace && !strings.HasPrefix(s, " ") {
			s = " " + s
		}
		if b.split == nil {
			yield(b.alphabet.encode(s))
			return
		}
		for w := range b.split.Words(s) {
			if !yield(b.alphabet.encode(w)) {
				return
			}
		}
	}
}

// Digits is Hugging Face's Digits pre-tokenizer: runs of digits are split
// from the rest, and with IndividualDigits every digit is a word of its own.
type Digits struct {
	// IndividualDigits makes every digit a word of its own instead of
	// keeping runs of digits together.
	IndividualDigits bool
}

// Words yields s cut around its digits.
func (d Digits) Words(s string) iter.Seq[string] {
	return func(yield func(string) bool) {
		start := 0
		prevDigit := false
		for i, r := range s {
			digit := isNumeric(r)
			if i > start && (digit != prevDigit || digit && d.IndividualDigits) {
				if !yield(s[start:i]) {
					return
				}
				start = i
			}
			prevDigit = digit
		}
		if start < len(s) {
			yield(s[start:])
		}
	}
}

// isNumeric is Rust's char::is_numeric (Unicode Nd, Nl and No), which
// Hugging Face's Digits pre-tokenizer uses.
func isNumeric(r rune) bool {
	if r < utf8.RuneSelf {
		return r >= '0' && r <= '9'
	}
	return isUnicodeNumber(r)
}

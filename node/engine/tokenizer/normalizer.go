package tokenizer

import (
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// Normalizer rewrites text before it is split into words.
type Normalizer interface {
	// Normalize returns s rewritten, e.g. lowercased or in a Unicode
	// normalization form.
	Normalize(s string) string
}

// BertNormalizer is Hugging Face's BertNormalizer.
type BertNormalizer struct {
	// CleanText drops NUL, U+FFFD and control/format characters and turns
	// every whitespace character into a plain space.
	CleanText bool
	// HandleChineseChars puts spaces around CJK ideographs so each becomes
	// a word of its own.
	HandleChineseChars bool
	// StripAccents decomposes (NFD) and drops non-spacing marks.
	StripAccents bool
	// Lowercase lowercases every character.
	Lowercase bool
}

// Normalize applies the enabled steps in Hugging Face's order: clean,
// CJK spacing, accent stripping, lowercasing.
func (n BertNormalizer) Normalize(s string) string {
	if n.CleanText || n.HandleChineseChars {
		var b strings.Builder
		b.Grow(len(s))
		for _, r := range s {
			if n.CleanText {
				if r == 0 || r == unicode.ReplacementChar || isControl(r) {
					continue
				}
				if isWhitespace(r) {
					r = ' '
				}
			}
			if n.HandleChineseChars && isChineseChar(r) {
				b.WriteByte(' ')
				b.WriteRune(r)
				b.WriteByte(' ')
				continue
			}
			b.WriteRune(r)
		}
		s = b.String()
	}
	if n.StripAccents {
		s = stripAccents(s)
	}
	if n.Lowercase {
		s = lowercase(s)
	}
	return s
}

// Lowercase is Hugging Face's Lowercase normalizer.
type Lowercase struct{}

// Normalize lowercases s.
func (Lowercase) Normalize(s string) string { return lowercase(s) }

// StripAccents is Hugging Face's StripAccents normalizer: it drops
// non-spacing marks (it is meant to follow NFD).
type StripAccents struct{}

// Normalize removes non-spacing marks from s.
func (StripAccents) Normalize(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.Is(unicode.Mn, r) {
			return -1
		}
		return r
	}, s)
}

// UnicodeForm is one of Hugging Face's NFC, NFD, NFKC and NFKD normalizers.
type UnicodeForm struct {
	// Form is the normalization form: norm.NFC, NFD, NFKC or NFKD.
	Form norm.Form
}

// Normalize puts s into the form.
func (u UnicodeForm) Normalize(s string) string { return u.Form.String(s) }

// NormalizerSequence applies normalizers one after another.
type NormalizerSequence []Normalizer

// Normalize runs every normalizer in order.
func (seq NormalizerSequence) Normalize(s string) string {
	for _, n := range seq {
		s = n.Normalize(s)
	}
	return s
}

// stripAccents decomposes s and drops the non-spacing marks.
func stripAccents(s string) string {
	return StripAccents{}.Normalize(norm.NFD.String(s))
}

// lowercase maps each character to its full lowercase form, as Rust's
// char::to_lowercase does (U+0130 is the only unconditional multi-character
// lowercase mapping; there is no final-sigma context, matching Hugging Face).
func lowercase(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r == 0x130 {
			b.WriteString("i\u0307")
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// isWhitespace is the BERT notion of whitespace (Unicode White_Space).
func isWhitespace(r rune) bool {
	switch r {
	case '\t', '\n', '\r', ' ':
		return true
	}
	return unicode.IsSpace(r)
}

// isControl is Unicode category "Other" (Cc, Cf, Co, Cs and unassigned)
// except tab, newline and carriage return, as Hugging Face defines it.
func isControl(r rune) bool {
	switch r {
	case '\t', '\n', '\r':
		return false
	}
	if unicode.Is(unicode.C, r) {
		return true
	}
	return !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z)
}

// isChineseChar reports whether r is in the CJK Unified Ideographs blocks
// BERT spaces out.
func isChineseChar(r rune) bool {
	switch {
	case r >= 0x4E00 && r <= 0x9FFF,
		r >= 0x3400 && r <= 0x4DBF,
		r >= 0x20000 && r <= 0x2A6DF,
		r >= 0x2A700 && r <= 0x2B73F,
		r >= 0x2B740 && r <= 0x2B81F,
		r >= 0x2B920 && r <= 0x2CEAF,
		r >= 0xF900 && r <= 0xFAFF,
		r >= 0x2F800 && r <= 0x2FA1F:
		return true
	}
	return false
}

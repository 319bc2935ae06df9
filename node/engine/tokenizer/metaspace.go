package tokenizer

import (
	"fmt"
	"iter"
	"strings"
	"unsafe"

	"github.com/dlclark/regexp2"
)

// Prepend is Hugging Face's Prepend normalizer (Llama-2 and Mistral put
// "▁" in front of every text this way): a non-empty text gets Prefix in
// front; an empty one stays empty.
type Prepend struct {
	// Prefix is put in front of the text.
	Prefix string
}

// Normalize prepends the prefix to a non-empty s.
func (p Prepend) Normalize(s string) string {
	if s == "" {
		return s
	}
	return p.Prefix + s
}

// Replace is Hugging Face's Replace normalizer: every match of a literal
// or of a regular expression is replaced by Content (taken literally).
type Replace struct {
	// Content replaces every match.
	Content string

	literal string
	re      *regexp2.Regexp // nil for a literal pattern
}

// NewReplace builds a Replace normalizer; isRegex selects a regular
// expression (Oniguruma-like syntax, run by regexp2) over a literal.
func NewReplace(pattern string, isRegex bool, content string) (*Replace, error) {
	r := &Replace{Content: content, literal: pattern}
	if !isRegex {
		if pattern == "" {
			return nil, fmt.Errorf("replace: empty pattern")
		}
		return r, nil
	}
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("replace: pattern %q: %w", pattern, err)
	}
	r.re = re
	return r, nil
}

// Normalize replaces every match in s.
func (r *Replace) Normalize(s string) string {
	if r.re == nil {
		return strings.ReplaceAll(s, r.literal, r.Content)
	}
	out, err := r.re.ReplaceFunc(s, func(regexp2.Match) string { return r.Content }, -1, -1)
	if err != nil { // only a match timeout, which is not set
		return s
	}
	return out
}

// StripNormalizer is Hugging Face's Strip normalizer: it removes
// whitespace from the left and/or right end of the text.
type StripNormalizer struct {
	// Left strips leading whitespace.
	Left bool
	// Right strips trailing whitespace.
	Right bool
}

// Normalize strips s.
func (n StripNormalizer) Normalize(s string) string {
	if n.Left {
		s = strings.TrimLeftFunc(s, isRustWhitespace)
	}
	if n.Right {
		s = strings.TrimRightFunc(s, isRustWhitespace)
	}
	return s
}

// isRustWhitespace is Rust's char::is_whitespace (Unicode White_Space).
func isRustWhitespace(r rune) bool { return isWhitespace(r) }

// PrependScheme says when Metaspace puts the replacement character in
// front of a word.
type PrependScheme int

// Prepend schemes, as Hugging Face names them.
const (
	// PrependAlways prefixes every text (and, with split, every section).
	PrependAlways PrependScheme = iota
	// PrependFirst prefixes only the text that starts the input (not the
	// text after an added token).
	PrependFirst
	// PrependNever never prefixes.
	PrependNever
)

// parsePrependScheme reads a Metaspace "prepend_scheme"; an absent one
// follows the legacy "add_prefix_space" (true: always, false: never).
func parsePrependScheme(scheme *string, addPrefixSpace *bool) (PrependScheme, error) {
	if scheme == nil {
		if addPrefixSpace != nil && !*addPrefixSpace {
			return PrependNever, nil
		}
		return PrependAlways, nil
	}
	switch strings.ToLower(*scheme) {
	case "always":
		return PrependAlways, nil
	case "first":
		return PrependFirst, nil
	case "never":
		return PrependNever, nil
	}
	return 0, fmt.Errorf("unknown prepend_scheme %q", *scheme)
}

// Metaspace is Hugging Face's Metaspace pre-tokenizer (SentencePiece
// style): spaces become Replacement ("▁"), Replacement is put in front of
// the text as Scheme says, and with Split the text is cut before every
// Replacement.
type Metaspace struct {
	// Replacement stands for a space, normally "▁" (U+2581).
	Replacement string
	// Scheme says when Replacement is put in front of the text.
	Scheme PrependScheme
	// Split cuts the text before every Replacement.
	Split bool

	splitter *Split
}

// NewMetaspace builds a Metaspace pre-tokenizer.
func NewMetaspace(replacement string, scheme PrependScheme, split bool) (*Metaspace, error) {
	if replacement == "" {
		return nil, fmt.Errorf("metaspace: empty replacement")
	}
	m := &Metaspace{Replacement: replacement, Scheme: scheme, Split: split}
	if split {
		s, err := NewSplit(replacement, false, SplitMergedWithNext, false)
		if err != nil {
			return nil, err
		}
		m.splitter = s
	}
	return m, nil
}

// Words yields the words of s as the start of an input.
func (m *Metaspace) Words(s string) iter.Seq[string] { return m.wordsAt(s, true) }

// wordsAt yields the words of s; atStart says whether s begins the input
// (Hugging Face's offsets_original().0 == 0), which PrependFirst needs.
func (m *Metaspace) wordsAt(s string, atStart bool) iter.Seq[string] {
	return func(yield func(string) bool) {
		if s == "" { // Hugging Face skips empty splits: no lone "▁"
			return
		}
		n := strings.ReplaceAll(s, " ", m.Replacement)
		if !strings.HasPrefix(n, m.Replacement) && (m.Scheme == PrependAlways || m.Scheme == PrependFirst && atStart) {
			n = m.Replacement + n
		}
		if m.splitter == nil {
			yield(n)
			return
		}
		for w := range m.splitter.Words(n) {
			if !yield(w) {
				return
			}
		}
	}
}

// startAware is a PreTokenizer whose words depend on whether the text
// begins the input.
type startAware interface {
	wordsAt(s string, atStart bool) iter.Seq[string]
}

// preWords yields the words of s from p, telling a start-aware
// pre-tokenizer whether s begins the input.
func preWords(p PreTokenizer, s string, atStart bool) iter.Seq[string] {
	if sa, ok := p.(startAware); ok {
		return sa.wordsAt(s, atStart)
	}
	return p.Words(s)
}

// startsAt reports whether word is a substring of s that begins at s[0].
// Pre-tokenizers yield substrings of their input where they do not
// rewrite it, so this tells whether a word keeps its parent's offset 0; a
// rewritten word (ByteLevel, Metaspace) is conservatively not at the start.
func startsAt(word, s string) bool {
	return len(word) > 0 && len(s) > 0 && unsafe.StringData(word) == unsafe.StringData(s)
}

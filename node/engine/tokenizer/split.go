package tokenizer

import (
	"fmt"
	"iter"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// SplitBehavior says what Split does with the parts its pattern matches.
type SplitBehavior int

// Split behaviours, as Hugging Face names them.
const (
	// SplitRemoved drops the matches.
	SplitRemoved SplitBehavior = iota
	// SplitIsolated makes every match a word of its own.
	SplitIsolated
	// SplitMergedWithPrevious appends each match to the word before it.
	SplitMergedWithPrevious
	// SplitMergedWithNext prepends each match to the word after it.
	SplitMergedWithNext
	// SplitContiguous makes each run of adjacent matches one word.
	SplitContiguous
)

// parseSplitBehavior reads tokenizer.json's behaviour name.
func parseSplitBehavior(s string) (SplitBehavior, error) {
	switch s {
	case "Removed":
		return SplitRemoved, nil
	case "Isolated":
		return SplitIsolated, nil
	case "MergedWithPrevious":
		return SplitMergedWithPrevious, nil
	case "MergedWithNext":
		return SplitMergedWithNext, nil
	case "Contiguous":
		return SplitContiguous, nil
	}
	return 0, fmt.Errorf("unknown split behavior %q", s)
}

// Split is Hugging Face's Split pre-tokenizer: a pattern (a regular
// expression with .NET / Oniguruma syntax, look-ahead included, or a
// literal string) cuts the text, and Behavior says where the matches go.
// With Invert the pattern describes the words rather than the delimiters.
type Split struct {
	// Behavior says what becomes of the pattern's matches.
	Behavior SplitBehavior
	// Invert makes the pattern match the words rather than the
	// delimiters.
	Invert bool

	re      *regexp2.Regexp // nil for a literal pattern
	literal string
}

// NewSplit builds a Split pre-tokenizer. isRegex selects a regular
// expression (compiled with regexp2, so look-ahead works) over a literal.
func NewSplit(pattern string, isRegex bool, behavior SplitBehavior, invert bool) (*Split, error) {
	s := &Split{Behavior: behavior, Invert: invert}
	if !isRegex {
		if pattern == "" {
			return nil, fmt.Errorf("split: empty string pattern")
		}
		s.literal = pattern
		return s, nil
	}
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("split: pattern %q: %w", pattern, err)
	}
	s.re = re
	return s, nil
}

// span is a byte range of the text and whether it is a delimiter.
type span struct {
	start, end int
	delim      bool
}

// spans cuts s into matches and the gaps between them, in order.
func (s *Split) spans(text string) []span {
	var out []span
	prev := 0
	add := func(start, end int) {
		if start > prev {
			out = append(out, span{prev, start, s.Invert})
		}
		if end > start {
			out = append(out, span{start, end, !s.Invert})
		}
		prev = end
	}
	if s.re == nil {
		for i := 0; ; {
			j := strings.Index(text[i:], s.literal)
			if j < 0 {
				break
			}
			add(i+j, i+j+len(s.literal))
			i += j + len(s.literal)
		}
	} else {
		// regexp2 reports rune offsets; walk the text alongside to turn
		// them into byte offsets.
		runeAt, byteAt := 0, 0
		toByte := func(r int) int {
			for runeAt < r {
				_, size := utf8.DecodeRuneInString(text[byteAt:])
				byteAt += size
				runeAt++
			}
			return byteAt
		}
		m, err := s.re.FindStringMatch(text)
		for err == nil && m != nil {
			if m.Length > 0 {
				start := toByte(m.Index)
				add(start, toByte(m.Index+m.Length))
			}
			m, err = s.re.FindNextMatch(m)
		}
	}
	if prev < len(text) {
		out = append(out, span{prev, len(text), s.Invert})
	}
	return out
}

// Words yields the words of text as Behavior lays them out, following
// Hugging Face's folds over (span, is-match) pairs exactly.
func (s *Split) Words(text string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for _, p := range s.pieces(s.spans(text)) {
			if p.end > p.start && !yield(text[p.start:p.end]) {
				return
			}
		}
	}
}

// pieces applies Behavior to the spans.
func (s *Split) pieces(spans []span) []span {
	var acc []span
	prevMatch := false
	switch s.Behavior {
	case SplitRemoved:
		for _, sp := range spans {
			if !sp.delim {
				acc = append(acc, sp)
			}
		}
		return acc
	case SplitIsolated:
		return spans
	case SplitMergedWithPrevious:
		for _, sp := range spans {
			if sp.delim && !prevMatch && len(acc) > 0 {
				acc[len(acc)-1].end = sp.end
			} else {
				acc = append(acc, sp)
			}
			prevMatch = sp.delim
		}
	case SplitMergedWithNext:
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			if sp.delim && !prevMatch && len(acc) > 0 {
				acc[len(acc)-1].start = sp.start
			} else {
				acc = append(acc, sp)
			}
			prevMatch = sp.delim
		}
		for i, j := 0, len(acc)-1; i < j; i, j = i+1, j-1 {
			acc[i], acc[j] = acc[j], acc[i]
		}
	case SplitContiguous:
		for _, sp := range spans {
			if sp.delim == prevMatch && len(acc) > 0 {
				acc[len(acc)-1].end = sp.end
			} else {
				acc = append(acc, sp)
			}
			prevMatch = sp.delim
		}
	}
	return acc
}

// PreTokenizerSequence applies pre-tokenizers one after another: every word
// of one is split again by the next.
type PreTokenizerSequence []PreTokenizer

// Words yields the words left after every pre-tokenizer has run.
func (seq PreTokenizerSequence) Words(s string) iter.Seq[string] { return seq.wordsAt(s, true) }

// wordsAt is Words for a text that may or may not begin the input.
func (seq PreTokenizerSequence) wordsAt(s string, atStart bool) iter.Seq[string] {
	return func(yield func(string) bool) {
		seq.walk(s, atStart, yield)
	}
}

// walk feeds the words of s through seq[0], then the rest; false stops. A
// word is at the start of the input when s is and the word begins s.
func (seq PreTokenizerSequence) walk(s string, atStart bool, yield func(string) bool) bool {
	if len(seq) == 0 {
		return yield(s)
	}
	for w := range preWords(seq[0], s, atStart) {
		if !seq[1:].walk(w, atStart && startsAt(w, s), yield) {
			return false
		}
	}
	return true
}

// whitespacePattern is Hugging Face's Whitespace pre-tokenizer.
const whitespacePattern = `\w+|[^\w\s]+`

// isUnicodeNumber reports Unicode categories Nd, Nl and No.
func isUnicodeNumber(r rune) bool { return unicode.IsNumber(r) }

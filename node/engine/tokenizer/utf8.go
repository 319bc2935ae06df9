package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// LossyUTF8 converts b to text the way Python's
// bytes.decode("utf-8", errors="replace") (and the WHATWG TextDecoder, and
// Rust's String::from_utf8_lossy) do: every maximal subpart of an invalid
// sequence becomes one U+FFFD. A truncated multi-byte sequence ("\xe2\x82")
// is one U+FFFD, not one per byte; a byte that can never start or continue
// a character (0x80 alone, 0xC0, 0xF5..0xFF), an overlong or surrogate
// lead ("\xe0\x80", "\xed\xa0") is one U+FFFD per byte.
func LossyUTF8(b []byte) string {
	s, _ := lossyPrefix(b, true)
	return s
}

// lossyString is LossyUTF8 for a string, without copying valid text.
func lossyString(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return LossyUTF8([]byte(s))
}

// lossyPrefix converts b as LossyUTF8 does. When final is false it stops
// before a trailing sequence that is incomplete but still valid so far
// (more bytes may finish it) and reports how many bytes it used; the text
// of the whole input then never depends on where it was cut.
func lossyPrefix(b []byte, final bool) (string, int) {
	var sb strings.Builder
	sb.Grow(len(b))
	i := 0
	for i < len(b) {
		c := b[i]
		if c < utf8.RuneSelf {
			sb.WriteByte(c)
			i++
			continue
		}
		need, lo, hi := seqShape(c)
		if need == 0 { // never valid as a lead byte
			sb.WriteRune(utf8.RuneError)
			i++
			continue
		}
		j := i + 1 // bytes i..j-1 are a valid (partial) sequence
		for k := 0; k < need; k++ {
			if j >= len(b) {
				break
			}
			lower, upper := byte(0x80), byte(0xBF)
			if k == 0 {
				lower, upper = lo, hi
			}
			if b[j] < lower || b[j] > upper {
				break
			}
			j++
		}
		switch {
		case j == i+1+need: // complete
			sb.Write(b[i:j])
		case j == len(b) && !final: // may still be completed
			return sb.String(), i
		default: // the maximal subpart b[i:j] is one error
			sb.WriteRune(utf8.RuneError)
		}
		i = j
	}
	return sb.String(), i
}

// seqShape gives, for a lead byte, how many continuation bytes follow and
// the allowed range of the first of them (which rules out overlongs,
// surrogates and code points above U+10FFFF); need is 0 for a byte that
// cannot start a sequence.
func seqShape(c byte) (need int, lo, hi byte) {
	switch {
	case c >= 0xC2 && c <= 0xDF:
		return 1, 0x80, 0xBF
	case c == 0xE0:
		return 2, 0xA0, 0xBF
	case c == 0xED:
		return 2, 0x80, 0x9F
	case c >= 0xE1 && c <= 0xEF:
		return 2, 0x80, 0xBF
	case c == 0xF0:
		return 3, 0x90, 0xBF
	case c >= 0xF1 && c <= 0xF3:
		return 3, 0x80, 0xBF
	case c == 0xF4:
		return 3, 0x80, 0x8F
	}
	return 0, 0, 0
}

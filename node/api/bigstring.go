package api

import (
	"bytes"
	"encoding/binary"
)

// Image requests carry their picture as one long base64 string, and
// encoding/json reads a body twice (a validity scan, then the decoding), a
// byte at a time: ~0.6 ms for the 85 kB of a 640x480 JPEG, as much as the
// JPEG's decoding. decodeWithBigString finds that string with bytes.IndexByte
// (vectorised), decodes the rest of the body with decodeStrict, and sets the
// field from the string's bytes: the same result, errors included, in about
// a tenth of the time (BenchmarkDecodeImageRequest).

// bigStringMin is the shortest value worth taking out of a body.
const bigStringMin = 4 << 10

// bigString finds, in body (a JSON object), the value of the top-level
// member named key when that value is a plain string of at least
// bigStringMin bytes, and returns the span of its text between the quotes.
// A plain string holds printable ASCII only (0x20-0x7e) and no escape, so
// its text is its value: base64 and data: URLs are plain. ok is false when
// there is no such member, when the body is not a well-formed object as far
// as the scan reads it, or when taking the value out could change what
// decoding the body means: another top-level key matching key the way
// encoding/json matches field names (case-insensitively), or any top-level
// key written with an escape (it might decode to key).
func bigString(body []byte, key string) (start, end int, ok bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0, 0, false
	}
	depth, found := 0, false
	for i < len(body) {
		switch c := body[i]; c {
		case '{', '[':
			depth++
			i++
		case '}', ']':
			depth--
			i++
			if depth == 0 {
				return start, end, found
			}
		case '"':
			e, escaped := stringEnd(body, i+1)
			if e < 0 {
				return 0, 0, false
			}
			next := skipSpace(body, e+1)
			isKey := depth == 1 && next < len(body) && body[next] == ':'
			if !isKey {
				i = e + 1
				continue
			}
			name := body[i+1 : e]
			if escaped {
				return 0, 0, false
			}
			if !bytes.EqualFold(name, []byte(key)) {
				i = next + 1
				continue
			}
			if found {
				return 0, 0, false // a second member for the field
			}
			v := skipSpace(body, next+1)
			if v >= len(body) || body[v] != '"' {
				return 0, 0, false
			}
			ve, vesc := stringEnd(body, v+1)
			if ve < 0 || vesc || ve-(v+1) < bigStringMin || !plainASCII(body[v+1:ve]) {
				return 0, 0, false
			}
			start, end, found = v+1, ve, true
			i = ve + 1
		default:
			i++
		}
	}
	return 0, 0, false
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// stringEnd returns the index of the quote closing the JSON string whose
// text starts at p, and whether the text holds a backslash escape; -1 when
// the string does not end. It reads each byte a bounded number of times
// (a body of escapes costs no more than one without).
func stringEnd(b []byte, p int) (end int, escaped bool) {
	q := -1 // the first quote at or after p, once found
	for p < len(b) {
		if q < p {
			k := bytes.IndexByte(b[p:], '"')
			if k < 0 {
				return -1, escaped
			}
			q = p + k
		}
		bs := bytes.IndexByte(b[p:q], '\\')
		if bs < 0 {
			return q, escaped
		}
		escaped = true
		p += bs + 2 // the backslash and the character it escapes
	}
	return -1, escaped
}

// plainASCII reports whether every byte of s is printable ASCII
// (0x20-0x7e), eight bytes a step.
func plainASCII(s []byte) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	for len(s) >= 8 {
		x := binary.LittleEndian.Uint64(s)
		// With no byte of 0x80 or above (x&hi == 0), a byte below 0x20
		// borrows into its high bit in x-0x20.. and a 0x7f carries into it
		// in x+0x01.. (borrows and carries only add false positives next
		// to a byte that is out of range anyway).
		if x&hi != 0 || (x-0x20*lo)&^x&hi != 0 || (x+lo)&hi != 0 {
			return false
		}
		s = s[8:]
	}
	for _, c := range s {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// decodeWithBigString is decodeStrict(body, v) for a request whose string
// field *dst (member key) is usually long: when bigString finds it, the
// rest of the body is decoded without it and *dst is set from its bytes.
// Any error is decodeStrict's on the whole body, so messages do not depend
// on the path taken.
func decodeWithBigString(body []byte, v any, key string, dst *string) error {
	s, e, ok := bigString(body, key)
	if !ok {
		return decodeStrict(body, v)
	}
	if err := decodeStrict(cutSpan(body, s, e), v); err != nil || *dst != "" {
		return decodeStrict(body, v)
	}
	*dst = string(body[s:e])
	return nil
}

// cutSpan returns a copy of body without body[s:e] (a string's text,
// leaving its quotes: the value becomes "").
func cutSpan(body []byte, s, e int) []byte {
	return append(append(make([]byte, 0, len(body)-(e-s)), body[:s]...), body[e:]...)
}

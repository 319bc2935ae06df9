package tokenizer

import (
	"fmt"
	"strconv"
	"strings"
)

// pieceStepKind is one of the SentencePiece-style decoders.
type pieceStepKind int

const (
	stepReplace      pieceStepKind = iota // Replace: pattern -> content
	stepByteFallback                      // ByteFallback: <0xNN> -> byte NN
	stepFuse                              // Fuse: join the tokens
	stepStrip                             // Strip: drop leading/trailing content
	stepMetaspace                         // Metaspace: "▁" -> " "
)

// PieceStep is one decoder of a PieceDecoder chain.
type PieceStep struct {
	kind pieceStepKind
	from string // Replace pattern; Metaspace replacement; Strip content
	to   string // Replace content
	// Strip counts.
	start, stop int
	// dropFirst: Metaspace removes the replacement from the first token.
	dropFirst bool
}

// ReplaceStep is Hugging Face's Replace decoder with a literal pattern.
func ReplaceStep(pattern, content string) PieceStep {
	return PieceStep{kind: stepReplace, from: pattern, to: content}
}

// ByteFallbackStep is Hugging Face's ByteFallback decoder: a token
// "<0xNN>" stands for the byte NN.
func ByteFallbackStep() PieceStep { return PieceStep{kind: stepByteFallback} }

// FuseStep is Hugging Face's Fuse decoder: the tokens become one string,
// so later steps see the whole text.
func FuseStep() PieceStep { return PieceStep{kind: stepFuse} }

// StripStep is Hugging Face's Strip decoder: up to start leading and stop
// trailing occurrences of the character content are removed.
func StripStep(content string, start, stop int) PieceStep {
	return PieceStep{kind: stepStrip, from: content, start: start, stop: stop}
}

// MetaspaceStep is Hugging Face's Metaspace decoder: replacement becomes a
// space, except in the first token, where it is dropped unless the prepend
// scheme is never.
func MetaspaceStep(replacement string, scheme PrependScheme) PieceStep {
	return PieceStep{kind: stepMetaspace, from: replacement, dropFirst: scheme != PrependNever}
}

// PieceDecoder runs a chain of SentencePiece-style decoders (Replace,
// ByteFallback, Fuse, Strip, Metaspace), as Llama-2, Mistral, Gemma,
// XLM-R and T5 files list them. Steps before Fuse act on each token;
// Strip after Fuse acts on the whole text. Byte tokens are kept as raw
// bytes and invalid UTF-8 is replaced once, at the end, per maximal
// subpart (Hugging Face instead writes one U+FFFD per byte when a run of
// byte tokens is not valid UTF-8; valid runs decode identically).
type PieceDecoder struct {
	perToken []PieceStep // steps on each token
	// stripStart/stripChar: Strip after Fuse, on the start of the text.
	stripStart int
	stripChar  string
	// tail holds steps after Fuse other than a leading Strip; they make
	// decoding depend on the whole text.
	tail []PieceStep
}

// NewPieceDecoder builds a chain of decoder steps.
func NewPieceDecoder(steps ...PieceStep) (*PieceDecoder, error) {
	d := &PieceDecoder{}
	fused := false
	for _, s := range steps {
		if (s.kind == stepStrip || s.kind == stepMetaspace) && len([]rune(s.from)) != 1 {
			return nil, fmt.Errorf("decoder: %q must be one character", s.from)
		}
		if s.kind == stepReplace && s.from == "" {
			return nil, fmt.Errorf("decoder: Replace with an empty pattern")
		}
		switch {
		case s.kind == stepFuse:
			fused = true
		case !fused:
			d.perToken = append(d.perToken, s)
		case s.kind == stepStrip && s.stop == 0 && len(d.tail) == 0 && (d.stripStart == 0 || d.stripChar == s.from):
			d.stripStart += s.start
			d.stripChar = s.from
		default:
			d.tail = append(d.tail, s)
		}
	}
	return d, nil
}

// PerToken is true unless steps after Fuse need the whole text: the
// decoding of a sequence is then the concatenation of its tokens'
// decodings, except at the start of the text (the first token, and a
// leading Strip), which DecodeStream takes care of.
func (d *PieceDecoder) PerToken() bool { return len(d.tail) == 0 }

// Decode appends the bytes of tokens to dst.
func (d *PieceDecoder) Decode(dst []byte, tokens []string) []byte {
	mark := len(dst)
	for i, t := range tokens {
		dst = d.token(dst, t, i == 0)
	}
	if d.stripStart > 0 {
		n := leadingRun(dst[mark:], d.stripChar, d.stripStart)
		dst = append(dst[:mark], dst[mark+n:]...)
	}
	if len(d.tail) > 0 {
		whole := []string{string(dst[mark:])}
		for _, s := range d.tail {
			whole = s.apply(whole, 0)
		}
		dst = append(dst[:mark], whole[0]...)
	}
	return dst
}

// token appends one token decoded by the per-token steps; first says it
// is the first token of the text.
func (d *PieceDecoder) token(dst []byte, tok string, first bool) []byte {
	idx := 1
	if first {
		idx = 0
	}
	one := []string{tok}
	for _, s := range d.perToken {
		one = s.apply(one, idx)
	}
	return append(dst, one[0]...)
}

// leadingRun counts the bytes of up to n leading copies of c in b.
func leadingRun(b []byte, c string, n int) int {
	i := 0
	for k := 0; k < n && strings.HasPrefix(string(b[i:]), c); k++ {
		i += len(c)
	}
	return i
}

// apply runs the step on tokens; first is the index in the text of
// tokens[0] (only 0 matters).
func (s PieceStep) apply(tokens []string, first int) []string {
	for i, t := range tokens {
		switch s.kind {
		case stepReplace:
			tokens[i] = strings.ReplaceAll(t, s.from, s.to)
		case stepByteFallback:
			if b, ok := byteToken(t); ok {
				tokens[i] = string([]byte{b})
			}
		case stepMetaspace:
			sp := " "
			if s.dropFirst && first+i == 0 {
				sp = ""
			}
			tokens[i] = strings.ReplaceAll(t, s.from, sp)
		case stepStrip:
			for k := 0; k < s.start && strings.HasPrefix(t, s.from); k++ {
				t = t[len(s.from):]
			}
			for k := 0; k < s.stop && strings.HasSuffix(t, s.from); k++ {
				t = t[:len(t)-len(s.from)]
			}
			tokens[i] = t
		}
	}
	return tokens
}

// byteToken reads a byte-fallback token "<0xNN>".
func byteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	v, err := strconv.ParseUint(t[3:5], 16, 8)
	if err != nil {
		return 0, false
	}
	return byte(v), true
}

// startDecoder is a Decoder whose tokens decode differently at the start
// of the text (PieceDecoder); DecodeStream and TokenBytes use it.
type startDecoder interface {
	// token appends the decoding of one token; first: it starts the text.
	token(dst []byte, tok string, first bool) []byte
	// leadingStrip is how many leading copies of c the text loses.
	leadingStrip() (c string, n int)
}

func (d *PieceDecoder) leadingStrip() (string, int) { return d.stripChar, d.stripStart }

package tokenizer

import (
	"strings"
)

// Decoder turns token strings back into text bytes (tokenizer.json's
// "decoder"). The bytes may end inside a UTF-8 sequence.
type Decoder interface {
	// Decode appends the bytes of tokens to dst and returns the extended
	// slice.
	Decode(dst []byte, tokens []string) []byte
	// PerToken reports whether decoding a sequence equals concatenating
	// the decodings of its tokens one by one, which streaming and
	// constrained decoding rely on.
	PerToken() bool
}

// ByteLevelDecoder is Hugging Face's ByteLevel decoder: each character of
// a token stands for one byte.
type ByteLevelDecoder struct {
	alphabet *byteLevelAlphabet
}

// NewByteLevelDecoder builds a ByteLevel decoder.
func NewByteLevelDecoder() ByteLevelDecoder {
	return ByteLevelDecoder{alphabet: newByteLevelAlphabet()}
}

// Decode maps every token's characters back to bytes.
func (d ByteLevelDecoder) Decode(dst []byte, tokens []string) []byte {
	for _, t := range tokens {
		dst = d.alphabet.decode(dst, t)
	}
	return dst
}

// PerToken is true: each token decodes on its own.
func (ByteLevelDecoder) PerToken() bool { return true }

// WordPieceDecoder is Hugging Face's WordPiece decoder: tokens are joined
// with spaces, except that continuation pieces (Prefix) are glued to the
// previous token; Cleanup removes the spaces English tokenization puts
// before punctuation and inside contractions.
type WordPieceDecoder struct {
	// Prefix marks continuation pieces, e.g. "##"; "" treats every token
	// as a word.
	Prefix string
	// Cleanup removes the spaces before punctuation and inside English
	// contractions, as Hugging Face's tokenizers do (cleanupPiece).
	Cleanup bool
}

// Decode joins the tokens.
func (d WordPieceDecoder) Decode(dst []byte, tokens []string) []byte {
	for i, t := range tokens {
		if i > 0 {
			if rest, ok := strings.CutPrefix(t, d.Prefix); ok && d.Prefix != "" {
				t = rest
			} else {
				t = " " + t
			}
		}
		if d.Cleanup {
			t = cleanupPiece(t)
		}
		dst = append(dst, t...)
	}
	return dst
}

// PerToken is false: spaces depend on the neighbouring tokens.
func (WordPieceDecoder) PerToken() bool { return false }

// cleanupPiece is the cleanup of Hugging Face's tokenizers library (the
// reference of this package): one token with the space put before it, its
// replacements applied one after the other in this order, each to the
// result of the one before. A single pass over all the patterns at once
// differs: ") ' ! ?" must stay ") '!?", as each token is cleaned on its
// own, and "' ! " is no " ' " once " !" became "!".
func cleanupPiece(s string) string {
	if !strings.Contains(s, " ") {
		return s
	}
	for _, r := range [...][2]string{
		{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
		{" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
	} {
		s = strings.ReplaceAll(s, r[0], r[1])
	}
	return s
}

// concatDecode is decoding without a decoder: the tokens side by side.
func concatDecode(dst []byte, tokens []string) []byte {
	for _, t := range tokens {
		dst = append(dst, t...)
	}
	return dst
}

// Decode turns ids back into text. Unknown ids are skipped; with
// skipSpecial, special tokens (added tokens marked special) are too. Bytes
// that are not valid UTF-8 become U+FFFD, one per byte.
func (t *Tokenizer) Decode(ids []int64, skipSpecial bool) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if skipSpecial && t.IsSpecial(id) {
			continue
		}
		if tok, ok := t.IDToToken(id); ok {
			tokens = append(tokens, tok)
		}
	}
	var raw []byte
	if t.decoder == nil {
		raw = concatDecode(nil, tokens)
	} else {
		raw = t.decoder.Decode(nil, tokens)
	}
	return LossyUTF8(raw)
}

// PerTokenDecoding reports whether a token's text is independent of its
// neighbours (byte-level BPE), so TokenBytes and DecodeStream are exact.
func (t *Tokenizer) PerTokenDecoding() bool {
	if t.decoderUnsupported != "" {
		return false
	}
	return t.decoder == nil || t.decoder.PerToken()
}

// TokenBytes returns the bytes token id decodes to on its own (possibly a
// partial UTF-8 sequence), or nil for an unknown id. Special tokens decode
// to their content. For a SentencePiece-style decoder these are the bytes
// the token adds in the middle of a text ("▁Hello" is " Hello"); only the
// first token of a text decodes differently, which DecodeStream handles.
func (t *Tokenizer) TokenBytes(id int64) []byte {
	tok, ok := t.IDToToken(id)
	if !ok {
		return nil
	}
	if t.decoder == nil {
		return []byte(tok)
	}
	if sd, ok := t.decoder.(startDecoder); ok {
		return sd.token(nil, tok, false)
	}
	return t.decoder.Decode(nil, []string{tok})
}

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id int64) bool {
	_, ok := t.special[id]
	return ok
}

// SpecialIDs returns the ids of the special added tokens.
func (t *Tokenizer) SpecialIDs() []int64 {
	out := make([]int64, 0, len(t.special))
	for id := range t.special {
		out = append(out, id)
	}
	return out
}

// DecodeStream decodes ids one at a time for streaming, never emitting a
// partial UTF-8 sequence: bytes that may still complete a character are
// held until the next token (or Flush). The concatenation of everything it
// returns equals Decode of the same ids when the tokenizer decodes per
// token. It is not safe for concurrent use.
type DecodeStream struct {
	tok         *Tokenizer
	skipSpecial bool
	pending     []byte
	// started: a token has been decoded (the next is not the first).
	started bool
	// stripChar/stripLeft: leading copies of stripChar the text still
	// loses (a SentencePiece decoder's Strip after Fuse).
	stripChar string
	stripLeft int
}

// NewDecodeStream starts an incremental decoding.
func (t *Tokenizer) NewDecodeStream(skipSpecial bool) *DecodeStream {
	d := &DecodeStream{tok: t, skipSpecial: skipSpecial}
	if sd, ok := t.decoder.(startDecoder); ok {
		d.stripChar, d.stripLeft = sd.leadingStrip()
	}
	return d
}

// Add decodes one more id and returns the text that is now complete.
func (d *DecodeStream) Add(id int64) string {
	if d.skipSpecial && d.tok.IsSpecial(id) {
		return ""
	}
	tok, ok := d.tok.IDToToken(id)
	if !ok {
		return "" // unknown ids are skipped, as Decode does
	}
	mark := len(d.pending)
	if sd, ok := d.tok.decoder.(startDecoder); ok {
		d.pending = sd.token(d.pending, tok, !d.started)
	} else {
		d.pending = append(d.pending, d.tok.TokenBytes(id)...)
	}
	d.started = true
	for d.stripLeft > 0 && len(d.pending) > mark {
		if !strings.HasPrefix(string(d.pending[mark:]), d.stripChar) {
			d.stripLeft = 0
			break
		}
		d.pending = append(d.pending[:mark], d.pending[mark+len(d.stripChar):]...)
		d.stripLeft--
	}
	s, n := lossyPrefix(d.pending, false)
	d.pending = append(d.pending[:0], d.pending[n:]...)
	return s
}

// Flush returns what is held back, with an unfinished character as U+FFFD.
func (d *DecodeStream) Flush() string {
	s, _ := lossyPrefix(d.pending, true)
	d.pending = d.pending[:0]
	return s
}

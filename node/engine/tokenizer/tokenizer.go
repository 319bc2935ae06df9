package tokenizer

import (
	"errors"
	"fmt"
)

// Limits that bound the work one file or one text can cause.
const (
	// MaxFileBytes is the largest tokenizer.json Load accepts.
	MaxFileBytes = 64 << 20
	// MaxInputBytes is the longest text Encode accepts.
	MaxInputBytes = 1 << 20
	// MaxVocabSize bounds token ids: every id must be below it.
	MaxVocabSize = 1 << 22
)

// ErrInputTooLarge is returned (wrapped) by Encode for a text longer than
// MaxInputBytes.
var ErrInputTooLarge = errors.New("tokenizer: input too large")

// Encoding is one encoded text.
type Encoding struct {
	// IDs are the token ids, special tokens included.
	IDs []int64
	// TypeIDs are the token type (segment) ids, one per id.
	TypeIDs []int64
}

// truncationSpec is tokenizer.json's "truncation" setting.
type truncationSpec struct {
	// MaxLength is the longest encoding, special tokens included.
	MaxLength int
	// Left drops tokens from the start instead of the end.
	Left bool
}

// Tokenizer encodes text as a Hugging Face tokenizer.json describes. It is
// immutable and safe for concurrent use.
type Tokenizer struct {
	normalizer Normalizer         // nil: text is used as is
	pre        PreTokenizer       // nil: each text segment is one word
	model      Model              // never nil
	post       PostProcessor      // nil: no special tokens are added
	truncation *truncationSpec    // nil: no truncation unless asked
	raw        matcher            // added tokens matched in the raw text
	normalized matcher            // added tokens matched in normalised text
	added      map[string]int64   // added token content -> id
	special    map[int64]struct{} // ids of added tokens marked special
	idToToken  []string           // id -> token; "" for unused ids
	decoder    Decoder            // nil: tokens are concatenated
	// decoderUnsupported names a decoder this package cannot run ("" if none).
	decoderUnsupported string
}

// Encode tokenizes text, adds the special tokens and truncates the result
// to at most maxTokens ids, special tokens included, keeping the special
// tokens. maxTokens <= 0 applies the file's truncation setting, if any.
// Invalid UTF-8 is read as U+FFFD, one per maximal invalid subpart (see
// LossyUTF8).
func (t *Tokenizer) Encode(text string, maxTokens int) (Encoding, error) {
	if len(text) > MaxInputBytes {
		return Encoding{}, fmt.Errorf("%w: %d bytes, at most %d", ErrInputTooLarge, len(text), MaxInputBytes)
	}
	text = lossyString(text)
	added := 0
	if t.post != nil {
		added = t.post.AddedTokens()
	}
	limit, left := -1, false // limit on content ids; -1: none
	if t.truncation != nil {
		left = t.truncation.Left
		limit = t.truncation.MaxLength
	}
	if maxTokens > 0 {
		limit = maxTokens
	}
	if limit >= 0 {
		if limit < added {
			return Encoding{}, fmt.Errorf("tokenizer: a limit of %d tokens leaves no room for the %d special tokens", limit, added)
		}
		limit -= added
	}
	ids := t.encodeContent(text, limit, left)
	if limit >= 0 && len(ids) > limit {
		if left {
			ids = ids[len(ids)-limit:]
		} else {
			ids = ids[:limit]
		}
	}
	if t.post == nil {
		return Encoding{IDs: ids, TypeIDs: make([]int64, len(ids))}, nil
	}
	out, types := t.post.Process(ids)
	return Encoding{IDs: out, TypeIDs: types}, nil
}

// EncodeContent tokenizes text without adding special tokens and without
// truncation, as Hugging Face's encode(text, add_special_tokens=False) does
// (chat prompts carry their special tokens in the rendered text).
func (t *Tokenizer) EncodeContent(text string) ([]int64, error) {
	if len(text) > MaxInputBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrInputTooLarge, len(text), MaxInputBytes)
	}
	return t.encodeContent(lossyString(text), -1, false), nil
}

// encodeContent returns the ids of text without special tokens. With a
// right-side limit it stops once it has limit ids (the caller trims).
func (t *Tokenizer) encodeContent(text string, limit int, left bool) []int64 {
	stopAt := -1
	if limit >= 0 && !left {
		stopAt = limit
	}
	full := func(ids []int64) bool { return stopAt >= 0 && len(ids) >= stopAt }
	var ids []int64
	var normSegs []segment
	for si, seg := range t.raw.split(text, nil) {
		if full(ids) {
			return ids
		}
		if seg.id >= 0 {
			ids = append(ids, seg.id)
			continue
		}
		s := seg.text
		if t.normalizer != nil {
			s = t.normalizer.Normalize(s)
		}
		normSegs = t.normalized.split(s, normSegs[:0])
		for ni, ns := range normSegs {
			if full(ids) {
				return ids
			}
			if ns.id >= 0 {
				ids = append(ids, ns.id)
				continue
			}
			if t.pre == nil {
				ids = t.model.Tokenize(ns.text, ids)
				continue
			}
			// Only text at offset 0 of the input is at its start (Metaspace's
			// prepend_scheme "first" depends on it).
			atStart := si == 0 && ni == 0
			for w := range preWords(t.pre, ns.text, atStart) {
				ids = t.model.Tokenize(w, ids)
				if full(ids) {
					return ids
				}
			}
		}
	}
	return ids
}

// VocabSize is one more than the largest id the tokenizer can produce; a
// model's embedding table must have at least this many rows.
func (t *Tokenizer) VocabSize() int { return len(t.idToToken) }

// SpecialTokens is how many special tokens Encode adds to every text.
func (t *Tokenizer) SpecialTokens() int {
	if t.post == nil {
		return 0
	}
	return t.post.AddedTokens()
}

// TokenToID looks a token up among the added tokens, then the model's vocabulary.
func (t *Tokenizer) TokenToID(token string) (int64, bool) {
	if id, ok := t.added[token]; ok {
		return id, true
	}
	return t.model.TokenToID(token)
}

// IDToToken returns the token string of id.
func (t *Tokenizer) IDToToken(id int64) (string, bool) {
	if id < 0 || id >= int64(len(t.idToToken)) || t.idToToken[id] == "" {
		return "", false
	}
	return t.idToToken[id], true
}

// Tokens returns the token strings of ids ("" for unknown ids); handy for
// logs and tests.
func (t *Tokenizer) Tokens(ids []int64) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i], _ = t.IDToToken(id)
	}
	return out
}

package tokenizer

import (
	"fmt"
	"unicode/utf8"
)

// Model maps one pre-tokenized word to vocabulary ids.
type Model interface {
	// Tokenize appends the ids of word to dst and returns the extended slice.
	Tokenize(word string, dst []int64) []int64
	// TokenToID looks a token up in the model's vocabulary.
	TokenToID(token string) (int64, bool)
	// Tokens returns the model's vocabulary as token -> id. Callers must not
	// modify it.
	Tokens() map[string]int64
}

// WordPiece is Hugging Face's WordPiece model: each word is split greedily
// into the longest vocabulary entries from the left; pieces after the first
// carry ContinuingSubwordPrefix. A word that cannot be fully split, or that
// is longer than MaxInputCharsPerWord characters, becomes UnkToken.
type WordPiece struct {
	vocab                map[string]int64
	unkID                int64
	prefix               string
	maxInputCharsPerWord int
}

// WordPieceDefaultMaxInputCharsPerWord is Hugging Face's default word length limit.
const WordPieceDefaultMaxInputCharsPerWord = 100

// NewWordPiece builds a WordPiece model. The unknown token must be in vocab.
func NewWordPiece(vocab map[string]int64, unkToken, continuingSubwordPrefix string, maxInputCharsPerWord int) (*WordPiece, error) {
	unk, ok := vocab[unkToken]
	if !ok {
		return nil, fmt.Errorf("wordpiece: unk_token %q is not in the vocabulary", unkToken)
	}
	if maxInputCharsPerWord < 0 {
		return nil, fmt.Errorf("wordpiece: max_input_chars_per_word %d is negative", maxInputCharsPerWord)
	}
	return &WordPiece{vocab: vocab, unkID: unk, prefix: continuingSubwordPrefix, maxInputCharsPerWord: maxInputCharsPerWord}, nil
}

// Tokenize appends the WordPiece ids of word to dst.
func (m *WordPiece) Tokenize(word string, dst []int64) []int64 {
	if word == "" {
		return dst
	}
	if utf8.RuneCountInString(word) > m.maxInputCharsPerWord {
		return append(dst, m.unkID)
	}
	mark := len(dst)
	// key holds prefix+piece for continuation lookups; map lookups of
	// string(key) do not allocate.
	key := make([]byte, 0, len(m.prefix)+len(word))
	for start := 0; start < len(word); {
		end := len(word)
		found := false
		for start < end {
			var id int64
			var ok bool
			if start == 0 {
				id, ok = m.vocab[word[:end]]
			} else {
				key = append(append(key[:0], m.prefix...), word[start:end]...)
				id, ok = m.vocab[string(key)]
			}
			if ok {
				dst = append(dst, id)
				found = true
				break
			}
			_, size := utf8.DecodeLastRuneInString(word[start:end])
			end -= size
		}
		if !found {
			return append(dst[:mark], m.unkID)
		}
		start = end
	}
	return dst
}

// TokenToID looks token up in the vocabulary.
func (m *WordPiece) TokenToID(token string) (int64, bool) {
	id, ok := m.vocab[token]
	return id, ok
}

// Tokens returns the vocabulary.
func (m *WordPiece) Tokens() map[string]int64 { return m.vocab }

package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"unicode/utf16"

	"golang.org/x/text/unicode/norm"
)

// PieceTokenizer is the SentencePiece (unigram) tokenizer of TensorFlow's
// Universal Sentence Encoder lite, as its TF.js wrapper runs it: the text is
// NFKC-normalised, "▁" is put before it and in place of every space, and a
// Viterbi search over the vocabulary's pieces picks the segmentation with
// the highest total score. A character no piece starts with becomes the
// unknown id 0 (score 0); consecutive unknowns merge into one. Ties, the
// treatment of unknowns and the backward walk follow the reference
// implementation exactly, so the ids are the ones the model was fed in
// training and in the reference runs. A PieceTokenizer is immutable and safe
// for concurrent use.
type PieceTokenizer struct {
	pieces []string   // by id
	steps  []int      // by id: the backward walk's step (the piece's UTF-16 length)
	root   *pieceNode // trie of the pieces after the reserved ones
	byText map[string]int64
}

// pieceReserved is how many leading vocabulary entries (unknown, control
// and user-defined symbols) never match text.
const pieceReserved = 6

// pieceNode is one trie node; id is -1 unless a piece ends here.
type pieceNode struct {
	next  map[rune]*pieceNode
	id    int64
	score float64
}

// LoadPieceVocab reads a vocabulary file: a JSON array of [piece, score]
// pairs, the id being the index (the vocab.json of the TF.js Universal
// Sentence Encoder lite).
func LoadPieceVocab(path string) (*PieceTokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw [][2]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: want a JSON array of [piece, score]: %w", path, err)
	}
	pieces := make([]UnigramPiece, len(raw))
	for i, r := range raw {
		if err := json.Unmarshal(r[0], &pieces[i].Piece); err != nil {
			return nil, fmt.Errorf("tokenizer: %s: entry %d: %w", path, i, err)
		}
		if err := json.Unmarshal(r[1], &pieces[i].Score); err != nil {
			return nil, fmt.Errorf("tokenizer: %s: entry %d: %w", path, i, err)
		}
	}
	t, err := NewPieceTokenizer(pieces)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	return t, nil
}

// NewPieceTokenizer builds a tokenizer from the pieces in id order. The
// first six are reserved (id 0 is the unknown piece) and never match text.
func NewPieceTokenizer(pieces []UnigramPiece) (*PieceTokenizer, error) {
	if len(pieces) <= pieceReserved {
		return nil, fmt.Errorf("vocabulary has %d pieces, want more than %d", len(pieces), pieceReserved)
	}
	if len(pieces) > MaxVocabSize {
		return nil, fmt.Errorf("vocabulary has %d pieces, at most %d", len(pieces), MaxVocabSize)
	}
	t := &PieceTokenizer{
		pieces: make([]string, len(pieces)),
		steps:  make([]int, len(pieces)),
		root:   &pieceNode{id: -1},
		byText: make(map[string]int64, len(pieces)),
	}
	for i, p := range pieces {
		if math.IsNaN(p.Score) || math.IsInf(p.Score, 0) {
			return nil, fmt.Errorf("piece %d has score %v", i, p.Score)
		}
		t.pieces[i] = p.Piece
		t.steps[i] = len(utf16.Encode([]rune(p.Piece)))
		if _, dup := t.byText[p.Piece]; !dup {
			t.byText[p.Piece] = int64(i)
		}
		if i < pieceReserved || p.Piece == "" {
			continue
		}
		n := t.root
		for _, r := range p.Piece {
			c := n.next[r]
			if c == nil {
				if n.next == nil {
					n.next = map[rune]*pieceNode{}
				}
				c = &pieceNode{id: -1}
				n.next[r] = c
			}
			n = c
		}
		// A later duplicate overwrites an earlier one, as in the reference trie.
		n.id, n.score = int64(i), p.Score
	}
	if t.steps[0] < 1 {
		return nil, errors.New("the unknown piece (id 0) is empty")
	}
	return t, nil
}

// EncodeIDs returns the ids of text, without truncation.
func (t *PieceTokenizer) EncodeIDs(text string) []int64 {
	text = norm.NFKC.String(text)
	if text == "" {
		return nil
	}
	syms := []rune("▁" + strings.ReplaceAll(text, " ", "▁"))
	n := len(syms)
	// Viterbi, pushing each piece that starts at i to its end. best[i] is
	// final when start i is reached, and the candidates for one end arrive
	// in ascending start order, the order the reference visits them in, so
	// its update rule (the first candidate, then any scoring >=) gives the
	// same choices. Memory is O(len(text)), whatever the vocabulary.
	best := make([]float64, n+1)
	words := make([]int64, n+1)
	relax := func(e int, id int64, score float64) {
		if best[e] == 0 || score >= best[e] {
			best[e], words[e] = score, id
		}
	}
	for i := range syms {
		found := false
		node := t.root.next[syms[i]]
		for j := i; node != nil; {
			if node.id >= 0 {
				relax(j+1, node.id, node.score+best[i])
				found = true
			}
			j++
			if j == n {
				break
			}
			node = node.next[syms[j]]
		}
		if !found { // the unknown piece: one symbol, id 0, score 0
			relax(i+1, 0, best[i])
		}
	}
	var rev []int64
	for i := n; i > 0; i -= t.steps[words[i]] {
		rev = append(rev, words[i])
	}
	ids := make([]int64, 0, len(rev))
	prevUnk := false
	for _, id := range rev {
		if !(prevUnk && id == 0) {
			ids = append(ids, id)
		}
		prevUnk = id == 0
	}
	for i, j := 0, len(ids)-1; i < j; i, j = i+1, j-1 {
		ids[i], ids[j] = ids[j], ids[i]
	}
	return ids
}

// Encode returns the ids of text, at most maxTokens of them (0: no limit),
// with zero type ids. Texts longer than MaxInputBytes are refused with
// ErrInputTooLarge.
func (t *PieceTokenizer) Encode(text string, maxTokens int) (Encoding, error) {
	if len(text) > MaxInputBytes {
		return Encoding{}, fmt.Errorf("%w: %d bytes, at most %d", ErrInputTooLarge, len(text), MaxInputBytes)
	}
	ids := t.EncodeIDs(text)
	if maxTokens > 0 && len(ids) > maxTokens {
		ids = ids[:maxTokens]
	}
	return Encoding{IDs: ids, TypeIDs: make([]int64, len(ids))}, nil
}

// VocabSize is the number of pieces.
func (t *PieceTokenizer) VocabSize() int { return len(t.pieces) }

// SpecialTokens is 0: no special tokens are added to an encoding.
func (t *PieceTokenizer) SpecialTokens() int { return 0 }

// TokenToID returns the id of a piece.
func (t *PieceTokenizer) TokenToID(token string) (int64, bool) {
	id, ok := t.byText[token]
	return id, ok
}

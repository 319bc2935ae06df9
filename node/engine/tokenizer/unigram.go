package tokenizer

import (
	"encoding/json"
	"fmt"
	"math"
	"unicode/utf8"
)

// unigramUnkPenalty is how much worse than the worst piece an unknown
// character scores (Hugging Face's K_UNK_PENALTY).
const unigramUnkPenalty = 10.0

// Unigram is Hugging Face's Unigram model (SentencePiece's unigram
// language model, as XLM-R and T5 use it): a word is cut into the
// vocabulary pieces whose scores (log probabilities) add up to the most,
// found by Viterbi over the byte positions. A character no piece covers
// scores as the unknown token; adjacent unknowns are fused into one, and
// with ByteFallback an unknown run is spelled as <0xNN> byte tokens.
type Unigram struct {
	vocab  map[string]int64
	scores []float64 // by id
	unk    int64     // -1: none
	// byteFallback spells unknown pieces as <0xNN> tokens.
	byteFallback bool
	maxLen       int     // longest piece in bytes
	unkScore     float64 // score of an unknown character
}

// UnigramPiece is one vocabulary entry: the piece and its score.
type UnigramPiece struct {
	// Piece is the token text.
	Piece string
	// Score is its log probability.
	Score float64
}

// NewUnigram builds a Unigram model; the id of a piece is its index.
// unkID < 0 means there is no unknown token.
func NewUnigram(pieces []UnigramPiece, unkID int64, byteFallback bool) (*Unigram, error) {
	if len(pieces) == 0 {
		return nil, fmt.Errorf("unigram: empty vocabulary")
	}
	if unkID >= int64(len(pieces)) {
		return nil, fmt.Errorf("unigram: unk_id %d is outside the vocabulary of %d", unkID, len(pieces))
	}
	m := &Unigram{vocab: make(map[string]int64, len(pieces)), scores: make([]float64, len(pieces)), unk: unkID, byteFallback: byteFallback}
	minScore := math.Inf(1)
	for id, p := range pieces {
		if _, dup := m.vocab[p.Piece]; !dup { // the first id of a piece wins
			m.vocab[p.Piece] = int64(id)
		}
		m.scores[id] = p.Score
		m.maxLen = max(m.maxLen, len(p.Piece))
		minScore = min(minScore, p.Score)
	}
	if m.unk < 0 {
		m.unk = -1
	}
	m.unkScore = minScore - unigramUnkPenalty
	return m, nil
}

// buildUnigram reads a Unigram model section.
func buildUnigram(vocabRaw json.RawMessage, unkID *int64, byteFallback bool) (Model, error) {
	var rows [][2]json.RawMessage
	if err := json.Unmarshal(vocabRaw, &rows); err != nil {
		return nil, fmt.Errorf("tokenizer: Unigram vocab (want [[piece, score], ...]): %w", err)
	}
	pieces := make([]UnigramPiece, len(rows))
	for i, r := range rows {
		if err := json.Unmarshal(r[0], &pieces[i].Piece); err != nil {
			return nil, fmt.Errorf("tokenizer: Unigram vocab entry %d: %w", i, err)
		}
		if err := json.Unmarshal(r[1], &pieces[i].Score); err != nil {
			return nil, fmt.Errorf("tokenizer: Unigram vocab entry %d score: %w", i, err)
		}
	}
	unk := int64(-1)
	if unkID != nil {
		unk = *unkID
	}
	m, err := NewUnigram(pieces, unk, byteFallback)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return m, nil
}

// TokenToID looks token up in the vocabulary.
func (m *Unigram) TokenToID(token string) (int64, bool) {
	id, ok := m.vocab[token]
	return id, ok
}

// Tokens returns the vocabulary.
func (m *Unigram) Tokens() map[string]int64 { return m.vocab }

// lattice node: the best path ending at a byte position.
type uniNode struct {
	score float64
	start int   // -1: not reached
	id    int64 // piece ending here on the best path
}

// Tokenize appends the best segmentation of word to dst, as Hugging
// Face's encode_optimized does (ties keep the shorter piece found first).
func (m *Unigram) Tokenize(word string, dst []int64) []int64 {
	n := len(word)
	if n == 0 {
		return dst
	}
	best := make([]uniNode, n+1)
	for i := range best {
		best[i].start = -1
	}
	best[0].start = 0
	for start := 0; start < n; {
		_, mblen := utf8.DecodeRuneInString(word[start:])
		base := best[start].score
		single := false
		for end := start + 1; end <= n && end-start <= m.maxLen; end++ {
			id, ok := m.vocab[word[start:end]]
			if !ok {
				continue
			}
			cand := base + m.scores[id]
			if t := &best[end]; t.start < 0 || cand > t.score {
				t.score, t.start, t.id = cand, start, id
			}
			if end-start == mblen {
				single = true
			}
		}
		if !single {
			cand := base + m.unkScore
			if t := &best[start+mblen]; t.start < 0 || cand > t.score {
				t.score, t.start, t.id = cand, start, m.unk
			}
		}
		start += mblen
	}
	// Walk back, fusing runs of unknowns into one piece.
	type piece struct {
		start, end int
		id         int64
	}
	var rev []piece
	for end := n; end > 0; {
		nd := best[end]
		if nd.id == m.unk && m.unk >= 0 && len(rev) > 0 && rev[len(rev)-1].id == m.unk {
			rev[len(rev)-1].start = nd.start
		} else {
			rev = append(rev, piece{nd.start, end, nd.id})
		}
		end = nd.start
	}
	for i := len(rev) - 1; i >= 0; i-- {
		p := rev[i]
		if p.id != m.unk || m.unk < 0 {
			if p.id >= 0 {
				dst = append(dst, p.id)
			}
			continue
		}
		text := word[p.start:p.end]
		if id, ok := m.vocab[text]; ok { // a fused run can be a piece
			dst = append(dst, id)
			continue
		}
		if m.byteFallback {
			if ids, ok := m.bytePieces(text); ok {
				dst = append(dst, ids...)
				continue
			}
		}
		dst = append(dst, m.unk)
	}
	return dst
}

// bytePieces spells text as <0xNN> tokens, if all of them exist.
func (m *Unigram) bytePieces(text string) ([]int64, bool) {
	ids := make([]int64, 0, len(text))
	for i := 0; i < len(text); i++ {
		id, ok := m.vocab[fmt.Sprintf("<0x%02X>", text[i])]
		if !ok {
			return nil, false
		}
		ids = append(ids, id)
	}
	return ids, true
}

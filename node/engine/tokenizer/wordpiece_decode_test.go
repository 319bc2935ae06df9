package tokenizer

import (
	"path/filepath"
	"testing"
)

// TestWordPieceCleanup: the cleanup of the WordPiece decoder gives what
// Hugging Face's tokenizers give (the answers below are the Rust library's,
// through scripts/tokref/ref.js, on the BERT vocabulary of tiny-bert):
// each token is cleaned with the space before it, the replacements one
// after the other. A single pass over the joined text gave ")'!?" and
// "don't do that".
func TestWordPieceCleanup(t *testing.T) {
	d := WordPieceDecoder{Prefix: "##", Cleanup: true}
	for _, c := range []struct {
		tokens []string
		want   string
	}{
		{[]string{")", "'", "!", "?"}, ") '!?"},
		{[]string{"don", "'", "t", "do", "that"}, "don ' t do that"},
		{[]string{"i", "'", "m", "here", ",", "ok", "?"}, "i ' m here, ok?"},
		{[]string{"a", ".", "b", "!", "c", "?", "d", ",", "e"}, "a. b! c? d, e"},
		{[]string{"he", "said", "'", "hi", "'", "."}, "he said ' hi '."},
		{[]string{"'", "'", "'"}, "' ' '"},
		{[]string{"un", "##aff", "##able", "."}, "unaffable."},
		// Tokens that hold a contraction or a space (added tokens).
		{[]string{"dog", "'s", "n't", "'m", "'ve", "'re"}, "dog'sn't'm've're"},
		{[]string{"i", "do not", "know"}, "i don't know"},
		{[]string{"x", "' y"}, "x'y"},
	} {
		if got := string(d.Decode(nil, c.tokens)); got != c.want {
			t.Errorf("Decode(%q) = %q, want %q", c.tokens, got, c.want)
		}
	}
	if got := string(WordPieceDecoder{Prefix: "##"}.Decode(nil, []string{")", "'", "!", "?"})); got != ") ' ! ?" {
		t.Errorf("without cleanup: %q", got)
	}
}

// TestParityWordPieceDecode asks the reference about the cases above on
// the BERT fixture (its vocabulary extended by their tokens).
func TestParityWordPieceDecode(t *testing.T) {
	src, err := filepath.Abs("testdata/bert_small.json")
	if err != nil {
		t.Fatal(err)
	}
	extra := []string{")", "?", "don", "t", "do", "that", "i", "m", "here", "ok", "b", "c", "d", "e", "he", "said", "dog", "'s", "n't", "'m", "'ve", "'re", "x"}
	file := editJSON(t, src, func(m map[string]any) {
		// The reference numbers added tokens that the model's vocabulary
		// lacks after it, so only those in it stay (the specials).
		vocab := m["model"].(map[string]any)["vocab"].(map[string]any)
		var kept []any
		for _, a := range m["added_tokens"].([]any) {
			if _, ok := vocab[a.(map[string]any)["content"].(string)]; ok {
				kept = append(kept, a)
			}
		}
		m["added_tokens"] = kept
		for _, tok := range extra {
			if _, ok := vocab[tok]; !ok {
				vocab[tok] = float64(len(vocab))
			}
		}
	})
	tok := loadFile(t, file)
	var lists [][]int64
	for _, seq := range [][]string{
		{")", "'", "!", "?"}, {"don", "'", "t", "do", "that"}, {"i", "'", "m", "here", ",", "ok", "?"},
		{"a", ".", "b", "!", "c", "?", "d", ",", "e"}, {"he", "said", "'", "hi", "'", "."}, {"'", "'", "'"},
		{"un", "##aff", "##able", "."}, {"dog", "'s", "n't", "'m", "'ve", "'re"}, {"hello", "!", "!", ",", "world", "##s", "."},
	} {
		var ids []int64
		for _, s := range seq {
			id, ok := tok.TokenToID(s)
			if !ok {
				t.Fatalf("token %q is not in the vocabulary", s)
			}
			ids = append(ids, id)
		}
		lists = append(lists, ids)
	}
	rust, _ := runReference(t, file, []string{}, lists)
	for i, ids := range lists {
		if got := tok.Decode(ids, false); got != rust.Decode[i] {
			t.Errorf("decode %q = %q, Hugging Face %q", tok.Tokens(ids), got, rust.Decode[i])
		}
	}
}

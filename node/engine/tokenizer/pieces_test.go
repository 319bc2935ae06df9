package tokenizer

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

// usePieces loads the Universal Sentence Encoder lite vocabulary that
// scripts/assets-use.sh installs; a missing file fails.
func usePieces(t testing.TB) (*PieceTokenizer, string) {
	t.Helper()
	dir := os.Getenv("INFERMESH_USE_LITE_DIR")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(home, ".cache", "infermesh", "models", "use-lite")
		if c := os.Getenv("INFERMESH_CACHE"); c != "" {
			dir = filepath.Join(c, "models", "use-lite")
		}
	}
	path := filepath.Join(dir, "vocab.json")
	tok, err := LoadPieceVocab(path)
	if err != nil {
		t.Fatalf("%v (run scripts/assets-use.sh)", err)
	}
	return tok, path
}

// TestPieceParity compares the ids with the reference tokenizer (the TF.js
// wrapper's JS code, run by scripts/tokref/use.js) on the parity corpus.
func TestPieceParity(t *testing.T) {
	tok, vocab := usePieces(t)
	ref := filepath.Join(refCache(t), "tokref", "energetic-ai-embeddings", "index.js")
	if _, err := os.Stat(ref); err != nil {
		t.Fatalf("reference tokenizer missing (run scripts/assets-use.sh): %v", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is needed for the reference tokenizer: %v", err)
	}
	texts := append(parityTexts(300, nil),
		"The quick brown fox jumps over the lazy dog.", "How old are you?", "a  b   c", " lead", "trail ",
		"ﬁﬂ ㍻ Ⅻ ½", "\u00a0nbsp\u3000ideographic", "x\u0301\u0302", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "￿\ufffd", strings.Repeat("ab", 300))
	req, err := json.Marshal(texts)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, filepath.Join("..", "..", "..", "scripts", "tokref", "use.js"), ref, vocab)
	cmd.Stdin = bytes.NewReader(req)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference: %v\n%s", err, stderr.String())
	}
	var want [][]int64
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatalf("reference output: %v", err)
	}
	if len(want) != len(texts) {
		t.Fatalf("reference answered %d of %d texts", len(want), len(texts))
	}
	bad := 0
	for i, text := range texts {
		got := tok.EncodeIDs(text)
		if len(got) == 0 && len(want[i]) == 0 {
			continue
		}
		if !slices.Equal(got, want[i]) {
			bad++
			if bad <= 10 {
				t.Errorf("EncodeIDs(%q)\n got %v\nwant %v", text, got, want[i])
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d texts differ from the reference", bad, len(texts))
	}
}

// TestPieceEncodeKnown pins a few encodings of the real vocabulary.
func TestPieceEncodeKnown(t *testing.T) {
	tok, _ := usePieces(t)
	for _, c := range []struct {
		text string
		want []string
	}{
		{"Hello world", []string{"▁H", "ello", "▁world"}}, // no lower-casing
		{"", nil},
	} {
		var got []string
		for _, id := range tok.EncodeIDs(c.text) {
			got = append(got, tok.pieces[id])
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("EncodeIDs(%q) pieces %q, want %q", c.text, got, c.want)
		}
	}
	enc, err := tok.Encode("The quick brown fox jumps over the lazy dog.", 3)
	if err != nil || len(enc.IDs) != 3 || len(enc.TypeIDs) != 3 {
		t.Errorf("Encode with limit 3: %v, %v", enc, err)
	}
	if _, err := tok.Encode(strings.Repeat("a", MaxInputBytes+1), 0); err == nil {
		t.Error("an oversized text was accepted")
	}
}

// fuzzPieces is a small vocabulary: six reserved entries, then pieces with
// mixed scores. No piece lies outside the Basic Multilingual Plane: the
// reference's backward walk steps by a piece's UTF-16 length, so such a
// piece would swallow the piece before it (as in the reference; the real
// vocabulary has none).
func fuzzPieces(tb testing.TB) *PieceTokenizer {
	tb.Helper()
	ps := []UnigramPiece{{"\ufffd", 0}, {"<s>", 0}, {"</s>", 0}, {"x1", 0}, {"x2", 0}, {"x3", 0}}
	for i, p := range []string{"▁", "a", "b", "c", "ab", "▁a", "▁ab", "abc", "é", "☃", "▁the", "th", "e", "h", "t"} {
		ps = append(ps, UnigramPiece{Piece: p, Score: -1 - float64(i%4)})
	}
	tok, err := NewPieceTokenizer(ps)
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

// FuzzEncodePieces: ids stay in the vocabulary, no two unknowns in a row,
// and without unknowns the pieces spell the processed text exactly.
func FuzzEncodePieces(f *testing.F) {
	tok := fuzzPieces(f)
	for _, s := range []string{"ab abc", "the a", "zz", "é☃x😀", "  ", "\xff\xfe", "ﬁ", strings.Repeat("ab ", 40)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		ids := tok.EncodeIDs(text)
		var b strings.Builder
		unk := false
		for i, id := range ids {
			if id < 0 || id >= int64(len(tok.pieces)) {
				t.Fatalf("EncodeIDs(%q): id %d outside the vocabulary", text, id)
			}
			p := tok.pieces[id]
			if id == 0 {
				if i > 0 && ids[i-1] == 0 {
					t.Fatalf("EncodeIDs(%q) = %v: consecutive unknowns", text, ids)
				}
				unk = true
			}
			b.WriteString(p)
		}
		n := norm.NFKC.String(text)
		if n == "" {
			if len(ids) != 0 {
				t.Fatalf("EncodeIDs(%q) = %v, want none", text, ids)
			}
			return
		}
		want := "▁" + strings.ReplaceAll(n, " ", "▁")
		if !unk && b.String() != want {
			t.Fatalf("EncodeIDs(%q) spells %q, want %q", text, b.String(), want)
		}
	})
}

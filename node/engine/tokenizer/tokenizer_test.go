package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const fixture = "testdata/bert_small.json"

func load(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := Load(fixture)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return tok
}

// variant loads the fixture after edit has changed its decoded JSON.
func variant(t *testing.T, edit func(m map[string]any)) (*Tokenizer, error) {
	t.Helper()
	data, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return Parse(out)
}

func TestEncodeWordPiece(t *testing.T) {
	tok := load(t)
	// Expected ids come from the fixture's vocabulary: [CLS]=2 [SEP]=3 [UNK]=1.
	cases := []struct {
		name, text string
		want       []int64
	}{
		{"subwords", "unaffable", []int64{2, 5, 6, 7, 3}},
		{"case and punctuation", "The Quick, brown FOX!", []int64{2, 8, 9, 12, 10, 11, 14, 3}},
		{"accents stripped", "Café", []int64{2, 20, 3}},
		{"combining accent stripped", "CAFE\u0301", []int64{2, 20, 3}},
		{"cjk spaced out", "hello中国world", []int64{2, 15, 21, 22, 16, 3}},
		{"clean text", "hello\tworld\x00\u200b", []int64{2, 15, 16, 3}},
		{"format char removed inside word", "hel\u200blo", []int64{2, 15, 3}},
		{"vertical tab is a control char", "\x0bhello", []int64{2, 15, 3}},
		{"unicode whitespace", "\u00a0hello\u3000world", []int64{2, 15, 16, 3}},
		{"partial match is whole-word unk", "foxes", []int64{2, 1, 3}},
		{"continuations", "runnings jumped", []int64{2, 18, 19, 17, 24, 25, 3}},
		{"apostrophe", "fox's", []int64{2, 11, 26, 27, 3}},
		{"ascii symbol is punctuation", "$5", []int64{2, 23, 1, 3}},
		{"word at char limit", "aaaaaaaaaa", []int64{2, 30, 31, 31, 31, 31, 31, 31, 31, 31, 31, 3}},
		{"word over char limit", "aaaaaaaaaaa", []int64{2, 1, 3}},
		{"special tokens in text", "[CLS] hello [MASK]", []int64{2, 2, 15, 4, 3}},
		{"special tokens are case sensitive", "[mask]", []int64{2, 1, 1, 1, 3}},
		{"normalized added token", "hi <SMILE>!", []int64{2, 28, 32, 14, 3}},
		{"single word added token", "zz zzz", []int64{2, 33, 1, 3}},
		{"invalid utf8 dropped by clean text", "hello\xffworld", []int64{2, 1, 3}},
		{"empty", "", []int64{2, 3}},
		{"only spaces", "   \n ", []int64{2, 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			enc, err := tok.Encode(c.text, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(enc.IDs, c.want) {
				t.Fatalf("Encode(%q) = %v %q, want %v %q", c.text, enc.IDs, tok.Tokens(enc.IDs), c.want, tok.Tokens(c.want))
			}
			if len(enc.TypeIDs) != len(enc.IDs) || slices.ContainsFunc(enc.TypeIDs, func(v int64) bool { return v != 0 }) {
				t.Fatalf("TypeIDs = %v, want %d zeros", enc.TypeIDs, len(enc.IDs))
			}
		})
	}
}

func TestTokensNamesPieces(t *testing.T) {
	tok := load(t)
	enc, err := tok.Encode("unaffable", 0)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(tok.Tokens(enc.IDs), " ")
	if want := "[CLS] un ##aff ##able [SEP]"; got != want {
		t.Fatalf("tokens = %q, want %q", got, want)
	}
	if id, ok := tok.TokenToID("<Smile>"); !ok || id != 32 {
		t.Fatalf("TokenToID(<Smile>) = %d, %v", id, ok)
	}
	if id, ok := tok.TokenToID("##aff"); !ok || id != 6 {
		t.Fatalf("TokenToID(##aff) = %d, %v", id, ok)
	}
	if tok.VocabSize() != 34 {
		t.Fatalf("VocabSize = %d, want 34", tok.VocabSize())
	}
	if tok.SpecialTokens() != 2 {
		t.Fatalf("SpecialTokens = %d, want 2", tok.SpecialTokens())
	}
}

func TestTruncationKeepsSpecialTokens(t *testing.T) {
	tok := load(t)
	text := "the quick brown fox jumped"
	for _, c := range []struct {
		max  int
		want []int64
	}{
		{0, []int64{2, 8, 9, 10, 11, 24, 25, 3}},
		{100, []int64{2, 8, 9, 10, 11, 24, 25, 3}},
		{8, []int64{2, 8, 9, 10, 11, 24, 25, 3}},
		{7, []int64{2, 8, 9, 10, 11, 24, 3}}, // cuts inside "jumped"
		{5, []int64{2, 8, 9, 10, 3}},
		{2, []int64{2, 3}},
	} {
		enc, err := tok.Encode(text, c.max)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(enc.IDs, c.want) {
			t.Errorf("max %d: got %v, want %v", c.max, enc.IDs, c.want)
		}
	}
	if _, err := tok.Encode(text, 1); err == nil {
		t.Fatal("a limit below the special token count must fail")
	}
}

func TestFileTruncation(t *testing.T) {
	left, err := variant(t, func(m map[string]any) {
		m["truncation"] = map[string]any{"direction": "Left", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
	})
	if err != nil {
		t.Fatal(err)
	}
	enc, err := left.Encode("the quick brown fox", 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{2, 10, 11, 3}; !slices.Equal(enc.IDs, want) {
		t.Fatalf("left truncation: got %v, want %v", enc.IDs, want)
	}
	// An explicit limit replaces the file's length and keeps its direction.
	enc, err = left.Encode("the quick brown fox", 5)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{2, 9, 10, 11, 3}; !slices.Equal(enc.IDs, want) {
		t.Fatalf("left truncation at 5: got %v, want %v", enc.IDs, want)
	}
}

func TestPostProcessors(t *testing.T) {
	typed, err := variant(t, func(m map[string]any) {
		single := m["post_processor"].(map[string]any)["single"].([]any)
		single[2].(map[string]any)["SpecialToken"].(map[string]any)["type_id"] = 1
	})
	if err != nil {
		t.Fatal(err)
	}
	enc, err := typed.Encode("hello world", 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{0, 0, 0, 1}; !slices.Equal(enc.TypeIDs, want) {
		t.Fatalf("type ids = %v, want %v", enc.TypeIDs, want)
	}

	for _, typ := range []string{"BertProcessing", "RobertaProcessing"} {
		bp, err := variant(t, func(m map[string]any) {
			m["post_processor"] = map[string]any{"type": typ, "sep": []any{"[SEP]", 3}, "cls": []any{"[CLS]", 2}}
		})
		if err != nil {
			t.Fatal(err)
		}
		enc, err := bp.Encode("hello world", 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := []int64{2, 15, 16, 3}; !slices.Equal(enc.IDs, want) {
			t.Fatalf("%s: got %v, want %v", typ, enc.IDs, want)
		}
	}

	none, err := variant(t, func(m map[string]any) { m["post_processor"] = nil })
	if err != nil {
		t.Fatal(err)
	}
	enc, err = none.Encode("hello world", 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{15}; !slices.Equal(enc.IDs, want) {
		t.Fatalf("no post-processor: got %v, want %v", enc.IDs, want)
	}
}

func TestNormalizerVariants(t *testing.T) {
	keepAccents, err := variant(t, func(m map[string]any) {
		m["normalizer"].(map[string]any)["strip_accents"] = false
	})
	if err != nil {
		t.Fatal(err)
	}
	enc, err := keepAccents.Encode("Café", 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{2, 1, 3}; !slices.Equal(enc.IDs, want) {
		t.Fatalf("accents kept: got %v, want %v", enc.IDs, want)
	}
	seq, err := variant(t, func(m map[string]any) {
		m["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "NFD"}, map[string]any{"type": "StripAccents"}, map[string]any{"type": "Lowercase"},
		}}
	})
	if err != nil {
		t.Fatal(err)
	}
	enc, err = seq.Encode("CAFÉ", 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{2, 20, 3}; !slices.Equal(enc.IDs, want) {
		t.Fatalf("sequence normalizer: got %v, want %v", enc.IDs, want)
	}

	n := BertNormalizer{Lowercase: true}
	if got := n.Normalize("İX"); got != "i\u0307x" {
		t.Fatalf("lowercase of U+0130 = %q, want full mapping", got)
	}
	n = BertNormalizer{StripAccents: true, Lowercase: true}
	if got := n.Normalize("İX"); got != "ix" {
		t.Fatalf("strip then lowercase of U+0130 = %q, want ix", got)
	}
}

func TestLoadErrors(t *testing.T) {
	cases := []struct {
		name, want string
		edit       func(m map[string]any)
	}{
		{"unknown model", `unsupported model type "WordLevel"`, func(m map[string]any) {
			m["model"] = map[string]any{"type": "WordLevel", "vocab": map[string]any{}}
		}},
		{"bpe merge out of vocabulary", `makes "ab", which is not in the vocabulary`, func(m map[string]any) {
			m["model"] = map[string]any{"type": "BPE", "vocab": map[string]any{"a": 0, "b": 1}, "merges": []any{"a b"}}
		}},
		{"untyped bpe model with a bad merge", `want two tokens`, func(m map[string]any) {
			m["model"] = map[string]any{"vocab": map[string]any{"a": 0}, "merges": []any{"a"}}
		}},
		{"bpe dropout", `dropout`, func(m map[string]any) {
			m["model"] = map[string]any{"type": "BPE", "vocab": map[string]any{"a": 0}, "merges": []any{}, "dropout": 0.1}
		}},
		{"missing unk", `unk_token "[NOPE]"`, func(m map[string]any) {
			m["model"].(map[string]any)["unk_token"] = "[NOPE]"
		}},
		{"unknown normalizer", `unsupported normalizer type "Nmt"`, func(m map[string]any) {
			m["normalizer"] = map[string]any{"type": "Nmt"}
		}},
		{"empty charsmap", `charsmap`, func(m map[string]any) {
			m["normalizer"] = map[string]any{"type": "Precompiled", "precompiled_charsmap": ""}
		}},
		{"bad metaspace scheme", `prepend_scheme`, func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "sometimes"}
		}},
		{"unknown pre-tokenizer", `unsupported pre_tokenizer type "Punctuation"`, func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Punctuation"}
		}},
		{"bad split pattern", `pattern`, func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(?<"}, "behavior": "Isolated"}
		}},
		{"bad split behavior", `unknown split behavior`, func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Sideways"}
		}},
		{"negative id", "outside", func(m map[string]any) {
			m["model"].(map[string]any)["vocab"].(map[string]any)["bad"] = -1
		}},
		{"huge id", "outside", func(m map[string]any) {
			m["added_tokens"] = append(m["added_tokens"].([]any), map[string]any{"id": MaxVocabSize, "content": "x"})
		}},
		{"template without ids", `special token "[X]"`, func(m map[string]any) {
			single := m["post_processor"].(map[string]any)["single"].([]any)
			single[0].(map[string]any)["SpecialToken"].(map[string]any)["id"] = "[X]"
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := variant(t, c.edit)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
		})
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Fatal("loading a missing file must fail")
	}
}

func TestInputTooLarge(t *testing.T) {
	tok := load(t)
	_, err := tok.Encode(strings.Repeat("a ", MaxInputBytes/2+1), 0)
	if !errors.Is(err, ErrInputTooLarge) {
		t.Fatalf("err = %v, want ErrInputTooLarge", err)
	}
	enc, err := tok.Encode(strings.Repeat("a ", MaxInputBytes/2), 16)
	if err != nil || len(enc.IDs) != 16 {
		t.Fatalf("largest input: %d ids, err %v", len(enc.IDs), err)
	}
}

func FuzzEncode(f *testing.F) {
	tok := load(f)
	for _, s := range []string{"unaffable", "[CLS]x[SEP]", "hi <smile>", "中国\u0301", "zz\x00zz", "\xff\xfe", "İ̇̇", strings.Repeat("a", 120)} {
		f.Add(s, 0)
		f.Add(s, 5)
	}
	f.Fuzz(func(t *testing.T, text string, max int) {
		max %= 64
		enc, err := tok.Encode(text, max)
		if max == 1 { // no room for [CLS] and [SEP]
			if err == nil {
				t.Fatal("limit 1 accepted")
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(enc.IDs) < 2 || enc.IDs[0] != 2 || enc.IDs[len(enc.IDs)-1] != 3 {
			t.Fatalf("Encode(%q) = %v: want [CLS] ... [SEP]", text, enc.IDs)
		}
		if max > 0 && len(enc.IDs) > max {
			t.Fatalf("Encode(%q, %d) has %d ids", text, max, len(enc.IDs))
		}
		for _, id := range enc.IDs {
			if id < 0 || id >= int64(tok.VocabSize()) {
				t.Fatalf("id %d outside the vocabulary", id)
			}
		}
		again, err := tok.Encode(text, max)
		if err != nil || !slices.Equal(again.IDs, enc.IDs) {
			t.Fatalf("Encode(%q) not deterministic", text)
		}
	})
}

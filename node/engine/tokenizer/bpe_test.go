package tokenizer

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// bpeFixture is a Qwen2-style byte-level BPE tokenizer.json: NFC, the Qwen2
// Split pattern (look-ahead), ByteLevel, and ids equal to byte values for
// the 256 single-byte tokens, so expectations can be derived by hand. Its
// merges, in rank order: Ġ t, h e, Ġt he, l l, e ll, Ġ w, o r, Ġw or,
// Ġwor l, Ġworl d, 1 2, ' s (ids 256..267); added tokens <|endoftext|> 268,
// <|im_start|> 269, <|im_end|> 270 (special) and <tool_call> 271 (not special).
const bpeFixture = "testdata/bpe_small.json"

func loadBPE(t testing.TB, edit func(m map[string]any)) *Tokenizer {
	t.Helper()
	data, err := os.ReadFile(bpeFixture)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		if data, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := Parse(data)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return tok
}

func TestEncodeByteLevelBPE(t *testing.T) {
	tok := loadBPE(t, nil)
	cases := []struct {
		name, text string
		want       []int64
	}{
		// "the" has no "t he" merge; " world" merges Ġw, or, Ġwor, Ġworl, Ġworld.
		{"words", "the world", []int64{'t', 257, 265}},
		{"leading space word", " the", []int64{258}},
		// h e (rank 1) beats l l (rank 3), so "e ll" never applies.
		{"rank order", "hello", []int64{257, 259, 'o'}},
		// Contraction split off; digits one by one, so "1 2" never applies.
		{"contraction and digits", "it's 123", []int64{'i', 't', 267, ' ', '1', '2', '3'}},
		{"special tokens cut first", "<|im_start|>user\nhi<|im_end|>", []int64{269, 'u', 's', 'e', 'r', '\n', 'h', 'i', 270}},
		// é is U+00E9 = C3 A9; the decomposed form is composed by NFC first.
		{"nfc", "cafe\u0301", []int64{'c', 'a', 'f', 0xC3, 0xA9}},
		// Of "  b", \s+(?!\S) takes the first space only (look-ahead) and the
		// letter rule takes " b"; there is no "Ġ b" merge.
		{"look-ahead whitespace", "a  b", []int64{'a', ' ', ' ', 'b'}},
		{"newlines", "a\n\nb", []int64{'a', '\n', '\n', 'b'}},
		{"non-special added token", "x<tool_call>y", []int64{'x', 271, 'y'}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := tok.EncodeContent(c.text)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("EncodeContent(%q) = %v (%q), want %v", c.text, got, tok.Tokens(got), c.want)
			}
			enc, err := tok.Encode(c.text, 0)
			if err != nil || !slices.Equal(enc.IDs, c.want) {
				t.Fatalf("Encode(%q) = %v, %v; a ByteLevel post-processor adds nothing", c.text, enc.IDs, err)
			}
		})
	}
}

func TestBPEMergesArrayForm(t *testing.T) {
	strs := loadBPE(t, nil)
	arrays := loadBPE(t, func(m map[string]any) {
		model := m["model"].(map[string]any)
		var pairs []any
		for _, s := range model["merges"].([]any) {
			a, b, _ := strings.Cut(s.(string), " ")
			pairs = append(pairs, []any{a, b})
		}
		model["merges"] = pairs
	})
	for _, text := range []string{"the world", "hello there", "it's 12"} {
		a, _ := strs.EncodeContent(text)
		b, _ := arrays.EncodeContent(text)
		if !slices.Equal(a, b) {
			t.Fatalf("%q: string merges %v, array merges %v", text, a, b)
		}
	}
}

func TestBPEUnknownAndFallback(t *testing.T) {
	base := map[string]any{"a": 0, "b": 1, "ab": 2, "<unk>": 3, "<0x78>": 4}
	build := func(extra map[string]any) *Tokenizer {
		model := map[string]any{"type": "BPE", "vocab": base, "merges": []any{[]any{"a", "b"}}, "unk_token": "<unk>"}
		for k, v := range extra {
			model[k] = v
		}
		data, _ := json.Marshal(map[string]any{"model": model})
		tok, err := Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	cases := []struct {
		name  string
		extra map[string]any
		want  []int64
	}{
		{"unk per character", nil, []int64{2, 3, 3, 0}},
		{"fuse unk", map[string]any{"fuse_unk": true}, []int64{2, 3, 0}},
		{"byte fallback", map[string]any{"byte_fallback": true}, []int64{2, 4, 4, 0}},
		{"no unk drops", map[string]any{"unk_token": nil}, []int64{2, 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, _ := build(c.extra).EncodeContent("abxxa")
			if !slices.Equal(got, c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
	// ignore_merges takes a word found in the vocabulary whole, even when
	// the merges would not build it.
	vocab := map[string]any{"a": 0, "b": 1, "c": 2, "bc": 3, "abc": 4}
	for _, ignore := range []bool{false, true} {
		data, _ := json.Marshal(map[string]any{"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": []any{"b c"}, "ignore_merges": ignore}})
		tok, err := Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := tok.EncodeContent("abc")
		want := []int64{0, 3}
		if ignore {
			want = []int64{4}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("ignore_merges=%v: got %v, want %v", ignore, got, want)
		}
	}
}

func TestByteLevelGPT2Regex(t *testing.T) {
	b, err := NewByteLevel(true, true)
	if err != nil {
		t.Fatal(err)
	}
	got := slices.Collect(b.Words("Hello  world's"))
	// The prefix space joins "Hello"; of two spaces, \s+(?!\S) takes the
	// first and " world" keeps the second; "'s" is a contraction.
	want := []string{"ĠHello", "Ġ", "Ġworld", "'s"}
	if !slices.Equal(got, want) {
		t.Fatalf("Words = %q, want %q", got, want)
	}
}

func TestSplitBehaviors(t *testing.T) {
	cases := []struct {
		behavior SplitBehavior
		want     []string
	}{
		{SplitRemoved, []string{"a", "b", "c"}},
		{SplitIsolated, []string{"a", "-", "b", "-", "-", "c"}},
		{SplitMergedWithPrevious, []string{"a-", "b-", "-", "c"}},
		{SplitMergedWithNext, []string{"a", "-b", "-", "-c"}},
		{SplitContiguous, []string{"a", "-", "b", "--", "c"}},
	}
	for _, c := range cases {
		for _, regex := range []bool{false, true} {
			s, err := NewSplit("-", regex, c.behavior, false)
			if err != nil {
				t.Fatal(err)
			}
			if got := slices.Collect(s.Words("a-b--c")); !slices.Equal(got, c.want) {
				t.Errorf("behavior %d regex=%v: %q, want %q", c.behavior, regex, got, c.want)
			}
		}
	}
	inv, err := NewSplit(`\d+`, true, SplitRemoved, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Collect(inv.Words("ab12cd3")); !slices.Equal(got, []string{"12", "3"}) {
		t.Errorf("inverted: %q", got)
	}
	for _, d := range []struct {
		individual bool
		want       []string
	}{{false, []string{"ab", "123", "c"}}, {true, []string{"ab", "1", "2", "3", "c"}}} {
		if got := slices.Collect(Digits{IndividualDigits: d.individual}.Words("ab123c")); !slices.Equal(got, d.want) {
			t.Errorf("Digits(%v) = %q, want %q", d.individual, got, d.want)
		}
	}
	ws := PreTokenizerSequence{WhitespaceSplit{}, Digits{IndividualDigits: true}}
	if got := slices.Collect(ws.Words("x12 y")); !slices.Equal(got, []string{"x", "1", "2", "y"}) {
		t.Errorf("Sequence = %q", got)
	}
}

func TestDecode(t *testing.T) {
	tok := loadBPE(t, nil)
	ids := []int64{269, 'u', 's', 'e', 'r', '\n', 258, 265, 271, 0xC3, 0xA9, 270}
	if got, want := tok.Decode(ids, false), "<|im_start|>user\n the world<tool_call>é<|im_end|>"; got != want {
		t.Fatalf("Decode = %q, want %q", got, want)
	}
	if got, want := tok.Decode(ids, true), "user\n the world<tool_call>é"; got != want {
		t.Fatalf("Decode(skip special) = %q, want %q", got, want)
	}
	// A lone lead byte and a stray continuation byte become one U+FFFD each.
	if got, want := tok.Decode([]int64{'a', 0xC3, 'b', 0xA9}, false), "a\uFFFDb\uFFFD"; got != want {
		t.Fatalf("Decode(invalid) = %q, want %q", got, want)
	}
	if !tok.PerTokenDecoding() {
		t.Fatal("a ByteLevel decoder decodes per token")
	}
	if b := tok.TokenBytes(0xC3); !slices.Equal(b, []byte{0xC3}) {
		t.Fatalf("TokenBytes(0xC3) = %x", b)
	}
}

func TestDecodeStreamHoldsPartialUTF8(t *testing.T) {
	tok := loadBPE(t, nil)
	d := tok.NewDecodeStream(true)
	// "€" is E2 82 AC: nothing comes out until its last byte.
	steps := []struct {
		id   int64
		want string
	}{{'a', "a"}, {0xE2, ""}, {0x82, ""}, {270, ""}, {0xAC, "€"}, {0xF0, ""}}
	for _, s := range steps {
		if got := d.Add(s.id); got != s.want {
			t.Fatalf("Add(%#x) = %q, want %q", s.id, got, s.want)
		}
	}
	if got := d.Flush(); got != "\uFFFD" {
		t.Fatalf("Flush = %q, want U+FFFD for the unfinished F0", got)
	}
}

// randomText mixes ASCII, whitespace, digits, contractions, accents,
// CJK, emoji and the fixture's added tokens.
func randomText(r *rand.Rand) string {
	pieces := []string{"the", " world", "hello", "'s", "'LL", " ", "  ", "\n", "\r\n", "\t", "123", "é", "e\u0301", "日本語", "😀", "👍🏽", "<|im_end|>", "<tool_call>", "!?", "\u00a0", "ﬁ", "Ω"}
	var b strings.Builder
	for range r.IntN(12) {
		if r.IntN(3) == 0 {
			b.WriteRune(rune(r.IntN(0x2FFFF) + 1))
		} else {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
	}
	return strings.ToValidUTF8(b.String(), "")
}

func TestBPERoundTripProperty(t *testing.T) {
	tok := loadBPE(t, nil)
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		s := randomText(r)
		checkRoundTrip(t, tok, s)
	}
}

// checkRoundTrip asserts Decode(Encode(s)) == NFC(s), that every id is in
// the vocabulary, and that a DecodeStream gives the same text.
func checkRoundTrip(t *testing.T, tok *Tokenizer, s string) {
	t.Helper()
	ids, err := tok.EncodeContent(s)
	if err != nil {
		t.Fatal(err)
	}
	want := norm.NFC.String(lossyString(s))
	if got := tok.Decode(ids, false); got != want {
		t.Fatalf("Decode(Encode(%q)) = %q (ids %v)", s, got, ids)
	}
	d := tok.NewDecodeStream(false)
	var b strings.Builder
	for _, id := range ids {
		if id < 0 || id >= int64(tok.VocabSize()) {
			t.Fatalf("id %d outside the vocabulary", id)
		}
		part := d.Add(id)
		if !utf8.ValidString(part) {
			t.Fatalf("stream emitted invalid UTF-8 %q", part)
		}
		b.WriteString(part)
	}
	b.WriteString(d.Flush())
	if b.String() != want {
		t.Fatalf("stream decode of %q = %q", s, b.String())
	}
}

func TestDecodeStreamEqualsDecodeForRandomIDs(t *testing.T) {
	tok := loadBPE(t, nil)
	r := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		ids := make([]int64, r.IntN(10))
		for i := range ids {
			ids[i] = int64(r.IntN(tok.VocabSize()))
		}
		for _, skip := range []bool{false, true} {
			d := tok.NewDecodeStream(skip)
			var b strings.Builder
			for _, id := range ids {
				b.WriteString(d.Add(id))
			}
			b.WriteString(d.Flush())
			if want := tok.Decode(ids, skip); b.String() != want {
				t.Fatalf("ids %v skip=%v: stream %q, Decode %q", ids, skip, b.String(), want)
			}
		}
	}
}

func FuzzEncodeBPE(f *testing.F) {
	for _, s := range []string{"", "the world", "it's 123", "<|im_start|>a<|im_end|>", "e\u0301\n\n  x", "\xff\xfe", "😀😀"} {
		f.Add(s)
	}
	tok := loadBPE(f, nil)
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 4096 {
			return
		}
		checkRoundTrip(t, tok, s)
	})
}

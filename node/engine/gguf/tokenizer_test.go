package gguf_test

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine/gguf"
	"github.com/infermesh/infermesh/node/engine/llama/llamatest"
)

// parityStrings returns a few hundred texts: sentences, words, numbers,
// punctuation, whitespace runs, contractions, non-ASCII text and emoji,
// chat markup with control tokens, random byte soups.
func parityStrings() []string {
	base := []string{
		"", " ", "  ", "\n", "\n\n\t ", "Hello world", "Hello, world!", " leading space", "trailing space ",
		"The mesh is a group of small computers that answer questions together.",
		"I'm sure they'll say it's fine; we've done it, you'd agree.", "DON'T SHOUT'S", "numbers 1234567 and 3.14159",
		"2024-11-29T07:00:00Z", "a\r\nb\rc\nd", "tabs\tand\tspaces   here", "café naïve résumé", "Grüße aus Köln",
		"日本語のテキスト", "中文字符测试", "한국어", "Привет, мир", "مرحبا", "emoji 😀🎉👍🏽", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
		"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "<|endoftext|>",
		"<|im_start|>system\nYou are a helpful assistant.<|im_end|>", "x<|im_end|>y", "    indented code\n        more", "a  b   c    d",
		"!!!???...,,,", "$100 & 50% off #sale @home", "line one\n\nline three\n", "\u00a0non-breaking\u00a0space", "zero\u200bwidth",
	}
	r := rand.New(rand.NewPCG(1, 2))
	words := strings.Fields("the a mesh node model answer request peer 12 345 6789 it's we're don't , . ! ? ; : ( ) [ ] { } \" ' - _ / \\ é ü ñ 中 文 😀 \n \t  ")
	out := slices.Clone(base)
	for len(out) < 300 {
		n := 1 + r.IntN(12)
		var b strings.Builder
		for range n {
			w := words[r.IntN(len(words))]
			if r.IntN(3) > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(w)
		}
		out = append(out, b.String())
	}
	for range 20 {
		bs := make([]rune, 1+r.IntN(10))
		for i := range bs {
			bs[i] = rune(32 + r.IntN(0x2fff))
		}
		out = append(out, string(bs))
	}
	return out
}

// TestTokenizerParity: the tokenizer built from the GGUF metadata encodes
// every string as llama.cpp's llama_tokenize does (no BOS, control tokens
// parsed), and decodes each token to llama_token_to_piece's bytes.
func TestTokenizerParity(t *testing.T) {
	path := filepath.Join(llamatest.TinyDir(t), "model.gguf")
	f, err := gguf.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tok, info, err := f.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	m, err := llamatest.Lib(t).LoadModel(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	if tok.VocabSize() != m.VocabSize() {
		t.Fatalf("vocab %d, llama.cpp %d", tok.VocabSize(), m.VocabSize())
	}
	strs := parityStrings()
	for _, s := range strs {
		ours, err := tok.EncodeContent(s)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		theirs, err := m.Tokenize(s, false, true)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(ours) != fmt.Sprint(theirs) {
			t.Errorf("%q:\n ours   %v\n llama  %v", s, ours, theirs)
		}
	}
	for id := range tok.VocabSize() {
		if tok.IsSpecial(int64(id)) {
			continue
		}
		if got, want := tok.TokenBytes(int64(id)), m.Piece(int32(id), false); string(got) != string(want) {
			t.Errorf("token %d: bytes %q, llama.cpp %q", id, got, want)
		}
	}
	if info.EOS != "<|im_end|>" || len(info.EndIDs) == 0 || info.ChatTemplate == "" {
		t.Errorf("info %+v", info)
	}
	t.Logf("%d strings identical", len(strs))
}

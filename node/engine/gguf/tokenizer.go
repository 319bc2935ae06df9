package gguf

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/infermesh/infermesh/node/engine/tokenizer"
)

// Token types of tokenizer.ggml.token_type that become added tokens.
const (
	tokenControl     = 3
	tokenUserDefined = 4
	tokenUnused      = 5
)

// Pre-tokenizer patterns of the byte-level BPE vocabularies, by
// tokenizer.ggml.pre (the same expressions the models' tokenizer.json
// files give their Split pre-tokenizers).
const (
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// TokenizerInfo is what a chat model needs from the tokenizer metadata
// besides the tokenizer itself.
type TokenizerInfo struct {
	// ChatTemplate is tokenizer.chat_template ("" if absent).
	ChatTemplate string
	// BOS and EOS are the texts of the BOS and EOS tokens ("" if unset).
	BOS, EOS string
	// EndIDs are the ids that end generation: EOS, EOT and, for ChatML
	// vocabularies, <|im_end|> and <|endoftext|>.
	EndIDs []int64
	// AddBOS is tokenizer.ggml.add_bos_token.
	AddBOS bool
	// BOSID is the BOS token id (-1: none).
	BOSID int64
}

// Tokenizer builds the project's tokenizer from a GGUF file's
// tokenizer.ggml.* metadata: the vocabulary, merges and pre-tokenizer of a
// byte-level BPE model ("gpt2") become the tokenizer.json Hugging Face
// would write for it, control and user-defined tokens its added tokens.
// SentencePiece ("llama"), WordPiece ("bert") and other models are
// refused by name, as are pre-tokenizers it does not know.
func (f *File) Tokenizer() (*tokenizer.Tokenizer, TokenizerInfo, error) {
	var info TokenizerInfo
	model := f.String("tokenizer.ggml.model")
	if model != "gpt2" {
		return nil, info, fmt.Errorf("gguf: tokenizer.ggml.model %q is not supported (only byte-level BPE, \"gpt2\")", model)
	}
	toks, ok := f.KV["tokenizer.ggml.tokens"]
	if !ok || toks.Type != TypeArray || toks.Elem != TypeString || len(toks.Strs) == 0 {
		return nil, info, fmt.Errorf("gguf: tokenizer.ggml.tokens is missing")
	}
	tokens := toks.Strs
	var types []int64
	if tt, ok := f.KV["tokenizer.ggml.token_type"]; ok {
		if tt.Type != TypeArray || len(tt.Ints) != len(tokens) {
			return nil, info, fmt.Errorf("gguf: tokenizer.ggml.token_type has %d entries for %d tokens", len(tt.Ints), len(tokens))
		}
		types = tt.Ints
	}
	mv, ok := f.KV["tokenizer.ggml.merges"]
	if !ok || mv.Type != TypeArray || mv.Elem != TypeString {
		return nil, info, fmt.Errorf("gguf: tokenizer.ggml.merges is missing")
	}
	pre, norm, err := preTokenizer(f.String("tokenizer.ggml.pre"))
	if err != nil {
		return nil, info, err
	}
	vocab := make(map[string]int64, len(tokens))
	var added []map[string]any
	for i, t := range tokens {
		if _, dup := vocab[t]; dup {
			return nil, info, fmt.Errorf("gguf: token %q appears twice in tokenizer.ggml.tokens", t)
		}
		vocab[t] = int64(i)
		// Control tokens are special (skipped when decoding); so are
		// unused ones, which llama.cpp renders as nothing. (An unused
		// token's text written in a prompt is matched as that token here,
		// where llama.cpp would spell it out: no real prompt does that.)
		if types != nil && (types[i] == tokenControl || types[i] == tokenUserDefined || types[i] == tokenUnused) {
			added = append(added, map[string]any{"id": i, "content": t, "single_word": false, "lstrip": false,
				"rstrip": false, "normalized": false, "special": types[i] != tokenUserDefined})
		}
	}
	merges := make([][2]string, 0, len(mv.Strs))
	for i, m := range mv.Strs {
		// Tokens never start with a space in a byte-level vocabulary; the
		// separator is the first space after the first byte.
		sp := strings.IndexByte(m[min(1, len(m)):], ' ')
		if sp < 0 {
			return nil, info, fmt.Errorf("gguf: merge %d %q has no separator", i, m)
		}
		sp++
		if len(m) == 0 {
			return nil, info, fmt.Errorf("gguf: merge %d is empty", i)
		}
		merges = append(merges, [2]string{m[:sp], m[sp+1:]})
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
	js := map[string]any{
		"version":        "1.0",
		"added_tokens":   added,
		"normalizer":     norm,
		"pre_tokenizer":  pre,
		"post_processor": byteLevel,
		"decoder":        byteLevel,
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": merges, "byte_fallback": false,
			"fuse_unk": false, "ignore_merges": false, "continuing_subword_prefix": "", "end_of_word_suffix": ""},
	}
	data, err := json.Marshal(js)
	if err != nil {
		return nil, info, err
	}
	tok, err := tokenizer.Parse(data)
	if err != nil {
		return nil, info, fmt.Errorf("gguf: tokenizer: %w", err)
	}
	info.ChatTemplate = f.String("tokenizer.chat_template")
	info.BOSID = -1
	if id, ok := f.tokenID("tokenizer.ggml.bos_token_id", len(tokens)); ok {
		info.BOS, info.BOSID = tokens[id], id
	}
	if v, ok := f.Int("tokenizer.ggml.add_bos_token"); ok {
		info.AddBOS = v != 0
	}
	addEnd := func(id int64) {
		for _, e := range info.EndIDs {
			if e == id {
				return
			}
		}
		info.EndIDs = append(info.EndIDs, id)
	}
	if id, ok := f.tokenID("tokenizer.ggml.eos_token_id", len(tokens)); ok {
		info.EOS = tokens[id]
		addEnd(id)
	}
	if id, ok := f.tokenID("tokenizer.ggml.eot_token_id", len(tokens)); ok {
		addEnd(id)
	}
	for _, s := range []string{"<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>"} {
		if id, ok := vocab[s]; ok && types != nil && types[id] == tokenControl {
			addEnd(id)
		}
	}
	return tok, info, nil
}

// tokenID reads a token id key and checks it against the vocabulary.
func (f *File) tokenID(key string, n int) (int64, bool) {
	id, ok := f.Int(key)
	return id, ok && id >= 0 && id < int64(n)
}

// preTokenizer maps tokenizer.ggml.pre to the pre-tokenizer (and
// normalizer) of the model's tokenizer.json.
func preTokenizer(pre string) (p, norm any, err error) {
	split := func(pattern string) map[string]any {
		return map[string]any{"type": "Split", "pattern": map[string]any{"Regex": pattern}, "behavior": "Isolated", "invert": false}
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
	seq := func(ps ...any) map[string]any { return map[string]any{"type": "Sequence", "pretokenizers": ps} }
	switch pre {
	case "qwen2", "deepseek-r1-qwen":
		return seq(split(patternQwen2), byteLevel), map[string]any{"type": "NFC"}, nil
	case "llama-bpe", "llama3", "llama-v3", "smaug-bpe":
		return seq(split(patternLlama3), byteLevel), nil, nil
	case "smollm":
		return seq(map[string]any{"type": "Digits", "individual_digits": true},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}), nil, nil
	case "gpt2", "default", "":
		return map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}, nil, nil
	}
	return nil, nil, fmt.Errorf("gguf: tokenizer.ggml.pre %q is not supported (qwen2, llama-bpe, smollm, gpt2)", pre)
}

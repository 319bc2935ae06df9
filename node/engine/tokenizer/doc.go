// Package tokenizer turns text into model token ids the way Hugging Face
// `tokenizers` does, reading the same tokenizer.json a model ships with.
//
// A Tokenizer is a pipeline of parts, each chosen by the file:
//
//	added tokens   special and added tokens are cut out of the raw text first
//	               (those marked "normalized" are cut from the normalised text)
//	Normalizer     rewrites the remaining text (BertNormalizer; NFC/NFD/NFKC/
//	               NFKD; Lowercase; StripAccents; Prepend; Replace; Strip;
//	               Precompiled, SentencePiece's compiled charsmap; Sequence)
//	PreTokenizer   splits it into words (BertPreTokenizer; WhitespaceSplit;
//	               Whitespace; Split on a regular expression with look-ahead,
//	               run by regexp2, or a literal; Digits; ByteLevel, which maps
//	               bytes to GPT-2's printable stand-ins; Metaspace, "▁" for
//	               spaces with prepend_scheme always/first/never; Sequence)
//	Model          maps each word to vocabulary ids (WordPiece: greedy longest
//	               match with "##"; BPE: lowest-rank merge first, O(n log n),
//	               merges as "a b" or ["a", "b"], unk / fuse_unk /
//	               byte_fallback / ignore_merges, a bounded word cache;
//	               Unigram: Viterbi over scored pieces, fused unknowns,
//	               byte_fallback)
//	truncation     keeps at most max tokens, counting the special tokens
//	PostProcessor  adds the special tokens ([CLS] A [SEP]) and type ids
//	Decoder        turns ids back into text (ByteLevel, WordPiece with
//	               Hugging Face's cleanup: per token, its replacements in
//	               their fixed order; Replace,
//	               ByteFallback, Fuse, Strip, Metaspace and Sequences of
//	               them); with a per-token decoder, DecodeStream decodes
//	               incrementally and never emits half a UTF-8 character.
//	               Invalid UTF-8 becomes one U+FFFD per maximal invalid
//	               subpart, as Python's errors="replace" does (LossyUTF8)
//
// This covers the layouts of byte-level BPE (GPT-2, Qwen, Llama 3),
// WordPiece (BERT), SentencePiece BPE (Llama-2, Mistral, Gemma) and Unigram
// (XLM-R, T5) files. Encode applies the post-processor; EncodeContent does
// not (chat prompts carry their special tokens in the text). Anything else
// is reported by name at load;
// a new part plugs in by implementing Normalizer, PreTokenizer, Model or
// Decoder and adding a case to the matching builder in config.go.
//
// Work is bounded: a tokenizer.json larger than MaxFileBytes, an id outside
// [0, MaxVocabSize) and a text longer than MaxInputBytes are rejected, and a
// right-truncated encoding stops reading words once it has enough tokens.
// A Tokenizer is immutable after Load and safe for concurrent use.
package tokenizer

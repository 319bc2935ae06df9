// Package tokenizer turns text into model token ids the way Hugging Face
// `tokenizers` does, reading the same tokenizer.json a model ships with.
//
// A Tokenizer is a pipeline of parts, each chosen by the file:
//
//	added tokens   special and added tokens are cut out of the raw text first
//	               (those marked "normalized" are cut from the normalised text)
//	Normalizer     rewrites the remaining text (BertNormalizer: clean control
//	               characters, space out CJK ideographs, strip accents, lowercase)
//	PreTokenizer   splits it into words (BertPreTokenizer: whitespace, then
//	               punctuation as words of their own)
//	Model          maps each word to vocabulary ids (WordPiece: greedy longest
//	               match with the "##" continuing prefix, unk for unknown words)
//	truncation     keeps at most max tokens, counting the special tokens
//	PostProcessor  adds the special tokens ([CLS] A [SEP]) and type ids
//
// Only the parts BERT-family encoders need are implemented today; Load
// reports an unsupported part (a byte-level BPE model, say) by name, and a
// new part plugs in by implementing Normalizer, PreTokenizer or Model and
// adding a case to the matching builder in config.go.
//
// Work is bounded: a tokenizer.json larger than MaxFileBytes, an id outside
// [0, MaxVocabSize) and a text longer than MaxInputBytes are rejected, and a
// right-truncated encoding stops reading words once it has enough tokens.
// A Tokenizer is immutable after Load and safe for concurrent use.
package tokenizer

package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"golang.org/x/text/unicode/norm"
)

// file is the part of tokenizer.json this package reads; padding is
// ignored (callers pad batches themselves).
type file struct {
	Truncation *struct {
		Direction string `json:"direction"`
		MaxLength int    `json:"max_length"`
	} `json:"truncation"`
	AddedTokens   []AddedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         json.RawMessage `json:"model"`
	Decoder       json.RawMessage `json:"decoder"`
}

// Load reads a Hugging Face tokenizer.json.
func Load(path string) (*Tokenizer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: read %s: %w", path, err)
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("tokenizer: %s is larger than %d bytes", path, MaxFileBytes)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return t, nil
}

// Parse builds a Tokenizer from the contents of a tokenizer.json.
func Parse(data []byte) (*Tokenizer, error) {
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("tokenizer: file is larger than %d bytes", MaxFileBytes)
	}
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer: parse tokenizer.json: %w", err)
	}
	t := &Tokenizer{added: map[string]int64{}, special: map[int64]struct{}{}}
	var err error
	if t.model, err = buildModel(f.Model); err != nil {
		return nil, err
	}
	if t.normalizer, err = buildNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if t.pre, err = buildPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if t.post, err = buildPostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	t.decoder, t.decoderUnsupported = buildDecoder(f.Decoder)
	if tr := f.Truncation; tr != nil {
		if tr.MaxLength <= 0 {
			return nil, fmt.Errorf("tokenizer: truncation max_length %d must be positive", tr.MaxLength)
		}
		switch tr.Direction {
		case "", "Right", "Left":
		default:
			return nil, fmt.Errorf("tokenizer: unknown truncation direction %q", tr.Direction)
		}
		t.truncation = &truncationSpec{MaxLength: tr.MaxLength, Left: tr.Direction == "Left"}
	}
	size := int64(0)
	grow := func(id int64) {
		size = max(size, id+1)
	}
	for tok, id := range t.model.Tokens() {
		if err := checkID(id, tok); err != nil {
			return nil, err
		}
		grow(id)
	}
	for i := range f.AddedTokens {
		at := &f.AddedTokens[i]
		if err := checkID(at.ID, at.Content); err != nil {
			return nil, err
		}
		if at.Content == "" {
			return nil, fmt.Errorf("tokenizer: added token %d is empty", at.ID)
		}
		grow(at.ID)
		t.added[at.Content] = at.ID
		if at.Special {
			t.special[at.ID] = struct{}{}
		}
		if at.Normalized && t.normalizer != nil {
			t.normalized.add(t.normalizer.Normalize(at.Content), at)
		} else if at.Normalized {
			t.normalized.add(at.Content, at)
		} else {
			t.raw.add(at.Content, at)
		}
	}
	if tp, ok := t.post.(Template); ok {
		for _, p := range tp.Pieces {
			for _, id := range p.Special {
				if err := checkID(id, "special token"); err != nil {
					return nil, err
				}
				grow(id)
			}
		}
	}
	t.idToToken = make([]string, size)
	for tok, id := range t.model.Tokens() {
		t.idToToken[id] = tok
	}
	for _, at := range f.AddedTokens {
		t.idToToken[at.ID] = at.Content
	}
	return t, nil
}

func checkID(id int64, what string) error {
	if id < 0 || id >= MaxVocabSize {
		return fmt.Errorf("tokenizer: id %d of %q is outside [0, %d)", id, what, MaxVocabSize)
	}
	return nil
}

// isNull reports an absent or JSON null component.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// typeOf reads a component's "type" field.
func typeOf(raw json.RawMessage) (string, error) {
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return "", err
	}
	return head.Type, nil
}

func buildNormalizer(raw json.RawMessage) (Normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := typeOf(raw)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: normalizer: %w", err)
	}
	if n, ok, err := buildPieceNormalizer(typ, raw); ok {
		return n, err
	}
	switch typ {
	case "BertNormalizer":
		// Hugging Face's defaults for absent fields.
		c := struct {
			CleanText          bool  `json:"clean_text"`
			HandleChineseChars bool  `json:"handle_chinese_chars"`
			StripAccents       *bool `json:"strip_accents"`
			Lowercase          bool  `json:"lowercase"`
		}{CleanText: true, HandleChineseChars: true, Lowercase: true}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: BertNormalizer: %w", err)
		}
		strip := c.Lowercase // unset strip_accents follows lowercase
		if c.StripAccents != nil {
			strip = *c.StripAccents
		}
		return BertNormalizer{CleanText: c.CleanText, HandleChineseChars: c.HandleChineseChars, StripAccents: strip, Lowercase: c.Lowercase}, nil
	case "Lowercase":
		return Lowercase{}, nil
	case "StripAccents":
		return StripAccents{}, nil
	case "NFC":
		return UnicodeForm{Form: norm.NFC}, nil
	case "NFD":
		return UnicodeForm{Form: norm.NFD}, nil
	case "NFKC":
		return UnicodeForm{Form: norm.NFKC}, nil
	case "NFKD":
		return UnicodeForm{Form: norm.NFKD}, nil
	case "Sequence":
		var c struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: normalizer Sequence: %w", err)
		}
		seq := make(NormalizerSequence, 0, len(c.Normalizers))
		for _, sub := range c.Normalizers {
			n, err := buildNormalizer(sub)
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("tokenizer: unsupported normalizer type %q (supported: BertNormalizer, Lowercase, StripAccents, NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Precompiled, Sequence)", typ)
}

func buildPreTokenizer(raw json.RawMessage) (PreTokenizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := typeOf(raw)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: pre_tokenizer: %w", err)
	}
	switch typ {
	case "BertPreTokenizer":
		return BertPreTokenizer{}, nil
	case "WhitespaceSplit":
		return WhitespaceSplit{}, nil
	case "Metaspace":
		return buildMetaspace(raw)
	case "Whitespace":
		return NewSplit(whitespacePattern, true, SplitRemoved, true)
	case "ByteLevel":
		c := struct {
			AddPrefixSpace *bool `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}{}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: ByteLevel: %w", err)
		}
		return NewByteLevel(c.AddPrefixSpace == nil || *c.AddPrefixSpace, c.UseRegex == nil || *c.UseRegex)
	case "Digits":
		var c struct {
			IndividualDigits bool `json:"individual_digits"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: Digits: %w", err)
		}
		return Digits{IndividualDigits: c.IndividualDigits}, nil
	case "Split":
		var c struct {
			Pattern struct {
				Regex  *string `json:"Regex"`
				String *string `json:"String"`
			} `json:"pattern"`
			Behavior string `json:"behavior"`
			Invert   bool   `json:"invert"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: Split: %w", err)
		}
		behavior, err := parseSplitBehavior(c.Behavior)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: Split: %w", err)
		}
		switch {
		case c.Pattern.Regex != nil:
			return NewSplit(*c.Pattern.Regex, true, behavior, c.Invert)
		case c.Pattern.String != nil:
			return NewSplit(*c.Pattern.String, false, behavior, c.Invert)
		}
		return nil, fmt.Errorf("tokenizer: Split needs a Regex or String pattern")
	case "Sequence":
		var c struct {
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: pre_tokenizer Sequence: %w", err)
		}
		seq := make(PreTokenizerSequence, 0, len(c.PreTokenizers))
		for _, sub := range c.PreTokenizers {
			p, err := buildPreTokenizer(sub)
			if err != nil {
				return nil, err
			}
			if p != nil {
				seq = append(seq, p)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("tokenizer: unsupported pre_tokenizer type %q (supported: BertPreTokenizer, WhitespaceSplit, Whitespace, Metaspace, ByteLevel, Digits, Split, Sequence)", typ)
}

func buildModel(raw json.RawMessage) (Model, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("tokenizer: tokenizer.json has no model")
	}
	var c struct {
		Type                    string           `json:"type"`
		UnkToken                *string          `json:"unk_token"`
		ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
		MaxInputCharsPerWord    *int             `json:"max_input_chars_per_word"`
		Vocab                   json.RawMessage  `json:"vocab"`
		Merges                  *json.RawMessage `json:"merges"`
		EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
		FuseUnk                 bool             `json:"fuse_unk"`
		ByteFallback            bool             `json:"byte_fallback"`
		IgnoreMerges            bool             `json:"ignore_merges"`
		Dropout                 *float64         `json:"dropout"`
		UnkID                   *int64           `json:"unk_id"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("tokenizer: model: %w", err)
	}
	typ := c.Type
	if typ == "" { // old files leave the type out; Hugging Face infers it from the fields
		switch {
		case c.Merges != nil:
			typ = "BPE"
		case c.MaxInputCharsPerWord != nil || c.ContinuingSubwordPrefix != nil:
			typ = "WordPiece"
		}
	}
	if typ == "BPE" {
		return buildBPE(c.Vocab, c.Merges, c.UnkToken, c.ContinuingSubwordPrefix, c.EndOfWordSuffix, c.FuseUnk, c.ByteFallback, c.IgnoreMerges, c.Dropout)
	}
	if typ == "Unigram" {
		return buildUnigram(c.Vocab, c.UnkID, c.ByteFallback)
	}
	if typ != "WordPiece" {
		if typ == "" {
			typ = "(none)"
		}
		return nil, fmt.Errorf("tokenizer: unsupported model type %q (supported: WordPiece, BPE, Unigram)", typ)
	}
	var vocab map[string]int64
	if err := json.Unmarshal(c.Vocab, &vocab); err != nil {
		return nil, fmt.Errorf("tokenizer: WordPiece vocab: %w", err)
	}
	unk, prefix, maxChars := "[UNK]", "##", WordPieceDefaultMaxInputCharsPerWord
	if c.UnkToken != nil {
		unk = *c.UnkToken
	}
	if c.ContinuingSubwordPrefix != nil {
		prefix = *c.ContinuingSubwordPrefix
	}
	if c.MaxInputCharsPerWord != nil {
		maxChars = *c.MaxInputCharsPerWord
	}
	m, err := NewWordPiece(vocab, unk, prefix, maxChars)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return m, nil
}

func buildPostProcessor(raw json.RawMessage) (PostProcessor, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ, err := typeOf(raw)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: post_processor: %w", err)
	}
	switch typ {
	case "ByteLevel":
		return nil, nil // it only adjusts offsets, which are not computed here
	case "Sequence":
		var c struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: post_processor Sequence: %w", err)
		}
		var found PostProcessor
		for _, sub := range c.Processors {
			p, err := buildPostProcessor(sub)
			if err != nil {
				return nil, err
			}
			if p != nil && found != nil {
				return nil, fmt.Errorf("tokenizer: post_processor Sequence adds special tokens twice")
			}
			if p != nil {
				found = p
			}
		}
		return found, nil
	case "TemplateProcessing":
		return buildTemplate(raw)
	case "BertProcessing", "RobertaProcessing":
		// Both lay a single sequence out as cls $A sep with type id 0.
		var c struct {
			Sep []json.RawMessage `json:"sep"`
			Cls []json.RawMessage `json:"cls"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("tokenizer: %s: %w", typ, err)
		}
		cls, err := tokenPair(c.Cls)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %s cls: %w", typ, err)
		}
		sep, err := tokenPair(c.Sep)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %s sep: %w", typ, err)
		}
		return Template{Pieces: []TemplatePiece{{Special: []int64{cls}}, {}, {Special: []int64{sep}}}}, nil
	}
	return nil, fmt.Errorf("tokenizer: unsupported post_processor type %q (supported: TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence)", typ)
}

// tokenPair reads a serialized ("[CLS]", 101) pair and returns the id.
func tokenPair(pair []json.RawMessage) (int64, error) {
	if len(pair) != 2 {
		return 0, fmt.Errorf("want [token, id], got %d elements", len(pair))
	}
	var id int64
	if err := json.Unmarshal(pair[1], &id); err != nil {
		return 0, err
	}
	return id, nil
}

func buildTemplate(raw json.RawMessage) (PostProcessor, error) {
	type piece struct {
		ID     string `json:"id"`
		TypeID int64  `json:"type_id"`
	}
	var c struct {
		Single []struct {
			SpecialToken *piece `json:"SpecialToken"`
			Sequence     *piece `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int64 `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("tokenizer: TemplateProcessing (the single template must be the serialized list form): %w", err)
	}
	var tp Template
	seqs := 0
	for _, p := range c.Single {
		switch {
		case p.Sequence != nil:
			if p.Sequence.ID != "A" {
				return nil, fmt.Errorf("tokenizer: TemplateProcessing single template uses sequence %q, want A", p.Sequence.ID)
			}
			seqs++
			tp.Pieces = append(tp.Pieces, TemplatePiece{TypeID: p.Sequence.TypeID})
		case p.SpecialToken != nil:
			st, ok := c.SpecialTokens[p.SpecialToken.ID]
			if !ok || len(st.IDs) == 0 {
				return nil, fmt.Errorf("tokenizer: TemplateProcessing special token %q has no ids", p.SpecialToken.ID)
			}
			tp.Pieces = append(tp.Pieces, TemplatePiece{Special: st.IDs, TypeID: p.SpecialToken.TypeID})
		default:
			return nil, fmt.Errorf("tokenizer: TemplateProcessing has an empty template piece")
		}
	}
	if seqs != 1 {
		return nil, fmt.Errorf("tokenizer: TemplateProcessing single template has %d sequences, want 1", seqs)
	}
	return tp, nil
}

// buildBPE reads a BPE model section.
func buildBPE(vocabRaw json.RawMessage, mergesRaw *json.RawMessage, unk, prefix, suffix *string, fuseUnk, byteFallback, ignoreMerges bool, dropout *float64) (Model, error) {
	if dropout != nil && *dropout > 0 {
		return nil, fmt.Errorf("tokenizer: BPE dropout %v is not supported (it makes encoding random)", *dropout)
	}
	c := BPEConfig{FuseUnk: fuseUnk, ByteFallback: byteFallback, IgnoreMerges: ignoreMerges}
	if err := json.Unmarshal(vocabRaw, &c.Vocab); err != nil {
		return nil, fmt.Errorf("tokenizer: BPE vocab: %w", err)
	}
	if mergesRaw != nil {
		var err error
		if c.Merges, err = parseMerges(*mergesRaw); err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
	}
	if unk != nil {
		c.UnkToken = *unk
	}
	if prefix != nil {
		c.ContinuingSubwordPrefix = *prefix
	}
	if suffix != nil {
		c.EndOfWordSuffix = *suffix
	}
	m, err := NewBPE(c)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return m, nil
}

// buildDecoder reads the decoder section. An unsupported decoder does not
// stop the load (encoders never decode); it is reported by name instead, and
// Decode then concatenates token strings.
func buildDecoder(raw json.RawMessage) (Decoder, string) {
	if isNull(raw) {
		return nil, ""
	}
	typ, err := typeOf(raw)
	if err != nil {
		return nil, "(unreadable)"
	}
	switch typ {
	case "ByteLevel":
		return NewByteLevelDecoder(), ""
	case "WordPiece":
		c := struct {
			Prefix  *string `json:"prefix"`
			Cleanup *bool   `json:"cleanup"`
		}{}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, "WordPiece"
		}
		d := WordPieceDecoder{Prefix: "##", Cleanup: true}
		if c.Prefix != nil {
			d.Prefix = *c.Prefix
		}
		if c.Cleanup != nil {
			d.Cleanup = *c.Cleanup
		}
		return d, ""
	case "Sequence":
		var c struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, "Sequence"
		}
		if len(c.Decoders) == 1 {
			return buildDecoder(c.Decoders[0])
		}
		return buildPieceDecoder(c.Decoders, "Sequence")
	case "Replace", "ByteFallback", "Fuse", "Strip", "Metaspace":
		return buildPieceDecoder([]json.RawMessage{raw}, typ)
	}
	return nil, typ
}

// buildPieceDecoder builds a PieceDecoder from SentencePiece-style
// decoders, or reports name as unsupported.
func buildPieceDecoder(raws []json.RawMessage, name string) (Decoder, string) {
	steps, ok := pieceSteps(raws)
	if !ok {
		return nil, name
	}
	d, err := NewPieceDecoder(steps...)
	if err != nil {
		return nil, name
	}
	return d, ""
}

package tokenizer

import (
	"encoding/json"
	"fmt"
)

// patternSpec is a serialized Replace/Split pattern: {"String": s} or
// {"Regex": r}.
type patternSpec struct {
	Regex  *string `json:"Regex"`
	String *string `json:"String"`
}

// buildPieceNormalizer reads the SentencePiece-era normalizers (Prepend,
// Replace, Strip, Precompiled); ok is false for other types.
func buildPieceNormalizer(typ string, raw json.RawMessage) (n Normalizer, ok bool, err error) {
	switch typ {
	case "Prepend":
		var c struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, true, fmt.Errorf("tokenizer: Prepend: %w", err)
		}
		return Prepend{Prefix: c.Prepend}, true, nil
	case "Replace":
		var c struct {
			Pattern patternSpec `json:"pattern"`
			Content string      `json:"content"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, true, fmt.Errorf("tokenizer: Replace: %w", err)
		}
		var r *Replace
		switch {
		case c.Pattern.Regex != nil:
			r, err = NewReplace(*c.Pattern.Regex, true, c.Content)
		case c.Pattern.String != nil:
			r, err = NewReplace(*c.Pattern.String, false, c.Content)
		default:
			err = fmt.Errorf("needs a Regex or String pattern")
		}
		if err != nil {
			return nil, true, fmt.Errorf("tokenizer: Replace normalizer: %w", err)
		}
		return r, true, nil
	case "Strip":
		var c struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, true, fmt.Errorf("tokenizer: Strip: %w", err)
		}
		return StripNormalizer{Left: c.Left, Right: c.Right}, true, nil
	case "Precompiled":
		var c struct {
			Charsmap []byte `json:"precompiled_charsmap"` // base64
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, true, fmt.Errorf("tokenizer: Precompiled: %w", err)
		}
		p, err := NewPrecompiled(c.Charsmap)
		if err != nil {
			return nil, true, fmt.Errorf("tokenizer: %w", err)
		}
		return p, true, nil
	}
	return nil, false, nil
}

// buildMetaspace reads a Metaspace pre-tokenizer.
func buildMetaspace(raw json.RawMessage) (*Metaspace, error) {
	c, err := readMetaspace(raw)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: Metaspace: %w", err)
	}
	return NewMetaspace(c.replacement, c.scheme, c.split)
}

type metaspaceSpec struct {
	replacement string
	scheme      PrependScheme
	split       bool
}

// readMetaspace reads the fields a Metaspace pre-tokenizer and decoder
// share, with Hugging Face's defaults.
func readMetaspace(raw json.RawMessage) (metaspaceSpec, error) {
	c := struct {
		Replacement    string  `json:"replacement"`
		PrependScheme  *string `json:"prepend_scheme"`
		AddPrefixSpace *bool   `json:"add_prefix_space"`
		Split          *bool   `json:"split"`
	}{Replacement: "▁"}
	if err := json.Unmarshal(raw, &c); err != nil {
		return metaspaceSpec{}, err
	}
	scheme, err := parsePrependScheme(c.PrependScheme, c.AddPrefixSpace)
	if err != nil {
		return metaspaceSpec{}, err
	}
	if len([]rune(c.Replacement)) != 1 {
		return metaspaceSpec{}, fmt.Errorf("replacement %q must be one character", c.Replacement)
	}
	return metaspaceSpec{replacement: c.Replacement, scheme: scheme, split: c.Split == nil || *c.Split}, nil
}

// pieceSteps reads decoders that are PieceDecoder steps; ok is false when
// one of them is of another kind.
func pieceSteps(raws []json.RawMessage) ([]PieceStep, bool) {
	steps := make([]PieceStep, 0, len(raws))
	for _, raw := range raws {
		typ, err := typeOf(raw)
		if err != nil {
			return nil, false
		}
		switch typ {
		case "Replace":
			var c struct {
				Pattern patternSpec `json:"pattern"`
				Content string      `json:"content"`
			}
			if err := json.Unmarshal(raw, &c); err != nil || c.Pattern.String == nil {
				return nil, false // a regex Replace decoder is not supported
			}
			steps = append(steps, ReplaceStep(*c.Pattern.String, c.Content))
		case "ByteFallback":
			steps = append(steps, ByteFallbackStep())
		case "Fuse":
			steps = append(steps, FuseStep())
		case "Strip":
			var c struct {
				Content string `json:"content"`
				Start   int    `json:"start"`
				Stop    int    `json:"stop"`
			}
			if err := json.Unmarshal(raw, &c); err != nil || c.Start < 0 || c.Stop < 0 {
				return nil, false
			}
			steps = append(steps, StripStep(c.Content, c.Start, c.Stop))
		case "Metaspace":
			c, err := readMetaspace(raw)
			if err != nil {
				return nil, false
			}
			steps = append(steps, MetaspaceStep(c.replacement, c.scheme))
		default:
			return nil, false
		}
	}
	return steps, true
}

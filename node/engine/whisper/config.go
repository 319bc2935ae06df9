package whisper

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/infermesh/infermesh/node/engine/tokenizer"
)

// Whisper's fixed audio front end (openai/whisper audio.py).
const (
	sampleRate   = 16000
	nFFT         = 400
	hopLength    = 160
	chunkSeconds = 30
	nSamples     = chunkSeconds * sampleRate // samples in one window
	nFrames      = nSamples / hopLength      // mel frames in one window (3000)
	// secondsPerTimestamp is the step of the timestamp tokens (two mel
	// frames per encoder position).
	secondsPerTimestamp = 0.02
	framesPerTimestamp  = 2
)

// modelConfig is what the pipeline needs from config.json,
// generation_config.json and the tokenizer.
type modelConfig struct {
	nMels        int // num_mel_bins: 80, or 128 for large-v3
	layers       int // decoder_layers
	heads        int // decoder_attention_heads
	dModel       int // d_model
	headDim      int // d_model / heads
	vocab        int // vocab_size (rows of logits)
	encPos       int // max_source_positions (1500)
	maxTarget    int // max_target_positions (448)
	multilingual bool

	sot, eot, noTimestamps, timestampBegin int
	sotPrev, noSpeech                      int // -1 when the vocabulary lacks them
	transcribe, translate                  int // -1 for English-only models
	langToID                               map[string]int
	suppress, beginSuppress                []int
	alignmentHeads                         [][2]int // [layer, head]
}

// rawConfig is the subset of config.json read.
type rawConfig struct {
	NumMelBins            int   `json:"num_mel_bins"`
	DecoderLayers         int   `json:"decoder_layers"`
	DecoderAttentionHeads int   `json:"decoder_attention_heads"`
	DModel                int   `json:"d_model"`
	VocabSize             int   `json:"vocab_size"`
	MaxSourcePositions    int   `json:"max_source_positions"`
	MaxTargetPositions    int   `json:"max_target_positions"`
	DecoderStartTokenID   int   `json:"decoder_start_token_id"`
	EOSTokenID            int   `json:"eos_token_id"`
	SuppressTokens        []int `json:"suppress_tokens"`
	BeginSuppressTokens   []int `json:"begin_suppress_tokens"`
}

// rawGeneration is the subset of generation_config.json read.
type rawGeneration struct {
	DecoderStartTokenID *int           `json:"decoder_start_token_id"`
	EOSTokenID          *int           `json:"eos_token_id"`
	NoTimestampsTokenID *int           `json:"no_timestamps_token_id"`
	IsMultilingual      *bool          `json:"is_multilingual"`
	LangToID            map[string]int `json:"lang_to_id"`
	TaskToID            map[string]int `json:"task_to_id"`
	SuppressTokens      []int          `json:"suppress_tokens"`
	BeginSuppressTokens []int          `json:"begin_suppress_tokens"`
	AlignmentHeads      [][2]int       `json:"alignment_heads"`
}

// readJSON decodes dir/name into v; name "" is an error naming role.
func readJSON(dir, name, role string, v any) error {
	if name == "" {
		return fmt.Errorf("spec names no %q file", role)
	}
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return fmt.Errorf("%s: %w", role, err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s %s: %w", role, name, err)
	}
	return nil
}

// loadConfig reads and checks the model's configuration. The token ids the
// decoding needs come from generation_config.json when it has them, else
// from config.json, and the named special tokens from the tokenizer.
func loadConfig(dir string, files map[string]string, tok *tokenizer.Tokenizer) (*modelConfig, error) {
	var rc rawConfig
	if err := readJSON(dir, files["config"], "config", &rc); err != nil {
		return nil, err
	}
	var rg rawGeneration
	if err := readJSON(dir, files["generation_config"], "generation_config", &rg); err != nil {
		return nil, err
	}
	c := &modelConfig{
		nMels:      rc.NumMelBins,
		layers:     rc.DecoderLayers,
		heads:      rc.DecoderAttentionHeads,
		dModel:     rc.DModel,
		vocab:      rc.VocabSize,
		encPos:     rc.MaxSourcePositions,
		maxTarget:  rc.MaxTargetPositions,
		sot:        rc.DecoderStartTokenID,
		eot:        rc.EOSTokenID,
		suppress:   rc.SuppressTokens,
		sotPrev:    -1,
		noSpeech:   -1,
		transcribe: -1,
		translate:  -1,
	}
	if c.encPos == 0 {
		c.encPos = nFrames / framesPerTimestamp
	}
	if c.maxTarget == 0 {
		c.maxTarget = 448
	}
	c.beginSuppress = rc.BeginSuppressTokens
	if rg.DecoderStartTokenID != nil {
		c.sot = *rg.DecoderStartTokenID
	}
	if rg.EOSTokenID != nil {
		c.eot = *rg.EOSTokenID
	}
	if rg.SuppressTokens != nil {
		c.suppress = rg.SuppressTokens
	}
	if rg.BeginSuppressTokens != nil {
		c.beginSuppress = rg.BeginSuppressTokens
	}
	switch {
	case c.nMels != 80 && c.nMels != 128:
		return nil, fmt.Errorf("config: num_mel_bins %d, want 80 or 128", c.nMels)
	case c.layers <= 0 || c.layers > 64:
		return nil, fmt.Errorf("config: decoder_layers %d out of range", c.layers)
	case c.heads <= 0 || c.dModel <= 0 || c.dModel%c.heads != 0:
		return nil, fmt.Errorf("config: d_model %d is not a multiple of %d heads", c.dModel, c.heads)
	case c.vocab < 51864 || c.vocab > 1<<20:
		return nil, fmt.Errorf("config: vocab_size %d is not a Whisper vocabulary", c.vocab)
	case c.encPos*framesPerTimestamp != nFrames:
		return nil, fmt.Errorf("config: max_source_positions %d, want %d", c.encPos, nFrames/framesPerTimestamp)
	case c.maxTarget < 64 || c.maxTarget > 4096:
		return nil, fmt.Errorf("config: max_target_positions %d out of range", c.maxTarget)
	}
	c.headDim = c.dModel / c.heads

	id := func(name string) int {
		if v, ok := tok.TokenToID(name); ok {
			return int(v)
		}
		return -1
	}
	if rg.NoTimestampsTokenID != nil {
		c.noTimestamps = *rg.NoTimestampsTokenID
	} else if c.noTimestamps = id("<|notimestamps|>"); c.noTimestamps < 0 {
		return nil, fmt.Errorf("generation_config: no no_timestamps_token_id and no <|notimestamps|> token")
	}
	c.timestampBegin = c.noTimestamps + 1
	if c.timestampBegin+1501 > c.vocab {
		return nil, fmt.Errorf("vocabulary of %d has no room for 1501 timestamp tokens after %d", c.vocab, c.timestampBegin)
	}
	c.sotPrev = id("<|startofprev|>")
	if c.noSpeech = id("<|nospeech|>"); c.noSpeech < 0 {
		c.noSpeech = id("<|nocaptions|>")
	}
	c.multilingual = len(rg.LangToID) > 0
	if rg.IsMultilingual != nil {
		c.multilingual = *rg.IsMultilingual && len(rg.LangToID) > 0
	}
	c.langToID = map[string]int{}
	if c.multilingual {
		for k, v := range rg.LangToID {
			code := strings.TrimSuffix(strings.TrimPrefix(k, "<|"), "|>")
			if code == "" || v < 0 || v >= c.vocab {
				return nil, fmt.Errorf("generation_config: bad lang_to_id entry %q: %d", k, v)
			}
			c.langToID[code] = v
		}
		var ok1, ok2 bool
		c.transcribe, ok1 = rg.TaskToID["transcribe"]
		c.translate, ok2 = rg.TaskToID["translate"]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("generation_config: task_to_id lacks transcribe or translate")
		}
	}
	for _, h := range rg.AlignmentHeads {
		if h[0] >= 0 && h[0] < c.layers && h[1] >= 0 && h[1] < c.heads {
			c.alignmentHeads = append(c.alignmentHeads, h)
		}
	}
	for _, t := range []int{c.sot, c.eot, c.noTimestamps} {
		if t <= 0 || t >= c.vocab {
			return nil, fmt.Errorf("special token id %d out of the vocabulary", t)
		}
	}
	return c, nil
}

// languages returns the accepted language codes, sorted.
func (c *modelConfig) languages() []string {
	if !c.multilingual {
		return []string{"en"}
	}
	out := make([]string, 0, len(c.langToID))
	for k := range c.langToID {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// alignmentLayers lists the decoder layers that hold alignment heads.
func (c *modelConfig) alignmentLayers() []int {
	seen := map[int]bool{}
	var out []int
	for _, h := range c.alignmentHeads {
		if !seen[h[0]] {
			seen[h[0]] = true
			out = append(out, h[0])
		}
	}
	sort.Ints(out)
	return out
}

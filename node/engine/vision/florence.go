package vision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
	"github.com/infermesh/infermesh/node/engine/tokenizer"
)

// Florence-2 (onnx-community export for transformers.js) signatures.
const (
	flPixels       = "pixel_values"   // f32[b,3,S,S], RGB, ImageNet mean/std
	flImage        = "image_features" // f32[b,N,D]
	flIDs          = "input_ids"      // i64[b,t]
	flEmbeds       = "inputs_embeds"  // f32[b,t,D]
	flMask         = "attention_mask" // i64[b,s]
	flHidden       = "last_hidden_state"
	flEncMask      = "encoder_attention_mask"
	flEncHidden    = "encoder_hidden_states"
	flBranch       = "use_cache_branch" // bool[1]
	flLogits       = "logits"
	flImageSize    = 768
	flMaxNewTokens = 1024
)

// florencePrompts maps a detail level to Florence-2's task token and the
// prompt its processor turns it into (processing_florence2.py).
var florencePrompts = map[string][2]string{
	engine.DetailCaption:  {"<CAPTION>", "What does the image describe?"},
	engine.DetailDetailed: {"<DETAILED_CAPTION>", "Describe in detail what is shown in the image."},
	engine.DetailMore:     {"<MORE_DETAILED_CAPTION>", "Describe with a paragraph what is shown in the image."},
}

// florence is the Florence-2 captioner: the DaViT vision encoder turns the
// image (stretched to S x S) into N feature tokens, which are put before the
// embedded task prompt; the BART encoder reads both, and the merged BART
// decoder generates the caption greedily with its KV cache (the encoder's
// cross-attention keys and values from the first step are reused).
type florence struct {
	id                     string
	tok                    *tokenizer.Tokenizer
	vision, embed, enc     *dynModel
	dec                    *dynModel
	size                   int
	layers, heads, headDim int
	start, eos, forcedBOS  int64
	noRepeat               int
	maxNew                 int
	done                   chan struct{}
	once                   sync.Once
	err                    error
}

// LoadFlorence loads a Florence-2 export. spec.Files: "vision_encoder",
// "embed_tokens", "encoder", "decoder" (decoder_model_merged.onnx),
// "tokenizer" (tokenizer.json) and optionally "generation_config"
// (decoder_start_token_id, eos_token_id, forced_bos_token_id,
// no_repeat_ngram_size). Options: image_size (768), max_new_tokens (1024),
// no_repeat_ngram_size (overrides the generation config; 0 turns it off),
// concurrency (1), thread_spinning (on; see spinning). The layer and head
// counts come from the decoder's
// inputs.
func LoadFlorence(rt *onnx.Runtime, spec engine.Spec) (engine.Describer, error) {
	if err := checkTask(spec, engine.TaskImageDescription); err != nil {
		return nil, err
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, err
	}
	f, nRuns, err := newFlorenceConfig(spec)
	if err != nil {
		return nil, fmt.Errorf("vision: %s: %w", spec.ID, err)
	}
	path := func(role string) string { return filepath.Join(spec.Dir, spec.Files[role]) }
	fail := func(err error) (engine.Describer, error) {
		f.Close()
		return nil, fmt.Errorf("vision: %s: %w", spec.ID, err)
	}
	spin, err := spinning(spec.Options, true)
	if err != nil {
		return fail(err)
	}
	s := int64(f.size)
	if f.vision, err = openDynModel(rt, spec.ID, path("vision_encoder"),
		[]ioSpec{f32(flPixels, -1, 3, s, s)}, []ioSpec{f32(flImage, -1, -1, -1)}, nRuns, spin); err != nil {
		return fail(fmt.Errorf("vision encoder: %w", err))
	}
	if f.embed, err = openDynModel(rt, spec.ID, path("embed_tokens"),
		[]ioSpec{i64(flIDs, -1, -1)}, []ioSpec{f32(flEmbeds, -1, -1, -1)}, nRuns, spin); err != nil {
		return fail(fmt.Errorf("embed tokens: %w", err))
	}
	if f.enc, err = openDynModel(rt, spec.ID, path("encoder"),
		[]ioSpec{f32(flEmbeds, -1, -1, -1), i64(flMask, -1, -1)}, []ioSpec{f32(flHidden, -1, -1, -1)}, nRuns, spin); err != nil {
		return fail(fmt.Errorf("encoder: %w", err))
	}
	ins, outs, err := f.decoderSignature(path("decoder"))
	if err != nil {
		return fail(fmt.Errorf("decoder: %w", err))
	}
	if f.dec, err = openDynModel(rt, spec.ID, path("decoder"), ins, outs, nRuns, spin); err != nil {
		return fail(fmt.Errorf("decoder: %w", err))
	}
	return f, nil
}

func newFlorenceConfig(spec engine.Spec) (*florence, int, error) {
	for _, role := range []string{"vision_encoder", "embed_tokens", "encoder", "decoder", "tokenizer"} {
		if spec.Files[role] == "" {
			return nil, 0, fmt.Errorf("spec names no %q file", role)
		}
	}
	f := &florence{id: spec.ID, start: 2, eos: 2, forcedBOS: 0, noRepeat: 3, done: make(chan struct{})}
	var err error
	if f.size, err = onnx.IntOption(spec.Options, "image_size", flImageSize, 32, 4096); err != nil {
		return nil, 0, err
	}
	if f.maxNew, err = onnx.IntOption(spec.Options, "max_new_tokens", flMaxNewTokens, 1, 8192); err != nil {
		return nil, 0, err
	}
	if f.tok, err = tokenizer.Load(filepath.Join(spec.Dir, spec.Files["tokenizer"])); err != nil {
		return nil, 0, err
	}
	if name := spec.Files["generation_config"]; name != "" {
		if err := f.readGenerationConfig(filepath.Join(spec.Dir, name)); err != nil {
			return nil, 0, err
		}
	}
	if f.noRepeat, err = onnx.IntOption(spec.Options, "no_repeat_ngram_size", f.noRepeat, 0, 64); err != nil {
		return nil, 0, err
	}
	nRuns, err := onnx.IntOption(spec.Options, "concurrency", 1, 1, maxConcurrency)
	if err != nil {
		return nil, 0, err
	}
	return f, nRuns, nil
}

// readGenerationConfig takes the decoding ids from generation_config.json.
func (f *florence) readGenerationConfig(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("generation config: %w", err)
	}
	var c struct {
		Start    *int64          `json:"decoder_start_token_id"`
		EOS      json.RawMessage `json:"eos_token_id"`
		BOS      *int64          `json:"forced_bos_token_id"`
		NoRepeat *int            `json:"no_repeat_ngram_size"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("generation config: %w", err)
	}
	if c.Start != nil {
		f.start = *c.Start
	}
	if c.BOS != nil {
		f.forcedBOS = *c.BOS
	}
	if c.NoRepeat != nil {
		f.noRepeat = *c.NoRepeat
	}
	if len(c.EOS) > 0 {
		var one int64
		var many []int64
		switch {
		case json.Unmarshal(c.EOS, &one) == nil:
			f.eos = one
		case json.Unmarshal(c.EOS, &many) == nil && len(many) > 0:
			f.eos = many[0]
		}
	}
	return nil
}

// decoderSignature reads the merged decoder's past_key_values inputs to
// find the layers, heads and head size, and returns the session's input and
// output specs: the four fixed inputs, then for each layer the decoder and
// encoder keys and values; logits, then the matching present outputs.
func (f *florence) decoderSignature(path string) ([]ioSpec, []ioSpec, error) {
	fin, _, err := onnx.ReadSignature(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read model signature: %w", err)
	}
	f.layers = 0
	for _, in := range fin {
		rest, ok := strings.CutPrefix(in.Name, "past_key_values.")
		if !ok || !strings.HasSuffix(rest, ".decoder.key") {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSuffix(rest, ".decoder.key"))
		if err != nil || len(in.Dimensions) != 4 {
			return nil, nil, fmt.Errorf("input %q: unexpected name or shape %v", in.Name, in.Dimensions)
		}
		f.layers = max(f.layers, n+1)
		f.heads, f.headDim = int(in.Dimensions[1]), int(in.Dimensions[3])
	}
	if f.layers == 0 || f.heads <= 0 || f.headDim <= 0 {
		return nil, nil, errors.New("no past_key_values.N.decoder.key inputs with fixed heads and head size")
	}
	ins := []ioSpec{i64(flEncMask, -1, -1), f32(flEncHidden, -1, -1, -1), f32(flEmbeds, -1, -1, -1),
		{name: flBranch, dtype: ort.TensorElementDataTypeBool, dims: []int64{1}}}
	outs := []ioSpec{f32(flLogits, -1, -1, -1)}
	kv := []int64{-1, int64(f.heads), -1, int64(f.headDim)}
	for l := range f.layers {
		for _, part := range []string{"decoder.key", "decoder.value", "encoder.key", "encoder.value"} {
			ins = append(ins, f32(fmt.Sprintf("past_key_values.%d.%s", l, part), kv...))
			outs = append(outs, f32(fmt.Sprintf("present.%d.%s", l, part), kv...))
		}
	}
	return ins, outs, nil
}

// ID returns the canonical model id.
func (f *florence) ID() string { return f.id }

// Describe captions req.Image with the task prompt of req.Detail.
func (f *florence) Describe(ctx context.Context, req engine.DescribeRequest) (string, error) {
	detail := req.Detail
	if detail == "" {
		detail = engine.DetailCaption
	}
	task, ok := florencePrompts[detail]
	if !ok {
		return "", &engine.InputError{Param: "detail", Msg: fmt.Sprintf("detail must be %q, %q or %q", engine.DetailCaption, engine.DetailDetailed, engine.DetailMore)}
	}
	if req.Image == nil || req.Image.Bounds().Empty() {
		return "", &engine.InputError{Param: "image", Msg: "image has no pixels"}
	}
	ids, _, err := f.generate(ctx, req.Image, task[1], f.maxNew)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(f.tok.Decode(ids, true)), nil
}

// Close waits for runs in flight, then releases the four sessions.
func (f *florence) Close() error {
	f.once.Do(func() {
		close(f.done)
		var errs []error
		for _, m := range []*dynModel{f.vision, f.embed, f.enc, f.dec} {
			if m != nil {
				errs = append(errs, m.close())
			}
		}
		f.err = errors.Join(errs...)
	})
	return f.err
}

package whisper

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
	"github.com/infermesh/infermesh/node/engine/tokenizer"
)

// Bounds of Spec.Options.
const (
	maxSlots = 16
)

// errClosed is returned by calls on a closed engine.
var errClosed = errors.New("whisper: engine is closed")

// Engine is a loaded Whisper model. It implements engine.Transcriber.
// Concurrency: the encoder and the merged decoder are one ONNX Runtime
// session each, shared by all calls; each of n slots (Spec.Options
// "concurrency", default 1) owns every buffer one transcription needs (mel,
// encoder output, encoder and decoder KV caches, logits), and the slots
// channel is both their pool and the semaphore bounding concurrent runs.
type Engine struct {
	id     string
	cfg    *modelConfig
	mel    *melFrontEnd
	tok    *tokenizer.Tokenizer
	enc    *ort.DynamicAdvancedSession
	dec    *ort.DynamicAdvancedSession
	names  ioNames
	slots  chan *slot
	nSlots int
	words  bool // the decoder exposes cross_attentions for the alignment heads

	life   sync.RWMutex // held for reading by runs, for writing by Close
	closed bool
	done   chan struct{}
	once   sync.Once
	err    error
}

// ioNames are the decoder's input and output names, indexed like the KV
// buffers: 2*layer for the key, 2*layer+1 for the value.
type ioNames struct {
	pastDec, pastEnc, presDec, presEnc []string
	cross                              []string // per alignment layer
}

// Load loads a Whisper export in the Hugging Face Optimum layout: an
// encoder (input_features -> last_hidden_state) and a merged decoder with
// KV cache (input_ids, encoder_hidden_states, past_key_values.N.*,
// use_cache_branch -> logits, present.N.*). spec.Files names the roles
// "encoder", "decoder", "config" (config.json), "generation_config" and
// "tokenizer" (tokenizer.json) inside spec.Dir; every size and token id is
// read from those files, so tiny to large-v3 and distil exports load.
// spec.Options "concurrency" sets the number of simultaneous
// transcriptions (default 1).
func Load(rt *onnx.Runtime, spec engine.Spec) (engine.Transcriber, error) {
	return load(rt, spec)
}

func load(rt *onnx.Runtime, spec engine.Spec) (*Engine, error) {
	if rt == nil {
		return nil, fmt.Errorf("whisper: %s: no runtime", spec.ID)
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, err
	}
	if spec.Task != "" && spec.Task != engine.TaskSpeechToText {
		return nil, fmt.Errorf("whisper: %s: task %q is not %q", spec.ID, spec.Task, engine.TaskSpeechToText)
	}
	wrap := func(err error) error { return fmt.Errorf("whisper: %s: %w", spec.ID, err) }
	nSlots := 1
	if s := spec.Options["concurrency"]; s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > maxSlots {
			return nil, wrap(fmt.Errorf("option concurrency=%q: want an integer in [1, %d]", s, maxSlots))
		}
		nSlots = v
	}
	if spec.Files["tokenizer"] == "" {
		return nil, wrap(errors.New("spec names no \"tokenizer\" file"))
	}
	tok, err := tokenizer.Load(filepath.Join(spec.Dir, spec.Files["tokenizer"]))
	if err != nil {
		return nil, wrap(err)
	}
	cfg, err := loadConfig(spec.Dir, spec.Files, tok)
	if err != nil {
		return nil, wrap(err)
	}
	e := &Engine{id: spec.ID, cfg: cfg, tok: tok, mel: newMelFrontEnd(cfg.nMels), done: make(chan struct{})}
	encPath, decPath := filepath.Join(spec.Dir, spec.Files["encoder"]), filepath.Join(spec.Dir, spec.Files["decoder"])
	for role, p := range map[string]string{"encoder": encPath, "decoder": decPath} {
		if spec.Files[role] == "" {
			return nil, wrap(fmt.Errorf("spec names no %q file", role))
		}
		if _, err := os.Stat(p); err != nil {
			return nil, wrap(fmt.Errorf("%s file: %w", role, err))
		}
	}
	decIn, decOut, err := e.checkSignature(encPath, decPath)
	if err != nil {
		return nil, wrap(err)
	}
	opts, err := rt.SessionOptions()
	if err != nil {
		return nil, wrap(fmt.Errorf("session options: %w", err))
	}
	defer opts.Destroy()
	if e.enc, err = ort.NewDynamicAdvancedSession(encPath, []string{"input_features"}, []string{"last_hidden_state"}, opts); err != nil {
		return nil, wrap(fmt.Errorf("encoder session: %w", err))
	}
	if e.dec, err = ort.NewDynamicAdvancedSession(decPath, decIn, decOut, opts); err != nil {
		e.Close()
		return nil, wrap(fmt.Errorf("decoder session: %w", err))
	}
	e.slots = make(chan *slot, nSlots)
	for range nSlots {
		s, err := e.newSlot()
		if err != nil {
			e.Close()
			return nil, wrap(err)
		}
		e.slots <- s
		e.nSlots++
	}
	return e, nil
}

// checkSignature verifies the two models' inputs and outputs against the
// configuration and returns the decoder's input and output names.
func (e *Engine) checkSignature(encPath, decPath string) ([]string, []string, error) {
	encIn, encOut, err := onnx.ReadSignature(encPath)
	if err != nil {
		return nil, nil, fmt.Errorf("encoder signature: %w", err)
	}
	has := func(infos []ort.InputOutputInfo, name string) *ort.InputOutputInfo {
		for i := range infos {
			if infos[i].Name == name {
				return &infos[i]
			}
		}
		return nil
	}
	if in := has(encIn, "input_features"); in == nil || len(in.Dimensions) != 3 ||
		(in.Dimensions[1] > 0 && int(in.Dimensions[1]) != e.cfg.nMels) {
		return nil, nil, fmt.Errorf("encoder has no input_features [1, %d, 3000] input", e.cfg.nMels)
	}
	if has(encOut, "last_hidden_state") == nil {
		return nil, nil, errors.New("encoder has no last_hidden_state output")
	}
	decInfo, decOutInfo, err := onnx.ReadSignature(decPath)
	if err != nil {
		return nil, nil, fmt.Errorf("decoder signature: %w", err)
	}
	c := e.cfg
	in := []string{"input_ids", "encoder_hidden_states", "use_cache_branch"}
	out := []string{"logits"}
	n := &e.names
	for l := range c.layers {
		for _, kv := range []string{"key", "value"} {
			n.pastDec = append(n.pastDec, fmt.Sprintf("past_key_values.%d.decoder.%s", l, kv))
			n.pastEnc = append(n.pastEnc, fmt.Sprintf("past_key_values.%d.encoder.%s", l, kv))
			n.presDec = append(n.presDec, fmt.Sprintf("present.%d.decoder.%s", l, kv))
			n.presEnc = append(n.presEnc, fmt.Sprintf("present.%d.encoder.%s", l, kv))
		}
	}
	in = append(append(in, n.pastDec...), n.pastEnc...)
	out = append(append(out, n.presDec...), n.presEnc...)
	for _, name := range in {
		info := has(decInfo, name)
		if info == nil {
			return nil, nil, fmt.Errorf("decoder has no %s input (not a merged decoder with KV cache?)", name)
		}
		if len(info.Dimensions) == 4 && info.Dimensions[1] > 0 && int(info.Dimensions[1]) != c.heads {
			return nil, nil, fmt.Errorf("decoder input %s has %d heads, config says %d", name, info.Dimensions[1], c.heads)
		}
	}
	for _, name := range out {
		if has(decOutInfo, name) == nil {
			return nil, nil, fmt.Errorf("decoder has no %s output", name)
		}
	}
	if lg := has(decOutInfo, "logits"); len(lg.Dimensions) != 3 || (lg.Dimensions[2] > 0 && int(lg.Dimensions[2]) != c.vocab) {
		return nil, nil, fmt.Errorf("decoder logits %v do not match vocab_size %d", lg.Dimensions, c.vocab)
	}
	e.words = len(c.alignmentHeads) > 0
	for _, l := range c.alignmentLayers() {
		name := fmt.Sprintf("cross_attentions.%d", l)
		if has(decOutInfo, name) == nil {
			e.words = false
			break
		}
		n.cross = append(n.cross, name)
	}
	if e.words {
		out = append(out, n.cross...)
	} else {
		n.cross = nil
	}
	return in, out, nil
}

// ID returns the canonical model id.
func (e *Engine) ID() string { return e.id }

// Languages lists the ISO-639-1 codes accepted in TranscribeRequest.Language.
func (e *Engine) Languages() []string { return e.cfg.languages() }

// WordTimestamps reports whether the export has the cross-attention
// outputs of the alignment heads, which word timestamps need.
func (e *Engine) WordTimestamps() bool { return e.words }

// acquire takes a slot, honouring ctx and Close.
func (e *Engine) acquire(ctx context.Context) (*slot, error) {
	select {
	case s := <-e.slots:
		select {
		case <-e.done:
			e.slots <- s
			return nil, errClosed
		default:
		}
		return s, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-e.done:
		return nil, errClosed
	}
}

// Close waits for transcriptions in flight to finish their current model
// run, then releases the slots and sessions.
func (e *Engine) Close() error {
	e.once.Do(func() {
		close(e.done)
		// Runs in flight finish; later runs fail with errClosed, so the
		// slots come back soon.
		e.life.Lock()
		e.closed = true
		e.life.Unlock()
		for range e.nSlots {
			(<-e.slots).destroy()
		}
		var errs []error
		if e.enc != nil {
			errs = append(errs, e.enc.Destroy())
		}
		if e.dec != nil {
			errs = append(errs, e.dec.Destroy())
		}
		e.err = errors.Join(errs...)
	})
	return e.err
}

package onnx

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/chat"
	"github.com/infermesh/infermesh/node/engine/tokenizer"
)

// Decoder input and output names, as Optimum / onnx-community export
// decoder-only models (Llama, Qwen2, SmolLM, ...).
const (
	positionIDs     = "position_ids"
	useCacheBranch  = "use_cache_branch"
	logitsOutput    = "logits"
	defaultContext  = 2048
	defaultMaxOut   = 1024
	logitsChunkSize = 8 << 20 // floats of prompt logits per prefill run

	defaultMaxBatch     = 8
	defaultQueuePerSlot = 4 // default max_queue: this many per batch slot
	defaultKVMemoryMB   = 1024
	defaultPrefillChunk = 128
	// defaultPrefillParallel is how many waiting prompts prefill at once,
	// side by side in the session (see scheduler): two, one per core of
	// the 2-core reference machine.
	defaultPrefillParallel = 2

	// spinningOption is the model option that lets ONNX Runtime's intra-op
	// threads spin between operators ("on") instead of sleeping ("off",
	// the default): see decoder.spin.
	spinningOption = "thread_spinning"
	allowSpinning  = "session.intra_op.allow_spinning"
)

// decoder serves a chat model on one ONNX Runtime session. A scheduler
// goroutine batches the decode steps of all running requests into shared
// runs (see scheduler and batchKV) and keeps a prefix cache (prefixCache);
// each request samples and streams in its own goroutine.
type decoder struct {
	id        string
	model     *chat.Model
	sess      *ort.DynamicAdvancedSession
	inputs    []string // session input order
	outputs   []string // logits, then present.N.key, present.N.value, ...
	layers    int
	kvHeads   int
	headDim   int
	vocabRows int // logits width
	positions bool
	branch    bool // use_cache_branch input (merged decoders)
	chunk     int  // prefill positions per run
	// spin keeps ONNX Runtime's default of intra-op threads spinning while
	// they wait for work. Off by default: a decode step is ~1,500 small
	// operators, and on a machine whose cores are shared (other models,
	// other processes) a spinning pool thread burns the core the request
	// goroutines need for sampling and waits on descheduled peers; on the
	// shared 2-core reference machine sleeping threads made a 1-row step
	// 2.2-2.5x and an 8-row step 3x faster, with 1.6-2.6x less CPU time
	// (BenchmarkDecodeStep).
	spin bool
	// defaults are the model's generation_config.json sampling defaults,
	// applied to parameters a request leaves unset.
	defaults chat.GenerationDefaults
	sched    *scheduler
	prefix   *prefixCache // nil: disabled

	life   sync.RWMutex // runs hold it for reading, Close for writing
	closed bool
}

// LoadChat builds a chat engine from spec: Files["model"] is a decoder-only
// ONNX model with inputs input_ids, attention_mask, optionally position_ids
// and use_cache_branch, and past_key_values.N.key|value (float32
// [batch, kv_heads, past, head_dim]); outputs logits and
// present.N.key|value. Files["tokenizer"] is a byte-level BPE
// tokenizer.json; optional Files["tokenizer_config"] holds the chat
// template and Files["generation_config"] the end-of-sequence ids. The
// layer and head counts come from the model's inputs. Options:
//   - context_window (default 2048) and max_output (default 1024);
//   - max_batch: sequences decoding together (default 8; 1 turns
//     batching off);
//   - max_queue: requests waiting for a batch slot before the engine
//     answers engine.ErrBusy (default 4 × max_batch; 0 refuses at once);
//   - kv_memory_mb: budget of the batch's key/value cache (default 1024);
//   - prefill_chunk: prompt tokens per prefill run, interleaved with the
//     batch's decode steps (default 128, at most 8 Mi logit floats);
//   - prefill_parallel: waiting prompts whose chunks run at once, side by
//     side in the session (default 2; 1 prefills one prompt at a time);
//   - prefix_cache_mb: memory of the prefix cache (default 256; 0 turns it
//     off) and prefix_block: tokens per cached block (default 64);
//   - thread_spinning: "on" lets idle intra-op threads spin (ONNX
//     Runtime's default), "off" (default) lets them sleep.
//
// The engine returned is an engine.BatchingChatter.
func (r *Runtime) LoadChat(spec engine.Spec) (engine.Chatter, error) {
	r, err := r.checkLoad(spec, engine.TaskChat)
	if err != nil {
		return nil, err
	}
	d, err := newDecoder(spec)
	if err != nil {
		return nil, fmt.Errorf("onnx: %s: %w", spec.ID, err)
	}
	if err := d.openSession(r, filepath.Join(spec.Dir, spec.Files["model"])); err != nil {
		return nil, fmt.Errorf("onnx: %s: %w", spec.ID, err)
	}
	if d.vocabRows < d.model.Tok.VocabSize() {
		d.sess.Destroy()
		return nil, fmt.Errorf("onnx: %s: the model has %d logits but the tokenizer %d tokens", spec.ID, d.vocabRows, d.model.Tok.VocabSize())
	}
	if err := d.start(spec.Options); err != nil {
		d.sess.Destroy()
		return nil, fmt.Errorf("onnx: %s: %w", spec.ID, err)
	}
	return d, nil
}

// start reads the batching options and starts the scheduler.
func (d *decoder) start(opts map[string]string) error {
	maxBatch, err := IntOption(opts, "max_batch", defaultMaxBatch, 1, 256)
	if err != nil {
		return err
	}
	maxQueue, err := IntOption(opts, "max_queue", defaultQueuePerSlot*maxBatch, 0, 1<<16)
	if err != nil {
		return err
	}
	kvMB, err := IntOption(opts, "kv_memory_mb", defaultKVMemoryMB, 1, 1<<20)
	if err != nil {
		return err
	}
	chunkCap := max(1, logitsChunkSize/d.vocabRows)
	if d.chunk, err = IntOption(opts, "prefill_chunk", min(defaultPrefillChunk, chunkCap), 1, chunkCap); err != nil {
		return err
	}
	prefixMB, err := IntOption(opts, "prefix_cache_mb", defaultPrefixCacheMB, 0, 1<<20)
	if err != nil {
		return err
	}
	block, err := IntOption(opts, "prefix_block", defaultPrefixBlock, 1, 4096)
	if err != nil {
		return err
	}
	if prefixMB > 0 {
		d.prefix = newPrefixCache(int64(prefixMB)<<20, block, d.layers, d.kvHeads, d.headDim)
	}
	lanes, err := IntOption(opts, "prefill_parallel", defaultPrefillParallel, 1, 64)
	if err != nil {
		return err
	}
	d.sched, err = newScheduler(d, schedConfig{maxBatch: maxBatch, maxQueue: maxQueue, kvBudget: int64(kvMB) << 20,
		lanes: lanes}, d.prefix)
	return err
}

// newDecoder reads the tokenizer, template, generation config and options.
func newDecoder(spec engine.Spec) (*decoder, error) {
	if spec.Files["model"] == "" || spec.Files["tokenizer"] == "" {
		return nil, fmt.Errorf("spec needs files \"model\" and \"tokenizer\"")
	}
	tok, err := tokenizer.Load(filepath.Join(spec.Dir, spec.Files["tokenizer"]))
	if err != nil {
		return nil, err
	}
	var cfg chat.TokenizerConfig
	if f := spec.Files["tokenizer_config"]; f != "" {
		if cfg, err = chat.LoadTokenizerConfig(filepath.Join(spec.Dir, f)); err != nil {
			return nil, err
		}
	}
	var fallback chat.Format
	if _, ok := tok.TokenToID("<|im_start|>"); ok {
		fallback = chat.FormatChatML
	} else if _, ok := tok.TokenToID("<|start_header_id|>"); ok {
		fallback = chat.FormatLlama3
	}
	tpl, err := chat.NewTemplate(cfg, fallback)
	if err != nil {
		return nil, err
	}
	eos, err := eosIDs(spec, tok, cfg)
	if err != nil {
		return nil, err
	}
	ctxWin, err := IntOption(spec.Options, "context_window", defaultContext, 2, chat.MaxContextTokens)
	if err != nil {
		return nil, err
	}
	maxOut, err := IntOption(spec.Options, "max_output", min(defaultMaxOut, ctxWin), 1, min(ctxWin, chat.MaxOutputTokensLimit))
	if err != nil {
		return nil, err
	}
	m, err := chat.NewModel(tok, tpl, eos, ctxWin, maxOut)
	if err != nil {
		return nil, err
	}
	var gen chat.GenerationDefaults
	if f := spec.Files["generation_config"]; f != "" {
		if gen, err = chat.LoadGenerationDefaults(filepath.Join(spec.Dir, f)); err != nil {
			return nil, err
		}
	}
	var spin bool
	switch v := spec.Options[spinningOption]; v {
	case "", "off":
	case "on":
		spin = true
	default:
		return nil, fmt.Errorf("option %s=%q: want on or off", spinningOption, v)
	}
	return &decoder{id: spec.ID, model: m, chunk: defaultPrefillChunk, defaults: gen, spin: spin}, nil
}

// eosIDs collects the end-of-sequence ids from generation_config.json
// (eos_token_id: a number or a list) and tokenizer_config.json's eos_token.
func eosIDs(spec engine.Spec, tok *tokenizer.Tokenizer, cfg chat.TokenizerConfig) ([]int64, error) {
	var ids []int64
	if f := spec.Files["generation_config"]; f != "" {
		data, err := os.ReadFile(filepath.Join(spec.Dir, f))
		if err != nil {
			return nil, err
		}
		var g struct {
			EOS json.RawMessage `json:"eos_token_id"`
		}
		if err := json.Unmarshal(data, &g); err != nil {
			return nil, fmt.Errorf("generation_config: %w", err)
		}
		var one int64
		var many []int64
		switch {
		case len(g.EOS) == 0 || string(g.EOS) == "null":
		case json.Unmarshal(g.EOS, &one) == nil:
			ids = append(ids, one)
		case json.Unmarshal(g.EOS, &many) == nil:
			ids = append(ids, many...)
		default:
			return nil, fmt.Errorf("generation_config: eos_token_id must be a number or a list")
		}
	}
	if cfg.EOSToken != "" {
		if id, ok := tok.TokenToID(cfg.EOSToken); ok && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	for _, id := range ids {
		if id < 0 || id >= int64(tok.VocabSize()) {
			return nil, fmt.Errorf("eos id %d is outside the vocabulary", id)
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("no end-of-sequence token: set eos_token_id in generation_config.json or eos_token in tokenizer_config.json")
	}
	return ids, nil
}

// pastLayer parses past_key_values.N.key|value and returns N.
func pastLayer(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "past_key_values.")
	if !ok {
		return 0, false
	}
	num, kind, ok := strings.Cut(rest, ".")
	if !ok || kind != "key" && kind != "value" {
		return 0, false
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n > 1024 || strconv.Itoa(n) != num {
		return 0, false
	}
	return n, true
}

// openSession reads the model's signature (layers, kv heads, head size,
// vocabulary rows) with a probe session, then creates the real one.
func (d *decoder) openSession(r *Runtime, path string) error {
	ins, outs, err := ReadSignature(path)
	if err != nil {
		return fmt.Errorf("read model %s: %w", path, err)
	}
	have := map[string]bool{}
	past := map[int]int{} // layer -> key/value inputs seen
	for _, in := range ins {
		have[in.Name] = true
		switch in.Name {
		case inputIDs, attentionMask, positionIDs:
			if in.DataType != ort.TensorElementDataTypeInt64 {
				return fmt.Errorf("input %s is %s, want int64", in.Name, in.DataType)
			}
			d.positions = d.positions || in.Name == positionIDs
			continue
		case useCacheBranch:
			d.branch = true
			continue
		}
		layer, ok := pastLayer(in.Name)
		if !ok {
			return fmt.Errorf("model input %q is not supported (want %s, %s, %s, past_key_values.N.key|value)", in.Name, inputIDs, attentionMask, positionIDs)
		}
		if in.DataType != ort.TensorElementDataTypeFloat {
			return fmt.Errorf("input %s is %s: only float32 key/value caches are supported", in.Name, in.DataType)
		}
		dims := in.Dimensions
		if len(dims) != 4 || dims[1] <= 0 || dims[3] <= 0 {
			return fmt.Errorf("input %s has shape %v, want [batch, kv_heads, past, head_dim] with static heads and size", in.Name, dims)
		}
		if d.kvHeads == 0 {
			d.kvHeads, d.headDim = int(dims[1]), int(dims[3])
		} else if int(dims[1]) != d.kvHeads || int(dims[3]) != d.headDim {
			return fmt.Errorf("input %s has shape %v, unlike the other layers' [_, %d, _, %d]", in.Name, dims, d.kvHeads, d.headDim)
		}
		past[layer]++
	}
	if !have[inputIDs] || !have[attentionMask] {
		return fmt.Errorf("model needs inputs %s and %s", inputIDs, attentionMask)
	}
	d.layers = len(past)
	if d.layers == 0 {
		return fmt.Errorf("model has no past_key_values inputs (export it with the KV cache, e.g. Optimum's text-generation-with-past)")
	}
	d.inputs = []string{inputIDs, attentionMask}
	if d.positions {
		d.inputs = append(d.inputs, positionIDs)
	}
	if d.branch {
		d.inputs = append(d.inputs, useCacheBranch)
	}
	d.outputs = []string{logitsOutput}
	outByName := map[string]ort.InputOutputInfo{}
	for _, o := range outs {
		outByName[o.Name] = o
	}
	for l := range d.layers {
		if past[l] != 2 {
			return fmt.Errorf("model lacks past_key_values.%d.key or .value", l)
		}
		for _, kind := range []string{"key", "value"} {
			d.inputs = append(d.inputs, fmt.Sprintf("past_key_values.%d.%s", l, kind))
			name := fmt.Sprintf("present.%d.%s", l, kind)
			if _, ok := outByName[name]; !ok {
				return fmt.Errorf("model lacks output %s", name)
			}
			d.outputs = append(d.outputs, name)
		}
	}
	lo, ok := outByName[logitsOutput]
	if !ok || len(lo.Dimensions) != 3 || lo.Dimensions[2] <= 0 || lo.DataType != ort.TensorElementDataTypeFloat {
		return fmt.Errorf("model needs a float output %s [batch, sequence, vocab] with a static vocabulary size", logitsOutput)
	}
	d.vocabRows = int(lo.Dimensions[2])
	opts, err := r.SessionOptions()
	if err != nil {
		return err
	}
	defer opts.Destroy()
	if !d.spin {
		if err := opts.AddSessionConfigEntry(allowSpinning, "0"); err != nil {
			return fmt.Errorf("session option %s: %w", allowSpinning, err)
		}
	}
	d.sess, err = ort.NewDynamicAdvancedSession(path, d.inputs, d.outputs, opts)
	if err != nil {
		return fmt.Errorf("create session: %w", err)
	}
	return nil
}

// ID returns the model id.
func (d *decoder) ID() string { return d.id }

// ContextWindow is the most tokens prompt plus completion may take.
func (d *decoder) ContextWindow() int { return d.model.ContextWindow }

// MaxOutputTokens is the default and largest completion.
func (d *decoder) MaxOutputTokens() int { return d.model.MaxOutput }

// Close stops the scheduler (requests still running fail with
// errEngineClosed), waits for the running step and frees the session.
func (d *decoder) Close() error {
	if d.sched != nil {
		d.sched.close()
	}
	d.life.Lock()
	defer d.life.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	return d.sess.Destroy()
}

// BatchStats returns the scheduler's counters.
func (d *decoder) BatchStats() engine.BatchStats { return d.sched.stats() }

// PrefixStats returns the prefix cache's counters (zero when disabled).
func (d *decoder) PrefixStats() engine.PrefixStats {
	if d.prefix == nil {
		return engine.PrefixStats{}
	}
	return d.prefix.stats()
}

// Chat validates and renders the request, waits for admission to the
// batch (or fails with engine.BusyError when the queue is full) and runs
// the generation loop, whose Forward calls the scheduler serves. Deltas
// reach onDelta through a goroutine of their own, in order, so a slow
// client never holds back the batch's next step.
func (d *decoder) Chat(ctx context.Context, req engine.ChatRequest, onDelta func(engine.ChatDelta) error) (engine.ChatResponse, error) {
	d.defaults.Apply(&req)
	plan, err := d.model.Prepare(req)
	if err != nil {
		return engine.ChatResponse{}, err
	}
	if err := ctx.Err(); err != nil {
		return engine.ChatResponse{}, err
	}
	q, err := d.sched.admit(ctx, len(plan.Prompt)+plan.MaxTokens)
	if err != nil {
		return engine.ChatResponse{}, err
	}
	defer q.close()
	return chat.Pumped(ctx, onDelta, func(send func(engine.ChatDelta) error) (engine.ChatResponse, error) {
		return d.model.Generate(ctx, plan, q, send)
	})
}

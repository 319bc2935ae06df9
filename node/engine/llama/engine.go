package llama

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/chat"
	"github.com/infermesh/infermesh/node/engine/gguf"
	"github.com/infermesh/infermesh/node/engine/tokenizer"
)

// Engine defaults.
const (
	defaultContext      = 2048
	defaultMaxOut       = 1024
	defaultMaxBatch     = 8
	defaultQueuePerSlot = 4
	defaultPrefillChunk = 256
	// defaultKVCells caps the default KV cells of running sequences
	// (kv_cells): max_batch × context_window would allocate 16,384 cells
	// at the defaults, most of them never used by short chats.
	defaultKVCells = 8192
	// defaultPrefixSequences is how many finished sequences the prefix
	// cache keeps (each under a sequence id of its own).
	defaultPrefixSequences = 8
)

// errEngineClosed fails requests of an engine being closed.
var errEngineClosed = errors.New("llama: engine is closed")

// Config is the node's setting of the GGUF runtime.
type Config struct {
	// Threads is the number of compute threads of each model's context
	// (0: half the CPUs, at least one; see defaultThreads).
	Threads int
	// Poll is how busily idle compute threads wait for the next step,
	// 0-100 (ggml's poll level; 0: sleep at once, llama.cpp's own default
	// is 50). Models may override it with the option "poll".
	Poll int
}

// Runtime serves GGUF models on one loaded llama.cpp library.
type Runtime struct {
	lib *Lib
	cfg Config
}

// NewRuntime opens the library in dir (see Open) for the node.
func NewRuntime(dir string, cfg Config) (*Runtime, error) {
	if cfg.Threads < 0 || cfg.Poll < 0 || cfg.Poll > 100 {
		return nil, fmt.Errorf("llama: bad config %+v", cfg)
	}
	lib, err := Open(dir)
	if err != nil {
		return nil, err
	}
	return &Runtime{lib: lib, cfg: cfg}, nil
}

// Version is the llama.cpp version of the runtime's library.
func (r *Runtime) Version() string { return r.lib.Version() }

// Close releases the runtime (the library stays until its engines are
// closed too).
func (r *Runtime) Close() { r.lib.Close() }

// defaultThreads is half the CPUs, at least one. ggml's compute threads
// spin-wait for each other at every operator of a step, so a thread that
// loses its core stalls the others: with the cores shared, one thread
// beats two by 10x on the 2-core reference machine (BenchmarkGGUFThreads:
// 55 tok/s against 5.6 at load average 9), and half the cores leaves room
// for the request goroutines, HTTP and other models.
func defaultThreads() int { return max(1, runtime.NumCPU()/2) }

// intOption reads an integer model option in [lo, hi] (def when unset).
func intOption(options map[string]string, key string, def, lo, hi int) (int, error) {
	s, ok := options[key]
	if !ok || s == "" {
		return def, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < lo || v > hi {
		return 0, fmt.Errorf("option %s=%q: want an integer in [%d, %d]", key, s, lo, hi)
	}
	return v, nil
}

// threads resolves the model's thread count and poll level.
func (r *Runtime) threads(opts map[string]string) (threads, poll int, err error) {
	def := r.cfg.Threads
	if def == 0 {
		def = defaultThreads()
	}
	if threads, err = intOption(opts, "threads", def, 1, 512); err != nil {
		return 0, 0, err
	}
	poll, err = intOption(opts, "poll", r.cfg.Poll, 0, 100)
	return threads, poll, err
}

// chatEngine serves one GGUF chat model: the project's tokenizer, template
// and generation loop (package chat) over llama.cpp's logits, one context
// per model driven by a continuous-batching scheduler.
type chatEngine struct {
	id     string
	model  *chat.Model
	lm     *Model
	sched  *scheduler
	prefix *prefixCache // nil: disabled
}

// LoadChat builds a chat engine from spec: Files["model"] is a GGUF file
// whose metadata carries the tokenizer (byte-level BPE) and normally the
// chat template (else ChatML or Llama 3 is chosen from the vocabulary).
// Options: context_window (default 2048, at most the model's training
// context), max_output (default 1024), max_batch (sequences decoding
// together, default 8), max_queue (default 4 × max_batch), prefill_chunk
// (prompt tokens per step, default 256), kv_cells (KV cells the running
// sequences' reservations — prompt + max_tokens — share, default
// min(max_batch × context_window, 8192), at least context_window; more
// waits in the queue), prefix_cache_tokens (KV cells
// the prefix cache may hold, default 2 × context_window; 0 turns it off),
// prefix_cache_seqs (finished sequences it keeps, default 8), threads and
// poll (Config).
// The engine returned is an engine.BatchingChatter.
func (r *Runtime) LoadChat(spec engine.Spec) (engine.Chatter, error) {
	e, err := r.loadChat(spec)
	if err != nil {
		return nil, fmt.Errorf("gguf: %s: %w", spec.ID, err)
	}
	return e, nil
}

func (r *Runtime) loadChat(spec engine.Spec) (*chatEngine, error) {
	if spec.Task != engine.TaskChat {
		return nil, fmt.Errorf("task %q is not chat", spec.Task)
	}
	if spec.Files["model"] == "" {
		return nil, errors.New(`spec needs file "model" (the .gguf)`)
	}
	path := filepath.Join(spec.Dir, spec.Files["model"])
	f, err := gguf.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := f.Check(); err != nil {
		return nil, err
	}
	tok, info, err := f.Tokenizer()
	if err != nil {
		return nil, err
	}
	var fallback chat.Format
	if _, ok := tok.TokenToID("<|im_start|>"); ok {
		fallback = chat.FormatChatML
	} else if _, ok := tok.TokenToID("<|start_header_id|>"); ok {
		fallback = chat.FormatLlama3
	}
	tpl, err := chat.NewTemplate(chat.TokenizerConfig{ChatTemplate: info.ChatTemplate, BOSToken: info.BOS, EOSToken: info.EOS}, fallback)
	if err != nil {
		return nil, err
	}
	maxCtx := chat.MaxContextTokens
	if n, ok := f.Int(f.Architecture() + ".context_length"); ok && n > 1 && n < int64(maxCtx) {
		maxCtx = int(n)
	}
	ctxWin, err := intOption(spec.Options, "context_window", min(defaultContext, maxCtx), 2, maxCtx)
	if err != nil {
		return nil, err
	}
	maxOut, err := intOption(spec.Options, "max_output", min(defaultMaxOut, ctxWin), 1, min(ctxWin, chat.MaxOutputTokensLimit))
	if err != nil {
		return nil, err
	}
	m, err := chat.NewModel(tok, tpl, info.EndIDs, ctxWin, maxOut)
	if err != nil {
		return nil, err
	}
	maxBatch, err := intOption(spec.Options, "max_batch", defaultMaxBatch, 1, 64)
	if err != nil {
		return nil, err
	}
	maxQueue, err := intOption(spec.Options, "max_queue", defaultQueuePerSlot*maxBatch, 0, 1<<16)
	if err != nil {
		return nil, err
	}
	chunk, err := intOption(spec.Options, "prefill_chunk", defaultPrefillChunk, 1, 8192)
	if err != nil {
		return nil, err
	}
	kvCells, err := intOption(spec.Options, "kv_cells", max(ctxWin, min(maxBatch*ctxWin, defaultKVCells)), ctxWin, 1<<22)
	if err != nil {
		return nil, err
	}
	prefixTokens, err := intOption(spec.Options, "prefix_cache_tokens", 2*ctxWin, 0, 1<<22)
	if err != nil {
		return nil, err
	}
	threads, poll, err := r.threads(spec.Options)
	if err != nil {
		return nil, err
	}
	lm, err := r.lib.LoadModel(path)
	if err != nil {
		return nil, err
	}
	if err := checkTokens(lm, tok); err != nil {
		lm.Free()
		return nil, err
	}
	cacheIDs, err := intOption(spec.Options, "prefix_cache_seqs", defaultPrefixSequences, 1, 128)
	if err != nil {
		lm.Free()
		return nil, err
	}
	if prefixTokens == 0 {
		cacheIDs = 0
	}
	ctx, err := lm.NewContext(ContextConfig{Context: kvCells + prefixTokens, Sequences: maxBatch + cacheIDs,
		Batch: chunk + maxBatch, Threads: threads, Poll: poll, Unified: true})
	if err != nil {
		lm.Free()
		return nil, err
	}
	e := &chatEngine{id: spec.ID, model: m, lm: lm}
	var prefix *prefixCache
	if cacheIDs > 0 {
		prefix = newPrefixCache(ctx, maxBatch, cacheIDs, prefixTokens, cellBytes(f))
		e.prefix = prefix
	}
	e.sched = newScheduler(spec.ID, ctx, schedConfig{maxBatch: maxBatch, maxQueue: maxQueue, chunk: chunk, kvCells: kvCells, prefix: prefix})
	return e, nil
}

// ID returns the model id.
func (e *chatEngine) ID() string { return e.id }

// ContextWindow is the most tokens prompt plus completion may take.
func (e *chatEngine) ContextWindow() int { return e.model.ContextWindow }

// MaxOutputTokens is the default and largest completion.
func (e *chatEngine) MaxOutputTokens() int { return e.model.MaxOutput }

// BatchStats returns the scheduler's counters.
func (e *chatEngine) BatchStats() engine.BatchStats { return e.sched.stats() }

// PrefixStats returns the prefix cache's counters (zero when disabled).
// BlockTokens is 1: entries are whole sequences, matched token by token.
func (e *chatEngine) PrefixStats() engine.PrefixStats {
	if e.prefix == nil {
		return engine.PrefixStats{}
	}
	return e.prefix.snapshot()
}

// cellBytes estimates the bytes of one KV cell (F16 keys and values of
// every layer) from the metadata; 0 when it does not say.
func cellBytes(f *gguf.File) int {
	a := f.Architecture()
	layers, _ := f.Int(a + ".block_count")
	embd, _ := f.Int(a + ".embedding_length")
	heads, _ := f.Int(a + ".attention.head_count")
	kv, ok := f.Int(a + ".attention.head_count_kv")
	if !ok {
		kv = heads
	}
	if heads <= 0 || layers <= 0 || embd <= 0 || layers > 1<<12 || embd > 1<<20 {
		return 0
	}
	return int(layers * 2 * kv * (embd / heads) * 2)
}

// Close stops the scheduler (running requests fail with errEngineClosed)
// and frees the context and the model.
func (e *chatEngine) Close() error {
	if e.sched.close() {
		e.lm.Free()
	}
	return nil
}

// Chat validates and renders the request, waits for a sequence of the
// batch (or fails with engine.BusyError when the queue is full) and runs
// the generation loop, whose Forward calls the scheduler serves.
func (e *chatEngine) Chat(ctx context.Context, req engine.ChatRequest, onDelta func(engine.ChatDelta) error) (engine.ChatResponse, error) {
	plan, err := e.model.Prepare(req)
	if err != nil {
		return engine.ChatResponse{}, err
	}
	if err := ctx.Err(); err != nil {
		return engine.ChatResponse{}, err
	}
	q, err := e.sched.admit(ctx, len(plan.Prompt)+plan.MaxTokens)
	if err != nil {
		return engine.ChatResponse{}, err
	}
	defer q.close()
	return chat.Pumped(ctx, onDelta, func(send func(engine.ChatDelta) error) (engine.ChatResponse, error) {
		return e.model.Generate(ctx, plan, q, send)
	})
}

// checkTokens refuses a tokenizer built from the metadata that disagrees
// with llama.cpp's own reading of the vocabulary: the vocabulary size and
// every ordinary token's bytes (llama_token_to_piece) must match, so the
// text the engine streams is the text the model's tokens mean.
func checkTokens(lm *Model, tok *tokenizer.Tokenizer) error {
	if lm.VocabSize() != tok.VocabSize() {
		return fmt.Errorf("llama.cpp reads %d tokens, the tokenizer built from the metadata %d", lm.VocabSize(), tok.VocabSize())
	}
	for id := range tok.VocabSize() {
		if tok.IsSpecial(int64(id)) {
			continue
		}
		if got, want := tok.TokenBytes(int64(id)), lm.Piece(int32(id), false); string(got) != string(want) {
			return fmt.Errorf("token %d is %q to the tokenizer built from the metadata but %q to llama.cpp", id, got, want)
		}
	}
	return nil
}

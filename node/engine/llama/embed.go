package llama

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sync"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/gguf"
)

// Embedding defaults.
const (
	defaultEmbedTokens = 512
	embedSequences     = 8
	maxEmbedText       = 1 << 20
)

// embedEngine serves a GGUF embedding model: llama.cpp's own tokenizer
// (llama_tokenize with the model's special tokens: embedding models use
// WordPiece and other vocabularies the chat tokenizer does not build, and
// no text is decoded back), one embeddings context, pooling from the
// metadata (or the pooling option), L2-normalised vectors. Calls take
// turns on the context; each packs up to 8 inputs into one decode.
type embedEngine struct {
	id        string
	lm        *Model
	maxTokens int
	normalize bool

	mu     sync.Mutex // one call at a time on lctx
	lctx   *Context
	closed bool
}

// LoadEmbedder builds an embeddings engine from spec: Files["model"] is a
// GGUF embedding model (BERT-like encoders, or decoders with a pooling
// type). Options: pooling (mean, cls, last; default the model's
// <arch>.pooling_type), normalize (default true), max_tokens (default
// 512, at most the model's context), threads and poll.
func (r *Runtime) LoadEmbedder(spec engine.Spec) (engine.Embedder, error) {
	e, err := r.loadEmbedder(spec)
	if err != nil {
		return nil, fmt.Errorf("gguf: %s: %w", spec.ID, err)
	}
	return e, nil
}

func (r *Runtime) loadEmbedder(spec engine.Spec) (*embedEngine, error) {
	if spec.Task != engine.TaskEmbeddings {
		return nil, fmt.Errorf("task %q is not embeddings", spec.Task)
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
	pooling := PoolingUnspecified
	switch p := spec.Options["pooling"]; p {
	case "":
		if _, ok := f.Int(f.Architecture() + ".pooling_type"); !ok {
			return nil, errors.New("the model has no pooling type: set the pooling option (mean, cls, last)")
		}
	case "mean":
		pooling = PoolingMean
	case "cls":
		pooling = PoolingCLS
	case "last":
		pooling = PoolingLast
	default:
		return nil, fmt.Errorf("option pooling=%q: want mean, cls or last", p)
	}
	maxCtx := 1 << 15
	if n, ok := f.Int(f.Architecture() + ".context_length"); ok && n > 1 && n < int64(maxCtx) {
		maxCtx = int(n)
	}
	maxTokens, err := intOption(spec.Options, "max_tokens", min(defaultEmbedTokens, maxCtx), 2, maxCtx)
	if err != nil {
		return nil, err
	}
	normalize := true
	switch v := spec.Options["normalize"]; v {
	case "", "true":
	case "false":
		normalize = false
	default:
		return nil, fmt.Errorf("option normalize=%q: want true or false", v)
	}
	threads, poll, err := r.threads(spec.Options)
	if err != nil {
		return nil, err
	}
	lm, err := r.lib.LoadModel(path)
	if err != nil {
		return nil, err
	}
	batch := maxTokens * embedSequences
	lctx, err := lm.NewContext(ContextConfig{Context: batch, Sequences: embedSequences, Batch: batch, Threads: threads, Poll: poll,
		Embeddings: true, Pooling: pooling, Unified: true})
	if err != nil {
		lm.Free()
		return nil, err
	}
	return &embedEngine{id: spec.ID, lm: lm, maxTokens: maxTokens, normalize: normalize, lctx: lctx}, nil
}

// ID returns the model id.
func (e *embedEngine) ID() string { return e.id }

// MaxDimensions is the model's hidden size.
func (e *embedEngine) MaxDimensions() int { return e.lm.EmbeddingSize() }

// TruncatableDimensions is false: GGUF embedding models are not trained
// for shortened vectors.
func (e *embedEngine) TruncatableDimensions() bool { return false }

// Close frees the context and the model.
func (e *embedEngine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	e.lctx.Free()
	e.lm.Free()
	return nil
}

func inputErr(param, format string, args ...any) error {
	return &engine.InputError{Param: param, Msg: fmt.Sprintf(format, args...)}
}

// Embed tokenizes the inputs (truncated to max_tokens), runs them up to 8
// at a time in one decode each and returns one pooled, normalised vector
// per input.
func (e *embedEngine) Embed(ctx context.Context, req engine.EmbedRequest) (engine.EmbedResult, error) {
	var res engine.EmbedResult
	dim := e.MaxDimensions()
	if req.Dimensions != 0 && req.Dimensions != dim {
		return res, inputErr("dimensions", "this model's vectors have %d dimensions and cannot be shortened", dim)
	}
	switch {
	case len(req.Texts) > 0 && len(req.Tokens) > 0:
		return res, inputErr("input", "give texts or token arrays, not both")
	case len(req.Texts) == 0 && len(req.Tokens) == 0:
		return res, inputErr("input", "input is empty")
	}
	var inputs [][]int32
	for _, t := range req.Texts {
		if len(t) > maxEmbedText {
			return res, inputErr("input", "a text of %d bytes is over the %d-byte limit", len(t), maxEmbedText)
		}
		ids, err := e.lm.Tokenize(t, true, false)
		if err != nil {
			return res, err
		}
		inputs = append(inputs, ids[:min(len(ids), e.maxTokens)])
	}
	for _, ts := range req.Tokens {
		if len(ts) == 0 {
			return res, inputErr("input", "a token array is empty")
		}
		ids := make([]int32, 0, min(len(ts), e.maxTokens))
		for _, id := range ts[:min(len(ts), e.maxTokens)] {
			if id < 0 || id >= int64(e.lm.VocabSize()) {
				return res, inputErr("input", "token id %d is outside the vocabulary (%d tokens)", id, e.lm.VocabSize())
			}
			ids = append(ids, int32(id))
		}
		inputs = append(inputs, ids)
	}
	for _, in := range inputs {
		if len(in) == 0 {
			return res, inputErr("input", "an input has no tokens")
		}
		res.PromptTokens += len(in)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return res, errEngineClosed
	}
	for start := 0; start < len(inputs); start += embedSequences {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		group := inputs[start:min(len(inputs), start+embedSequences)]
		b := e.lctx.Batch()
		for s, in := range group {
			for i, id := range in {
				b.Add(id, i, s, true)
			}
		}
		err := e.lctx.Decode()
		if err == nil {
			for s := range group {
				v := e.lctx.SequenceEmbedding(s)
				if v == nil {
					err = errors.New("llama: no pooled embedding (the model's pooling type is none)")
					break
				}
				out := append([]float32(nil), v...)
				if e.normalize {
					l2normalize(out)
				}
				res.Vectors = append(res.Vectors, out)
			}
		}
		e.lctx.Clear()
		if err != nil {
			return engine.EmbedResult{}, err
		}
	}
	return res, nil
}

func l2normalize(v []float32) {
	var n float64
	for _, x := range v {
		n += float64(x) * float64(x)
	}
	if n == 0 {
		return
	}
	inv := float32(1 / math.Sqrt(n))
	for i := range v {
		v[i] *= inv
	}
}

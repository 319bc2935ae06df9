package onnx

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/tokenizer"
)

// Model input and output names, as Hugging Face / Optimum export BERT-style
// encoders.
const (
	inputIDs      = "input_ids"
	attentionMask = "attention_mask"
	tokenTypeIDs  = "token_type_ids"
)

// defaultMaxTokens applies when a manifest sets no max_tokens;
// maxTokensLimit bounds what a manifest may set.
const (
	defaultMaxTokens = 512
	maxTokensLimit   = 1 << 16
)

// sequence is one tokenized input.
type sequence struct {
	ids   []int64
	types []int64 // token type ids, len(ids) of them
}

// embedder serves a text-embedding model on one ONNX Runtime session.
type embedder struct {
	id          string
	tok         textEncoder
	sess        *ort.DynamicAdvancedSession
	inputs      []string // session input order; token_type_ids only if the model has it
	sparse      bool     // inputs indices/values, output [batch, hidden] (see embed_sparse.go)
	hidden      int      // the model's vector length
	padID       int64
	meanPool    bool // false: CLS pooling
	normalize   bool
	maxTokens   int
	truncatable bool
	batcher     *batcher // queues inputs for the session; MaxBatch <= 1: no merging

	// life guards sess: runs hold it for reading, Close for writing.
	life   sync.RWMutex
	closed bool
}

// LoadEmbedder builds a text-embedding engine from spec: spec.Files["model"]
// is an ONNX encoder with inputs input_ids, attention_mask and optionally
// token_type_ids and a [batch, sequence, hidden] output (last_hidden_state);
// spec.Files["tokenizer"] is its Hugging Face tokenizer.json. Or, for the
// Universal Sentence Encoder lite, the model takes a sparse batch (inputs
// indices [N,2] and values [N]) and returns pooled [batch, hidden] vectors,
// and spec.Files["vocab"] is its SentencePiece vocabulary (see
// embed_sparse.go). Options:
// pooling (mean|cls, default mean), normalize (default true), max_tokens
// (default 512), dimensions (default: the model's hidden size) and
// truncatable_dimensions (default false). One session is created here and
// reused by every call; inputs from concurrent calls are merged into batches
// of up to Config.MaxBatch (see batcher).
func (r *Runtime) LoadEmbedder(spec engine.Spec) (engine.Embedder, error) {
	r, err := r.checkLoad(spec, engine.TaskEmbeddings)
	if err != nil {
		return nil, err
	}
	e, err := newEmbedderConfig(spec)
	if err != nil {
		return nil, fmt.Errorf("onnx: %s: %w", spec.ID, err)
	}
	if err := e.openSession(r, filepath.Join(spec.Dir, spec.Files["model"]), spec.Options["dimensions"]); err != nil {
		return nil, fmt.Errorf("onnx: %s: %w", spec.ID, err)
	}
	cfg := r.Config()
	wait := time.Duration(cfg.MaxWaitMicros) * time.Microsecond
	e.batcher = newBatcher(cfg.MaxBatch, wait, batchWorkers(r.EmbedThreads()), e.infer)
	return e, nil
}

// batchWorkers is how many batches run at once: enough single- or
// few-threaded runs to keep every core busy, or one run when ONNX Runtime
// sizes its own thread pool (intraOpThreads 0: one thread per core).
func batchWorkers(intraOpThreads int) int {
	if intraOpThreads <= 0 {
		return 1
	}
	return max(1, runtime.NumCPU()/intraOpThreads)
}

// newEmbedderConfig reads the tokenizer and the options.
func newEmbedderConfig(spec engine.Spec) (*embedder, error) {
	tok, err := loadTextEncoder(spec)
	if err != nil {
		return nil, err
	}
	e := &embedder{id: spec.ID, tok: tok, meanPool: true, normalize: true, maxTokens: defaultMaxTokens}
	if pad, ok := tok.TokenToID("[PAD]"); ok {
		e.padID = pad
	}
	opt := spec.Options
	switch opt["pooling"] {
	case "", "mean":
	case "cls":
		e.meanPool = false
	default:
		return nil, fmt.Errorf("option pooling %q: want mean or cls", opt["pooling"])
	}
	if e.normalize, err = boolOption(opt, "normalize", true); err != nil {
		return nil, err
	}
	if e.truncatable, err = boolOption(opt, "truncatable_dimensions", false); err != nil {
		return nil, err
	}
	// At least one real token besides the special ones.
	if e.maxTokens, err = IntOption(opt, "max_tokens", defaultMaxTokens, tok.SpecialTokens()+1, maxTokensLimit); err != nil {
		return nil, err
	}
	return e, nil
}

func boolOption(opt map[string]string, key string, def bool) (bool, error) {
	v, ok := opt[key]
	if !ok || v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("option %s %q: %w", key, v, err)
	}
	return b, nil
}

// openSession inspects the model's inputs and outputs and creates the session.
func (e *embedder) openSession(r *Runtime, path, dimsOption string) error {
	ins, outs, err := ReadSignature(path)
	if err != nil {
		return fmt.Errorf("read model %s: %w", path, err)
	}
	if isSparseSignature(ins) {
		return e.openSparseSession(r, path, ins, outs, dimsOption)
	}
	if _, ok := e.tok.(*tokenizer.Tokenizer); !ok {
		return fmt.Errorf("a piece vocabulary goes with a sparse (indices, values) model, not %s", path)
	}
	have := map[string]bool{}
	for _, in := range ins {
		switch in.Name {
		case inputIDs, attentionMask, tokenTypeIDs:
		default:
			return fmt.Errorf("model input %q is not supported (want %s, %s, optionally %s)", in.Name, inputIDs, attentionMask, tokenTypeIDs)
		}
		if in.DataType != ort.TensorElementDataTypeInt64 {
			return fmt.Errorf("model input %q is %s, want int64", in.Name, in.DataType)
		}
		have[in.Name] = true
	}
	if !have[inputIDs] || !have[attentionMask] {
		return fmt.Errorf("model needs inputs %s and %s", inputIDs, attentionMask)
	}
	e.inputs = []string{inputIDs, attentionMask}
	if have[tokenTypeIDs] {
		e.inputs = append(e.inputs, tokenTypeIDs)
	}
	out, err := pickOutput(outs)
	if err != nil {
		return err
	}
	if err := e.setHidden(out, 2, dimsOption); err != nil {
		return err
	}
	return e.createSession(r, path, out.Name)
}

// setHidden sets the vector length from dimension dim of out, or from the
// dimensions option where the model leaves it dynamic.
func (e *embedder) setHidden(out ort.InputOutputInfo, dim int, dimsOption string) error {
	e.hidden = int(out.Dimensions[dim])
	if dimsOption != "" {
		d, err := strconv.Atoi(dimsOption)
		if err != nil || d <= 0 {
			return fmt.Errorf("option dimensions %q: want a positive integer", dimsOption)
		}
		if e.hidden > 0 && d != e.hidden {
			return fmt.Errorf("option dimensions %d, but the model's %s has %d", d, out.Name, e.hidden)
		}
		e.hidden = d
	}
	if e.hidden <= 0 {
		return fmt.Errorf("the model's hidden size is dynamic; set option dimensions")
	}
	return nil
}

// createSession opens the session on e.inputs and the output named out.
func (e *embedder) createSession(r *Runtime, path, out string) error {
	opts, err := r.sessionOptions(r.EmbedThreads())
	if err != nil {
		return err
	}
	defer opts.Destroy()
	e.sess, err = ort.NewDynamicAdvancedSession(path, e.inputs, []string{out}, opts)
	if err != nil {
		return fmt.Errorf("create session: %w", err)
	}
	return nil
}

// pickOutput prefers last_hidden_state, then token_embeddings, then the
// first float output of rank 3.
func pickOutput(outs []ort.InputOutputInfo) (ort.InputOutputInfo, error) {
	rank3 := func(o ort.InputOutputInfo) bool {
		return o.OrtValueType == ort.ONNXTypeTensor && o.DataType == ort.TensorElementDataTypeFloat && len(o.Dimensions) == 3
	}
	for _, name := range []string{"last_hidden_state", "token_embeddings"} {
		for _, o := range outs {
			if o.Name == name && rank3(o) {
				return o, nil
			}
		}
	}
	for _, o := range outs {
		if rank3(o) {
			return o, nil
		}
	}
	return ort.InputOutputInfo{}, fmt.Errorf("model has no float [batch, sequence, hidden] output")
}

// ID returns the model id.
func (e *embedder) ID() string { return e.id }

// MaxDimensions is the model's vector length.
func (e *embedder) MaxDimensions() int { return e.hidden }

// TruncatableDimensions reports whether shorter vectors may be asked for.
func (e *embedder) TruncatableDimensions() bool { return e.truncatable }

// Close stops the batcher, waits for running inferences and frees the session.
func (e *embedder) Close() error {
	e.batcher.close()
	e.life.Lock()
	defer e.life.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	return e.sess.Destroy()
}

// Embed tokenizes (or validates) the inputs, runs them through the model,
// possibly merged with other calls' inputs, and pools, normalises and
// truncates the vectors.
func (e *embedder) Embed(ctx context.Context, req engine.EmbedRequest) (engine.EmbedResult, error) {
	dims, err := e.checkDimensions(req.Dimensions)
	if err != nil {
		return engine.EmbedResult{}, err
	}
	var seqs []sequence
	vecs, err := e.batcher.embed(ctx, func() (s []sequence, err error) {
		seqs, err = e.sequences(req)
		return seqs, err
	})
	if err != nil {
		return engine.EmbedResult{}, err
	}
	res := engine.EmbedResult{Vectors: vecs}
	for i, v := range vecs {
		res.PromptTokens += len(seqs[i].ids)
		v = v[:dims]
		if e.normalize {
			l2normalize(v)
		}
		vecs[i] = v
	}
	return res, nil
}

func (e *embedder) checkDimensions(d int) (int, error) {
	switch {
	case d == 0 || d == e.hidden:
		return e.hidden, nil
	case d < 0 || d > e.hidden:
		return 0, &engine.InputError{Param: "dimensions", Msg: fmt.Sprintf("dimensions must be between 1 and %d for model %s", e.hidden, e.id)}
	case !e.truncatable:
		return 0, &engine.InputError{Param: "dimensions", Msg: fmt.Sprintf("model %s does not support shortened dimensions; only %d is allowed", e.id, e.hidden)}
	}
	return d, nil
}

// sequences tokenizes texts or checks token arrays, truncating both to maxTokens.
func (e *embedder) sequences(req engine.EmbedRequest) ([]sequence, error) {
	switch {
	case len(req.Texts) > 0 && len(req.Tokens) > 0:
		return nil, &engine.InputError{Param: "input", Msg: "input must be either texts or token arrays, not both"}
	case len(req.Texts) == 0 && len(req.Tokens) == 0:
		return nil, &engine.InputError{Param: "input", Msg: "input must not be empty"}
	}
	seqs := make([]sequence, 0, len(req.Texts)+len(req.Tokens))
	for i, text := range req.Texts {
		enc, err := e.tok.Encode(text, e.maxTokens)
		if errors.Is(err, tokenizer.ErrInputTooLarge) {
			return nil, &engine.InputError{Param: "input", Msg: fmt.Sprintf("input[%d]: %v", i, err)}
		}
		if err != nil {
			return nil, fmt.Errorf("onnx: %s: tokenize input[%d]: %w", e.id, i, err)
		}
		if len(enc.IDs) == 0 && e.sparse {
			// The sparse batch has no row for a text without pieces.
			return nil, &engine.InputError{Param: "input", Msg: fmt.Sprintf("input[%d]: text is empty", i)}
		}
		seqs = append(seqs, sequence{ids: enc.IDs, types: enc.TypeIDs})
	}
	vocab := int64(e.tok.VocabSize())
	for i, ids := range req.Tokens {
		if len(ids) == 0 {
			return nil, &engine.InputError{Param: "input", Msg: fmt.Sprintf("input[%d]: token array is empty", i)}
		}
		ids = ids[:min(len(ids), e.maxTokens)]
		for j, id := range ids {
			if id < 0 || id >= vocab {
				return nil, &engine.InputError{Param: "input", Msg: fmt.Sprintf("input[%d][%d]: token id %d is outside the vocabulary [0, %d)", i, j, id, vocab)}
			}
		}
		seqs = append(seqs, sequence{ids: ids, types: make([]int64, len(ids))})
	}
	return seqs, nil
}

// infer runs seqs as one padded batch and returns one pooled vector (not
// normalised) per sequence.
func (e *embedder) infer(seqs []sequence) ([][]float32, error) {
	if e.sparse {
		return e.inferSparse(seqs)
	}
	n, s := len(seqs), 0
	for _, q := range seqs {
		s = max(s, len(q.ids))
	}
	ids := make([]int64, n*s)
	mask := make([]int64, n*s)
	var types []int64
	if len(e.inputs) == 3 {
		types = make([]int64, n*s)
	}
	for i, q := range seqs {
		row := i * s
		copy(ids[row:], q.ids)
		for j := len(q.ids); j < s; j++ {
			ids[row+j] = e.padID
		}
		for j := range q.ids {
			mask[row+j] = 1
		}
		if types != nil {
			copy(types[row:], q.types)
		}
	}
	shape := ort.NewShape(int64(n), int64(s))
	inputs := make([]ort.Value, 0, 3)
	defer func() {
		for _, v := range inputs {
			v.Destroy()
		}
	}()
	for _, data := range [][]int64{ids, mask, types}[:len(e.inputs)] {
		t, err := ort.NewTensor(shape, data)
		if err != nil {
			return nil, fmt.Errorf("onnx: %s: input tensor: %w", e.id, err)
		}
		inputs = append(inputs, t)
	}
	hidden := make([]float32, n*s*e.hidden)
	out, err := ort.NewTensor(ort.NewShape(int64(n), int64(s), int64(e.hidden)), hidden)
	if err != nil {
		return nil, fmt.Errorf("onnx: %s: output tensor: %w", e.id, err)
	}
	defer out.Destroy()
	if err := e.run(inputs, out); err != nil {
		return nil, err
	}
	return e.pool(seqs, s, hidden), nil
}

func (e *embedder) run(inputs []ort.Value, out ort.Value) error {
	e.life.RLock()
	defer e.life.RUnlock()
	if e.closed {
		return errEngineClosed
	}
	if err := e.sess.Run(inputs, []ort.Value{out}); err != nil {
		return fmt.Errorf("onnx: %s: run: %w", e.id, err)
	}
	return nil
}

// pool reduces [n, s, hidden] states to one vector per sequence, over the
// sequence's real tokens only.
func (e *embedder) pool(seqs []sequence, s int, hidden []float32) [][]float32 {
	h := e.hidden
	vecs := make([][]float32, len(seqs))
	for i, q := range seqs {
		v := make([]float32, h)
		base := i * s * h
		if !e.meanPool {
			copy(v, hidden[base:base+h])
			vecs[i] = v
			continue
		}
		for j := range q.ids {
			row := hidden[base+j*h : base+(j+1)*h]
			for k, x := range row {
				v[k] += x
			}
		}
		inv := 1 / float32(len(q.ids))
		for k := range v {
			v[k] *= inv
		}
		vecs[i] = v
	}
	return vecs
}

// l2normalize scales v to unit length (a zero vector stays zero).
func l2normalize(v []float32) {
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	if sum == 0 {
		return
	}
	inv := float32(1 / math.Sqrt(sum))
	for i := range v {
		v[i] *= inv
	}
}

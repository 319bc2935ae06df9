package whisper

import (
	"context"
	"fmt"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine/onnx"
)

// slot owns everything one transcription needs between model runs.
//
// KV cache: each decoding attempt's first run (use_cache_branch false) takes
// the whole initial sequence (prompt, SOT, language, task) and computes the
// cross-attention keys and values into encKV; the following one-token runs
// take the cached branch. The decoder's self-attention cache lives in
// two Go buffers per layer and kind, sized for max_target_positions: a run
// reads the past from cur and the model writes past plus the new positions
// into next, then they swap (as the chat decoder does). Outputs are bound
// through an IoBinding so a cached run returns only the logits, the decoder
// KV and, when word timestamps are asked, the alignment layers'
// cross-attention: the unchanged encoder KV is not copied out every step.
type slot struct {
	e      *Engine
	mel    []float32 // [nMels, 3000]
	hidden []float32 // encoder output [1500, d]
	melT   *ort.Tensor[float32]
	hidT   *ort.Tensor[float32]
	encRun *ort.RunOptions

	encKV  [][]float32            // per layer and kind, [heads, 1500, headDim]
	encKVT []*ort.Tensor[float32] // wrapping encKV
	cur    [][]float32            // decoder KV, the past
	next   [][]float32            // decoder KV, receives the present
	past   int                    // positions in cur
	logits []float32              // [promptChunk, vocab]
	ids    []int64                // [promptChunk]
	bind   *ort.IoBinding
	temps  []ort.Value // tensors of the current run
}

func (e *Engine) newSlot() (*slot, error) {
	c := e.cfg
	s := &slot{
		e:      e,
		mel:    make([]float32, c.nMels*nFrames),
		hidden: make([]float32, c.encPos*c.dModel),
		logits: make([]float32, 4*c.vocab), // grows for long prompts
		ids:    make([]int64, 4),
	}
	var err error
	fail := func(what string, err error) (*slot, error) {
		s.destroy()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if s.melT, err = ort.NewTensor(ort.NewShape(1, int64(c.nMels), nFrames), s.mel); err != nil {
		return fail("mel tensor", err)
	}
	if s.hidT, err = ort.NewTensor(ort.NewShape(1, int64(c.encPos), int64(c.dModel)), s.hidden); err != nil {
		return fail("encoder output tensor", err)
	}
	if s.encRun, err = ort.NewRunOptions(); err != nil {
		return fail("run options", err)
	}
	encShape := ort.NewShape(1, int64(c.heads), int64(c.encPos), int64(c.headDim))
	per := c.heads * c.maxTarget * c.headDim
	for range 2 * c.layers {
		buf := make([]float32, c.heads*c.encPos*c.headDim)
		t, err := ort.NewTensor(encShape, buf)
		if err != nil {
			return fail("encoder KV tensor", err)
		}
		s.encKV = append(s.encKV, buf)
		s.encKVT = append(s.encKVT, t)
		s.cur = append(s.cur, make([]float32, per))
		s.next = append(s.next, make([]float32, per))
	}
	if s.bind, err = e.dec.CreateIoBinding(); err != nil {
		return fail("io binding", err)
	}
	return s, nil
}

func (s *slot) destroy() {
	for _, v := range []interface{ Destroy() error }{s.melT, s.hidT} {
		if v != nil {
			v.Destroy()
		}
	}
	for _, t := range s.encKVT {
		t.Destroy()
	}
	if s.encRun != nil {
		s.encRun.Destroy()
	}
	if s.bind != nil {
		s.bind.Destroy()
	}
}

// encode runs the encoder on s.mel into s.hidden. ctx's cancellation stops
// the run between graph nodes.
func (s *slot) encode(ctx context.Context) error {
	e := s.e
	e.life.RLock()
	defer e.life.RUnlock()
	if e.closed {
		return errClosed
	}
	err := onnx.RunCancellable(ctx, s.encRun, func() error {
		return e.enc.RunWithOptions([]ort.Value{s.melT}, []ort.Value{s.hidT}, s.encRun)
	})
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("whisper: %s: encoder: %w", e.id, err)
	}
	return nil
}

// prime runs the decoder on [sot] alone and returns the logits after SOT
// (language detection).
func (s *slot) prime(ctx context.Context) ([]float32, error) {
	return s.start(ctx, []int64{int64(s.e.cfg.sot)}, nil)
}

// start runs a whole initial sequence on the no-cache branch (see step)
// and returns the logits of its last position, valid until the next run.
// When cross is non-nil, the alignment layers' cross-attention of every
// position is appended to it: cross[i] grows by heads*len(ids)*1500
// floats, laid out [position][head][1500].
func (s *slot) start(ctx context.Context, ids []int64, cross [][]float32) ([]float32, error) {
	s.past = 0
	return s.step(ctx, ids, true, cross)
}

// rowLogits returns the logits of position i of the last run.
func (s *slot) rowLogits(i int) []float32 {
	v := s.e.cfg.vocab
	return s.logits[i*v : (i+1)*v]
}

// step is one decoder run over ids. With first set it takes the no-cache
// branch, which starts from an empty cache and also writes the encoder KV.
//
// A run of several ids must take the no-cache branch: the export's cached
// branch was traced with one new token and has no causal mask, so several
// ids fed on top of a cache would see each other's future.
func (s *slot) step(ctx context.Context, ids []int64, first bool, cross [][]float32) ([]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e, c := s.e, s.e.cfg
	n, total := len(ids), s.past+len(ids)
	if total > c.maxTarget {
		return nil, fmt.Errorf("whisper: %s: %d decoder positions exceed %d", e.id, total, c.maxTarget)
	}
	if len(s.ids) < n {
		s.ids = make([]int64, n)
	}
	if len(s.logits) < n*c.vocab {
		s.logits = make([]float32, n*c.vocab)
	}
	copy(s.ids, ids)
	defer func() {
		for _, v := range s.temps {
			v.Destroy()
		}
		s.temps = s.temps[:0]
		s.bind.ClearBoundInputs()
		s.bind.ClearBoundOutputs()
	}()
	var ferr error
	tensor := func(v ort.Value, err error) ort.Value {
		if err != nil && ferr == nil {
			ferr = err
		}
		if err == nil {
			s.temps = append(s.temps, v)
		}
		return v
	}
	bindIn := func(name string, v ort.Value) {
		if ferr == nil && v != nil {
			ferr = s.bind.BindInput(name, v)
		}
	}
	bindOut := func(name string, v ort.Value) {
		if ferr == nil && v != nil {
			ferr = s.bind.BindOutput(name, v)
		}
	}
	bindIn("input_ids", tensor(ort.NewTensor(ort.NewShape(1, int64(n)), s.ids[:n])))
	bindIn("encoder_hidden_states", s.hidT)
	bindIn("use_cache_branch", tensor(ort.NewTensor(ort.NewShape(1), []bool{!first})))
	pastShape := ort.NewShape(1, int64(c.heads), int64(s.past), int64(c.headDim))
	presShape := ort.NewShape(1, int64(c.heads), int64(total), int64(c.headDim))
	emptyEnc := ort.NewShape(1, int64(c.heads), 0, int64(c.headDim))
	for i := range s.cur {
		bindIn(e.names.pastDec[i], tensor(ort.NewTensor(pastShape, s.cur[i])))
		bindOut(e.names.presDec[i], tensor(ort.NewTensor(presShape, s.next[i])))
		if first {
			bindIn(e.names.pastEnc[i], tensor(ort.NewTensor(emptyEnc, s.encKV[i])))
			bindOut(e.names.presEnc[i], s.encKVT[i])
		} else {
			bindIn(e.names.pastEnc[i], s.encKVT[i])
		}
	}
	bindOut("logits", tensor(ort.NewTensor(ort.NewShape(1, int64(n), int64(c.vocab)), s.logits)))
	var crossBufs [][]float32
	if cross != nil {
		per := c.heads * n * c.encPos
		for _, name := range e.names.cross {
			buf := make([]float32, per)
			crossBufs = append(crossBufs, buf)
			bindOut(name, tensor(ort.NewTensor(ort.NewShape(1, int64(c.heads), int64(n), int64(c.encPos)), buf)))
		}
	}
	if ferr != nil {
		return nil, fmt.Errorf("whisper: %s: decoder tensors: %w", e.id, ferr)
	}
	if err := s.run(); err != nil {
		return nil, err
	}
	s.cur, s.next = s.next, s.cur
	s.past = total
	for i, buf := range crossBufs {
		// [head][pos][1500] -> append as [pos][head][1500]
		for p := range n {
			for h := range c.heads {
				off := (h*n + p) * c.encPos
				cross[i] = append(cross[i], buf[off:off+c.encPos]...)
			}
		}
	}
	return s.rowLogits(n - 1), nil
}

// run executes the bound decoder run unless the engine is closed.
func (s *slot) run() error {
	e := s.e
	e.life.RLock()
	defer e.life.RUnlock()
	if e.closed {
		return errClosed
	}
	if err := e.dec.RunWithBinding(s.bind); err != nil {
		return fmt.Errorf("whisper: %s: decoder: %w", e.id, err)
	}
	return nil
}

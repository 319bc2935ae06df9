package onnx

import (
	"context"
	"fmt"

	ort "github.com/yalue/onnxruntime_go"
)

// kvStream is one sequence's own KV cache and the buffers the session
// reads and writes: the scheduler prefills a prompt on one (in chunks,
// interleaved with the batch's decode steps) before the sequence joins the
// batch (see batchKV); tests use one alone as the unbatched reference. The cache lives in two Go buffers per
// layer and kind, sized once for the whole request: a step reads the past
// from one (past_key_values.N.*) and the model writes past plus the new
// positions into the other (present.N.*), then they swap. So nothing is
// copied besides what the model's own Concat does, and nothing is
// allocated per step but the small tensor headers.
type kvStream struct {
	d      *decoder
	past   int         // positions in the cache
	cur    [][]float32 // per layer and kind: the past, [kvHeads, past, headDim]
	next   [][]float32 // per layer and kind: receives the present
	logits []float32   // [chunk, vocabRows]
	mask   []int64     // all ones, one per position
	ids    []int64
	pos    []int64
	chunk  int // most positions per run (bounds the prompt's logits)
	opts   *ort.RunOptions
	values []ort.Value // scratch: the run's inputs then outputs
}

// newStream allocates the buffers for up to total positions; a run takes
// at most the decoder's prefill chunk.
func (d *decoder) newStream(total int) (*kvStream, error) {
	chunk := max(1, min(d.chunk, total))
	kv := &kvStream{
		d:      d,
		cur:    make([][]float32, 2*d.layers),
		next:   make([][]float32, 2*d.layers),
		logits: make([]float32, chunk*d.vocabRows),
		mask:   make([]int64, total),
		ids:    make([]int64, chunk),
		pos:    make([]int64, chunk),
		chunk:  chunk,
	}
	per := d.kvHeads * total * d.headDim
	for i := range kv.cur {
		kv.cur[i] = make([]float32, per)
		kv.next[i] = make([]float32, per)
	}
	for i := range kv.mask {
		kv.mask[i] = 1
	}
	opts, err := ort.NewRunOptions()
	if err != nil {
		return nil, fmt.Errorf("onnx: %s: run options: %w", d.id, err)
	}
	kv.opts = opts
	return kv, nil
}

func (kv *kvStream) close() {
	if kv.opts != nil {
		kv.opts.Destroy()
		kv.opts = nil
	}
}

// Forward feeds ids (the prompt in chunks, then one token at a time) and
// returns the logits of the last position. The slice is valid until the
// next call.
func (kv *kvStream) Forward(ctx context.Context, ids []int64) ([]float32, error) {
	if len(ids) == 0 {
		return nil, fmt.Errorf("onnx: %s: nothing to run", kv.d.id)
	}
	if kv.past+len(ids) > len(kv.mask) {
		return nil, fmt.Errorf("onnx: %s: %d positions exceed the %d planned", kv.d.id, kv.past+len(ids), len(kv.mask))
	}
	var last []float32
	for len(ids) > 0 {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n := min(len(ids), kv.chunk)
		var err error
		if last, err = kv.run(ids[:n]); err != nil {
			return nil, err
		}
		ids = ids[n:]
	}
	return last, nil
}

// run executes one session run over ids.
func (kv *kvStream) run(ids []int64) ([]float32, error) {
	d := kv.d
	s, total := len(ids), kv.past+len(ids)
	copy(kv.ids, ids)
	for i := range s {
		kv.pos[i] = int64(kv.past + i)
	}
	defer func() {
		for _, v := range kv.values {
			if v != nil {
				v.Destroy()
			}
		}
		kv.values = kv.values[:0]
	}()
	add := func(v ort.Value, err error) error {
		if err != nil {
			return fmt.Errorf("onnx: %s: tensor: %w", d.id, err)
		}
		kv.values = append(kv.values, v)
		return nil
	}
	row := ort.NewShape(1, int64(s))
	if err := add(ort.NewTensor(row, kv.ids[:s])); err != nil {
		return nil, err
	}
	if err := add(ort.NewTensor(ort.NewShape(1, int64(total)), kv.mask[:total])); err != nil {
		return nil, err
	}
	if d.positions {
		if err := add(ort.NewTensor(row, kv.pos[:s])); err != nil {
			return nil, err
		}
	}
	if d.branch {
		if err := add(ort.NewTensor(ort.NewShape(1), []bool{kv.past > 0})); err != nil {
			return nil, err
		}
	}
	pastShape := ort.NewShape(1, int64(d.kvHeads), int64(kv.past), int64(d.headDim))
	for _, buf := range kv.cur {
		if err := add(ort.NewTensor(pastShape, buf)); err != nil {
			return nil, err
		}
	}
	nIn := len(kv.values)
	if err := add(ort.NewTensor(ort.NewShape(1, int64(s), int64(d.vocabRows)), kv.logits)); err != nil {
		return nil, err
	}
	presentShape := ort.NewShape(1, int64(d.kvHeads), int64(total), int64(d.headDim))
	for _, buf := range kv.next {
		if err := add(ort.NewTensor(presentShape, buf)); err != nil {
			return nil, err
		}
	}
	if err := d.exec(kv.values[:nIn], kv.values[nIn:], kv.opts); err != nil {
		return nil, err
	}
	kv.cur, kv.next = kv.next, kv.cur
	kv.past = total
	return kv.logits[(s-1)*d.vocabRows : s*d.vocabRows], nil
}

// exec runs the session with opts unless the engine is closed.
func (d *decoder) exec(in, out []ort.Value, opts *ort.RunOptions) error {
	d.life.RLock()
	defer d.life.RUnlock()
	if d.closed {
		return errEngineClosed
	}
	if err := d.sess.RunWithOptions(in, out, opts); err != nil {
		return fmt.Errorf("onnx: %s: run: %w", d.id, err)
	}
	return nil
}

// preload fills an empty stream with the cached blocks of a prompt's
// prefix (each per layer-kind [kvHeads, block, headDim]), so the next run
// continues after them.
func (kv *kvStream) preload(chain []*prefixBlock, block int) {
	d := kv.d
	past, hd := len(chain)*block, d.headDim
	for i, buf := range kv.cur {
		for h := range d.kvHeads {
			for c, b := range chain {
				at := (h*past + c*block) * hd
				copy(buf[at:at+block*hd], b.kv[i][h*block*hd:(h+1)*block*hd])
			}
		}
	}
	kv.past = past
}

// plane returns layer-kind i's head h of the cache as [past, headDim].
func (kv *kvStream) plane(i, h int) []float32 {
	n := kv.past * kv.d.headDim
	return kv.cur[i][h*n : (h+1)*n]
}

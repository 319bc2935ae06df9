package onnx

import (
	"fmt"

	ort "github.com/yalue/onnxruntime_go"
)

// batchKV is the key/value cache of the sequences that decode together,
// and the buffers of their shared decode step.
//
// Layout. Per layer and kind the cache is one float32 buffer holding the
// tensor past_key_values.N.* of shape [rows, kvHeads, span, headDim],
// row-major, so each row (sequence) is one contiguous block of
// kvHeads*span*headDim floats. All rows share the column count span;
// a row's own positions are its last columns [start, span) — the rows are
// aligned on the right (left padding) — and the columns before start are
// masked out by attention_mask (and zeroed, so nothing but finite numbers
// meets the mask). A decode step appends one column to every row: input_ids
// [rows, 1] (each row's last sampled token), position_ids [rows, 1] (each
// row's own length, so rotary positions ignore the padding), attention_mask
// [rows, span+1] (0 before start, 1 after); the graph writes present
// [rows, kvHeads, span+1, headDim] into the second buffer of the pair, and
// the two swap. This needs a graph that masks keys with attention_mask
// (the standard Optimum / onnx-community exports do); graphs that read
// sequence lengths from the mask's sum (GroupQueryAttention) would misread
// the padding, so they must run with max_batch 1, which never pads.
//
// Copy cost. Each step the graph's own Concat copies the whole cache once
// (past into present): rows*span*headDim*kvHeads floats per layer and kind.
// Nothing else is copied while the batch composition stays the same. A
// sequence joining copies only its own cache in (into a new last row, after
// its prefill ran on a cache of its own); one leaving costs one row copy
// (the last row moves into its place). Two operations move every row once
// — the cost of one step's Concat — and are rare: widening, when a joining
// prompt is longer than span (every row gains left padding), and
// compaction, when the rows that leave free at least a quarter of the
// columns on the left (every row shifts left). Growing the buffers also
// copies once; they grow by half again what is needed.
//
// The scheduler changes rows (join, remove) holding its mutex, since
// requests read them to see whether the batch is ready.
type batchKV struct {
	d      *decoder
	rows   []*seq
	span   int         // columns of the past
	cur    [][]float32 // per layer-kind: the past [rows, kvHeads, span, headDim]
	next   [][]float32 // per layer-kind: receives the present
	ids    []int64
	pos    []int64
	mask   []int64
	logits []float32 // [rows, vocabRows]
	values []ort.Value
	opts   *ort.RunOptions
}

// newBatchKV builds an empty batch with its run options.
func newBatchKV(d *decoder) (*batchKV, error) {
	opts, err := ort.NewRunOptions()
	if err != nil {
		return nil, fmt.Errorf("onnx: %s: run options: %w", d.id, err)
	}
	return &batchKV{d: d, opts: opts}, nil
}

// close frees the run options and drops the buffers.
func (b *batchKV) close() {
	if b.opts != nil {
		b.opts.Destroy()
		b.opts = nil
	}
	b.cur, b.next = nil, nil
}

// rowFloats is the size of one row of one layer-kind at span columns.
func (b *batchKV) rowFloats(span int) int { return b.d.kvHeads * span * b.d.headDim }

// bytes is the memory the cache buffers hold.
func (b *batchKV) bytes() int64 {
	if len(b.cur) == 0 {
		return 0
	}
	return int64(len(b.cur)) * 2 * int64(cap(b.cur[0])) * 4
}

// ensure makes room for rows rows of span columns, keeping the current
// past.
func (b *batchKV) ensure(rows, span int) {
	need := rows * b.rowFloats(span)
	if len(b.cur) > 0 && cap(b.cur[0]) >= need {
		return
	}
	planes := 2 * b.d.layers
	size := need + need/2
	used := len(b.rows) * b.rowFloats(b.span)
	cur, next := make([][]float32, planes), make([][]float32, planes)
	for i := range planes {
		cur[i], next[i] = make([]float32, size), make([]float32, size)
		if len(b.cur) > 0 {
			copy(cur[i], b.cur[i][:used])
		}
	}
	b.cur, b.next = cur, next
}

// release drops the buffers of an empty batch.
func (b *batchKV) release() {
	b.cur, b.next, b.span = nil, nil, 0
	b.logits = nil
}

// widen gives every row span-b.span more columns of left padding, moving
// each row in place (last first, so nothing is overwritten before it moves).
func (b *batchKV) widen(span int) {
	grow := span - b.span
	if grow <= 0 {
		return
	}
	b.ensure(len(b.rows), span)
	hd, old := b.d.headDim, b.span
	for _, buf := range b.cur {
		for k := len(b.rows)*b.d.kvHeads - 1; k >= 0; k-- {
			dst := (k*span + grow) * hd
			copy(buf[dst:dst+old*hd], buf[k*old*hd:(k+1)*old*hd])
			clear(buf[k*span*hd : dst])
		}
	}
	for _, q := range b.rows {
		q.start += grow
	}
	b.span = span
}

// compact drops the leftmost columns that no row uses when they are at
// least a quarter of the span, moving each row in place (first first).
func (b *batchKV) compact() {
	if len(b.rows) == 0 {
		b.release()
		return
	}
	cut := b.span
	for _, q := range b.rows {
		cut = min(cut, q.start)
	}
	if cut == 0 || cut*4 < b.span {
		return
	}
	hd, old, span := b.d.headDim, b.span, b.span-cut
	for _, buf := range b.cur {
		for k := range len(b.rows) * b.d.kvHeads {
			src := (k*old + cut) * hd
			copy(buf[k*span*hd:(k+1)*span*hd], buf[src:src+span*hd])
		}
	}
	for _, q := range b.rows {
		q.start -= cut
	}
	b.span = span
}

// join appends q as the last row, copying its prefilled cache in from kv
// ([1, kvHeads, kv.past, headDim] per layer-kind).
func (b *batchKV) join(q *seq, kv *kvStream) {
	p := kv.past
	if len(b.rows) == 0 {
		b.span = p
	} else if p > b.span {
		b.widen(p)
	}
	b.ensure(len(b.rows)+1, b.span)
	r := len(b.rows)
	hd, span := b.d.headDim, b.span
	pad := span - p
	for i, buf := range b.cur {
		src := kv.cur[i]
		for h := range b.d.kvHeads {
			at := ((r*b.d.kvHeads + h) * span) * hd
			clear(buf[at : at+pad*hd])
			copy(buf[at+pad*hd:at+span*hd], src[h*p*hd:(h+1)*p*hd])
		}
	}
	q.start = pad
	b.rows = append(b.rows, q)
}

// plane returns row r's keys or values (layer-kind i) of head h as
// [length, headDim], its own positions only.
func (b *batchKV) plane(r, i, h int) []float32 {
	hd, span := b.d.headDim, b.span
	at := (r*b.d.kvHeads + h) * span
	return b.cur[i][(at+b.rows[r].start)*hd : (at+span)*hd]
}

// remove drops row r: the last row moves into its place.
func (b *batchKV) remove(r int) {
	last := len(b.rows) - 1
	if r != last {
		n := b.rowFloats(b.span)
		for _, buf := range b.cur {
			copy(buf[r*n:(r+1)*n], buf[last*n:(last+1)*n])
		}
		b.rows[r] = b.rows[last]
	}
	b.rows[last] = nil
	b.rows = b.rows[:last]
}

// step runs one decode step: tokens[r] is row r's next input. It returns
// the logits [rows, vocabRows], valid until the next step.
func (b *batchKV) step(tokens []int64) ([]float32, error) {
	d := b.d
	rows, span := len(b.rows), b.span
	total := span + 1
	b.ensure(rows, total)
	b.ids = append(b.ids[:0], tokens...)
	b.pos = b.pos[:0]
	b.mask = b.mask[:0]
	for _, q := range b.rows {
		b.pos = append(b.pos, int64(span-q.start))
		for c := range total {
			var m int64
			if c >= q.start {
				m = 1
			}
			b.mask = append(b.mask, m)
		}
	}
	if need := rows * d.vocabRows; cap(b.logits) < need {
		b.logits = make([]float32, need)
	}
	defer func() {
		for _, v := range b.values {
			if v != nil {
				v.Destroy()
			}
		}
		b.values = b.values[:0]
	}()
	add := func(v ort.Value, err error) error {
		if err != nil {
			return fmt.Errorf("onnx: %s: tensor: %w", d.id, err)
		}
		b.values = append(b.values, v)
		return nil
	}
	col := ort.NewShape(int64(rows), 1)
	if err := add(ort.NewTensor(col, b.ids)); err != nil {
		return nil, err
	}
	if err := add(ort.NewTensor(ort.NewShape(int64(rows), int64(total)), b.mask)); err != nil {
		return nil, err
	}
	if d.positions {
		if err := add(ort.NewTensor(col, b.pos)); err != nil {
			return nil, err
		}
	}
	if d.branch {
		if err := add(ort.NewTensor(ort.NewShape(1), []bool{true})); err != nil {
			return nil, err
		}
	}
	pastShape := ort.NewShape(int64(rows), int64(d.kvHeads), int64(span), int64(d.headDim))
	n := rows * b.rowFloats(span)
	for _, buf := range b.cur {
		if err := add(ort.NewTensor(pastShape, buf[:n])); err != nil {
			return nil, err
		}
	}
	nIn := len(b.values)
	logits := b.logits[:rows*d.vocabRows]
	if err := add(ort.NewTensor(ort.NewShape(int64(rows), 1, int64(d.vocabRows)), logits)); err != nil {
		return nil, err
	}
	presentShape := ort.NewShape(int64(rows), int64(d.kvHeads), int64(total), int64(d.headDim))
	n = rows * b.rowFloats(total)
	for _, buf := range b.next {
		if err := add(ort.NewTensor(presentShape, buf[:n])); err != nil {
			return nil, err
		}
	}
	if err := d.exec(b.values[:nIn], b.values[nIn:], b.opts); err != nil {
		return nil, err
	}
	b.cur, b.next = b.next, b.cur
	b.span = total
	return logits, nil
}

package onnx

import (
	"context"
	"slices"
	"sync"
	"time"
)

// groupOverheadTokens is the fixed cost of one session run expressed in
// padded tokens (about 45 µs of run overhead against 9 µs per token on
// tiny-bert; relatively less for larger models). The batcher splits a
// length-sorted batch into runs so that the sum over runs of (overhead +
// rows * longest row) is smallest: a long input no longer pads every short
// one to its length, while inputs of similar length still share a run.
const groupOverheadTokens = 8

// batcher queues the inputs of Embed calls and runs them on a fixed number
// of workers, merging the inputs of concurrent calls into shared session
// runs of up to maxBatch rows.
//
// A free worker takes what is queued at once, unless more input is on its
// way (a call is still tokenizing) and the batch is not yet full; then it
// waits for it, at most until the oldest input has waited maxWait. So a
// lone call is never held back, while under load inputs pile up behind the
// running batches and the next batches grow by themselves. With maxBatch 1
// this is a plain FIFO queue in front of the workers: no batching.
type batcher struct {
	maxBatch int
	maxWait  time.Duration
	run      func([]sequence) ([][]float32, error)

	mu       sync.Mutex
	queue    []*item // oldest first
	arriving int     // calls between embed's start and their enqueueing
	closed   bool

	sizes batchSizeCounts // batches taken, by size; guarded by mu

	wake    chan struct{}  // capacity 1: the queue or arriving changed
	quit    chan struct{}  // closed by close
	workers sync.WaitGroup // the worker goroutines
}

// call is one Embed call waiting for its vectors. Its fields other than ctx
// and done are guarded by batcher.mu.
type call struct {
	ctx      context.Context
	vecs     [][]float32
	pending  int
	err      error
	finished bool
	done     chan struct{} // closed once vecs or err is final
}

// item is one input of a call.
type item struct {
	c   *call
	idx int
	seq sequence
	at  time.Time // when it was queued
}

// newBatcher starts workers (at least one) goroutines feeding run.
// maxBatch below 1 counts as 1.
func newBatcher(maxBatch int, maxWait time.Duration, workers int, run func([]sequence) ([][]float32, error)) *batcher {
	b := &batcher{
		maxBatch: max(1, maxBatch),
		maxWait:  maxWait,
		run:      run,
		wake:     make(chan struct{}, 1),
		quit:     make(chan struct{}),
	}
	for range max(1, workers) {
		b.workers.Go(b.loop)
	}
	return b
}

// embed calls prepare (tokenization) while announcing the call as arriving,
// queues the sequences it returns and waits for their vectors, or for ctx
// to end.
func (b *batcher) embed(ctx context.Context, prepare func() ([]sequence, error)) ([][]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, errEngineClosed
	}
	b.arriving++
	b.mu.Unlock()

	seqs, err := prepare()

	b.mu.Lock()
	b.arriving--
	var c *call
	switch {
	case b.closed:
		err = errEngineClosed
	case err == nil:
		c = &call{ctx: ctx, vecs: make([][]float32, len(seqs)), pending: len(seqs), done: make(chan struct{})}
		now := time.Now()
		for i, s := range seqs {
			b.queue = append(b.queue, &item{c: c, idx: i, seq: s, at: now})
		}
	}
	b.mu.Unlock()
	b.signal() // the queue grew, or one fewer call is arriving
	if err != nil {
		return nil, err
	}
	select {
	case <-c.done:
		return c.vecs, c.err
	case <-ctx.Done():
		// A worker drops this call's queued inputs when it next looks.
		return nil, ctx.Err()
	}
}

// signal wakes a waiting worker, if any.
func (b *batcher) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// close stops the workers after their current runs and waits for them to
// exit; queued calls fail.
func (b *batcher) close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.quit)
	}
	b.mu.Unlock()
	b.workers.Wait()
}

func (b *batcher) loop() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		batch, ok := b.next(timer)
		if !ok {
			return
		}
		b.process(batch)
	}
}

// next waits until a batch is due and takes it off the queue. It returns
// false once the batcher is closed, after failing every queued call.
func (b *batcher) next(timer *time.Timer) ([]*item, bool) {
	for {
		b.mu.Lock()
		b.dropDead()
		if b.closed {
			for _, it := range b.queue {
				it.c.finish(errEngineClosed)
			}
			b.queue = nil
			b.mu.Unlock()
			return nil, false
		}
		n := len(b.queue)
		var due <-chan time.Time
		if n > 0 {
			waited := time.Since(b.queue[0].at)
			if n >= b.maxBatch || b.arriving == 0 || waited >= b.maxWait {
				k := min(n, b.maxBatch)
				batch := slices.Clone(b.queue[:k])
				rest := copy(b.queue, b.queue[k:])
				clear(b.queue[rest:])
				b.queue = b.queue[:rest]
				b.sizes.add(k)
				b.mu.Unlock()
				if rest > 0 {
					b.signal() // let another worker take the rest
				}
				return batch, true
			}
			timer.Reset(b.maxWait - waited)
			due = timer.C
		}
		b.mu.Unlock()
		select {
		case <-b.wake:
		case <-due:
		case <-b.quit:
		}
		timer.Stop()
	}
}

// dropDead removes queued inputs whose call was cancelled or already failed.
// The caller holds b.mu.
func (b *batcher) dropDead() {
	b.queue = slices.DeleteFunc(b.queue, func(it *item) bool {
		return it.c.finished || it.c.ctx.Err() != nil
	})
}

// process runs a batch in length-sorted groups and delivers the vectors.
func (b *batcher) process(batch []*item) {
	slices.SortStableFunc(batch, func(x, y *item) int { return len(x.seq.ids) - len(y.seq.ids) })
	lens := make([]int, len(batch))
	for i, it := range batch {
		lens[i] = len(it.seq.ids)
	}
	start := 0
	for _, end := range partition(lens, groupOverheadTokens) {
		group := batch[start:end]
		start = end
		seqs := make([]sequence, len(group))
		for i, it := range group {
			seqs[i] = it.seq
		}
		vecs, err := b.run(seqs)
		b.mu.Lock()
		for i, it := range group {
			c := it.c
			switch {
			case c.finished:
			case err != nil:
				c.finish(err)
			default:
				c.vecs[it.idx] = vecs[i]
				if c.pending--; c.pending == 0 {
					c.finish(nil)
				}
			}
		}
		b.mu.Unlock()
	}
}

// finish completes the call with err (nil: all vectors are in). The caller
// holds batcher.mu.
func (c *call) finish(err error) {
	if c.finished {
		return
	}
	c.finished = true
	c.err = err
	close(c.done)
}

// partition splits ascending lengths into contiguous groups and returns each
// group's end index. It minimises the sum over groups of overhead + size *
// longest, by dynamic programming over the split points.
func partition(lens []int, overhead int) []int {
	n := len(lens)
	best := make([]int, n+1) // best[i]: cost of lens[:i]
	from := make([]int, n+1) // from[i]: start of the last group of lens[:i]
	for i := 1; i <= n; i++ {
		best[i] = -1
		for j := 0; j < i; j++ {
			cost := best[j] + overhead + (i-j)*lens[i-1]
			if best[i] < 0 || cost < best[i] {
				best[i], from[i] = cost, j
			}
		}
	}
	var ends []int
	for i := n; i > 0; i = from[i] {
		ends = append(ends, i)
	}
	slices.Reverse(ends)
	return ends
}

// BatchSizes is a histogram of the batches a batching engine took off its
// queue since load, with the queue's depth now; metrics read it.
type BatchSizes struct {
	// Bounds are the buckets' upper bounds in rows: 1, 2, 4, ... up to
	// the engine's largest batch.
	Bounds []float64
	// Cumulative[i] counts the batches of at most Bounds[i] rows.
	Cumulative []uint64
	// Count is the number of batches and Sum their rows.
	Count, Sum uint64
	// Queued is the number of inputs waiting now.
	Queued int
}

// batchSizeCounts counts batches per power-of-two bucket.
type batchSizeCounts struct {
	buckets    [17]uint64 // bucket i: sizes in (2^(i-1), 2^i]
	count, sum uint64
}

func (c *batchSizeCounts) add(rows int) {
	i := 0
	for 1<<i < rows && i < len(c.buckets)-1 {
		i++
	}
	c.buckets[i]++
	c.count++
	c.sum += uint64(rows)
}

// batchSizes snapshots the histogram.
func (b *batcher) batchSizes() BatchSizes {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := BatchSizes{Count: b.sizes.count, Sum: b.sizes.sum, Queued: len(b.queue)}
	var cum uint64
	for i := range b.sizes.buckets {
		cum += b.sizes.buckets[i]
		out.Bounds = append(out.Bounds, float64(int(1)<<i))
		out.Cumulative = append(out.Cumulative, cum)
		if 1<<i >= b.maxBatch {
			break
		}
	}
	return out
}

// BatchSizes reports the sizes of the batches the embedder's batcher ran.
func (e *embedder) BatchSizes() BatchSizes { return e.batcher.batchSizes() }

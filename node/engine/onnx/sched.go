package onnx

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// busyRetryAfter is the Retry-After of a refusal: a decode step takes tens
// of milliseconds, a whole answer seconds, so one second is the earliest a
// retry has a fair chance.
const busyRetryAfter = time.Second

// prefillGrace is how long a waiting prompt's next chunk waits for the
// running rows to hand over their next tokens (see prefillLocked). Rows
// sample in well under a millisecond; the bound only matters when a
// row's request is held up between tokens, which then costs the prompt
// this much, not its whole wait.
const prefillGrace = 20 * time.Millisecond

// scheduler runs one decoder model's sequences: a goroutine (loop) owns the
// batch cache and all session runs; requests talk to it through their seq
// (a chat.Forwarder), whose Forward hands over the prompt or the next token
// and waits for the logits.
//
// Each turn of the loop: sequences that left (finished, failed, cancelled)
// are dropped from the batch at once and their admission released; when
// every remaining row has handed over its next token, one batched decode
// step runs and each row gets its logits; then one chunk (prefill_chunk
// tokens) of each of the oldest waiting prompts, up to lanes
// (prefill_parallel, default 2) of them, runs on that prompt's own cache,
// the chunks concurrently in one session (two prefills side by side
// finish a little sooner than one after the other on two idle cores, and
// much sooner on loaded ones). Chunks wait for the rows to be ready (up to
// prefillGrace), so they go with a step: a long prompt delays the running
// sequences by at most one round of chunks per step, a burst of prompts
// does not stall the rows already decoding, and a prompt that finishes
// its prefill joins the batch at the next step (its first text often
// needs that step: the first token can be part of a character). Sampling,
// stop strings, constraints and streaming stay in each request's
// goroutine (chat.Model.Generate), between its Forward calls: a step
// waits for all rows, which only ever waits for sampling, because Chat
// streams deltas through a goroutine of their own (a slow client does not
// hold the batch back).
//
// Admission: at most maxBatch sequences are admitted (prefilling or
// decoding), and their cache estimate (rows × the longest reservation
// (prompt + max_tokens) × bytes per position × 2 buffers — the padded
// layout's worst case) stays within the KV budget unless a sequence runs
// alone. Others wait in a FIFO queue of maxQueue; beyond it a request is
// refused with engine.BusyError.
type scheduler struct {
	d        *decoder
	maxBatch int
	maxQueue int
	kvBudget int64
	perPos   int64 // bytes of one position of one sequence, keys and values of all layers
	prefix   *prefixCache

	turnMu sync.Mutex // held by whoever runs a turn (the loop or an inline step)
	batch  *batchKV   // under turnMu
	tokens []int64    // under turnMu: the step's inputs

	mu       sync.Mutex
	wake     *sync.Cond
	closed   bool
	admitted []*seq
	queue    []*waiter
	prefillQ []*seq    // prompts handed over, oldest first
	lanes    int       // prompts prefilled at once (prefill_parallel)
	widest   int       // most prompts prefilled side by side in one turn so far
	held     time.Time // since when a prompt waits for the rows to be ready (zero: none)
	counts   engine.BatchStats
	done     chan struct{}

	kvBytes atomic.Int64 // batch buffers plus the prefill stream
}

// seq is one admitted request's sequence.
type seq struct {
	s       *scheduler
	reserve int // prompt + max_tokens positions

	// Guarded by s.mu.
	ctx     context.Context
	started bool // the prompt was handed over
	prompt  []int64
	next    int64 // the token for the next step
	pending bool  // next is set
	gone    bool  // the request is done with it
	res     chan seqResult

	// Under s.turnMu.
	kv    *kvStream // the prompt's cache during prefill
	start int       // first own column in the batch
	fed   []int64   // tokens whose keys and values the cache holds
	out   []float32 // the prompt's last logits
}

type seqResult struct {
	logits []float32
	err    error
}

// waiter is a request queued for admission.
type waiter struct {
	q  *seq
	ok chan error // nil once admitted
}

// schedConfig is a scheduler's limits and prefill policy (the model
// options max_batch, max_queue, kv_memory_mb and prefill_parallel).
type schedConfig struct {
	maxBatch, maxQueue int
	kvBudget           int64
	lanes              int
}

// newScheduler starts the loop of d.
func newScheduler(d *decoder, c schedConfig, prefix *prefixCache) (*scheduler, error) {
	b, err := newBatchKV(d)
	if err != nil {
		return nil, err
	}
	s := &scheduler{d: d, maxBatch: c.maxBatch, maxQueue: c.maxQueue, kvBudget: c.kvBudget, lanes: max(1, c.lanes),
		prefix: prefix, batch: b, done: make(chan struct{})}
	s.perPos = int64(d.layers) * 2 * int64(d.kvHeads) * int64(d.headDim) * 4
	s.wake = sync.NewCond(&s.mu)
	s.counts.MaxBatch = c.maxBatch
	go s.loop()
	return s, nil
}

// fitsLocked reports whether a sequence reserving reserve positions may
// be admitted now.
func (s *scheduler) fitsLocked(reserve int) bool {
	n := len(s.admitted)
	if n >= s.maxBatch {
		return false
	}
	if n == 0 {
		return true
	}
	longest := reserve
	for _, q := range s.admitted {
		longest = max(longest, q.reserve)
	}
	return 2*s.perPos*int64(n+1)*int64(longest) <= s.kvBudget
}

// admit returns a sequence for a request of reserve positions, waiting in
// the queue when the batch is full, or refuses it with BusyError when the
// queue is full too.
func (s *scheduler) admit(ctx context.Context, reserve int) (*seq, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := &seq{s: s, reserve: reserve, res: make(chan seqResult, 1)}
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return nil, errEngineClosed
	case len(s.queue) == 0 && s.fitsLocked(reserve):
		s.admitted = append(s.admitted, q)
		s.mu.Unlock()
		return q, nil
	case len(s.queue) >= s.maxQueue:
		s.counts.Refused++
		s.mu.Unlock()
		return nil, &engine.BusyError{Model: s.d.id, RetryAfter: busyRetryAfter}
	}
	w := &waiter{q: q, ok: make(chan error, 1)}
	s.queue = append(s.queue, w)
	s.mu.Unlock()
	select {
	case err := <-w.ok:
		if err != nil {
			return nil, err
		}
		return q, nil
	case <-ctx.Done():
		s.mu.Lock()
		if i := slices.Index(s.queue, w); i >= 0 {
			s.queue = slices.Delete(s.queue, i, i+1)
			s.mu.Unlock()
			return nil, ctx.Err()
		}
		s.mu.Unlock()
		q.close() // admitted as ctx ended
		return nil, ctx.Err()
	}
}

// releaseLocked ends q's admission and admits queued requests that fit.
func (s *scheduler) releaseLocked(q *seq) {
	if i := slices.Index(s.admitted, q); i >= 0 {
		s.admitted = slices.Delete(s.admitted, i, i+1)
	}
	for len(s.queue) > 0 && !s.closed && s.fitsLocked(s.queue[0].q.reserve) {
		w := s.queue[0]
		s.queue = s.queue[1:]
		s.admitted = append(s.admitted, w.q)
		w.ok <- nil
	}
}

// Forward hands the prompt (first call) or the next token to the loop and
// waits for the logits of the last position. The slice is valid until the
// next call.
func (q *seq) Forward(ctx context.Context, ids []int64) ([]float32, error) {
	s := q.s
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return nil, errEngineClosed
	case q.gone:
		s.mu.Unlock()
		return nil, errors.New("onnx: sequence already closed")
	case !q.started:
		if len(ids) == 0 {
			s.mu.Unlock()
			return nil, errors.New("onnx: empty prompt")
		}
		q.started, q.prompt, q.ctx = true, ids, ctx
		s.prefillQ = append(s.prefillQ, q)
	case len(ids) != 1 || q.pending:
		s.mu.Unlock()
		return nil, errors.New("onnx: after the prompt, feed one token per call")
	default:
		q.next, q.pending, q.ctx = ids[0], true, ctx
	}
	// The request that makes the batch ready runs the step itself when no
	// turn is under way and no prompt waits; otherwise the loop does (a
	// waiting prompt's next chunk goes with the step).
	inline := q.pending && len(s.prefillQ) == 0 && s.readyLocked()
	if !inline {
		s.wake.Signal()
	}
	s.mu.Unlock()
	if inline {
		if s.turnMu.TryLock() {
			s.turn(false)
			s.turnMu.Unlock()
		}
		s.mu.Lock()
		if s.workLocked() {
			s.wake.Signal()
		}
		s.mu.Unlock()
	}
	select {
	case r := <-q.res:
		return r.logits, r.err
	case <-ctx.Done():
		q.close()
		return nil, ctx.Err()
	}
}

// close tells the loop the request is done with q: it leaves the batch
// (or the prefill queue) at the loop's next turn.
func (q *seq) close() {
	s := q.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if q.gone {
		return
	}
	q.gone = true
	// The slot is free at once: a sequence admitted now prefills first, and
	// the loop drops q from the batch before it runs that prefill, so the
	// batch never holds more than maxBatch rows.
	s.releaseLocked(q)
	if q.started {
		s.wake.Signal()
	}
}

// deliver hands q a result without blocking (q waits for at most one).
func (q *seq) deliver(r seqResult) {
	select {
	case q.res <- r:
	default:
	}
}

// workLocked reports whether the loop has something to do: rows to drop,
// a step to run, or a prompt to prefill (prefillLocked).
func (s *scheduler) workLocked() bool {
	for _, q := range s.batch.rows {
		if q.gone {
			return true
		}
	}
	return s.readyLocked() || s.prefillLocked()
}

// prefillLocked reports whether a turn may run a prefill chunk now: a
// prompt waits, and the batch is ready to step (or empty) or has kept the
// prompt waiting for prefillGrace. So a chunk goes together with a step of
// the running rows: running one while some rows are still sampling would
// hold back their next token by a whole chunk, and a burst of prompts
// would prefill back to back while the rows already joined wait for their
// second token (their first text, when the first token is part of a
// character).
func (s *scheduler) prefillLocked() bool {
	if len(s.prefillQ) == 0 {
		return false
	}
	for _, q := range s.batch.rows {
		if !q.gone {
			return s.readyLocked() || !s.held.IsZero() && time.Since(s.held) >= prefillGrace
		}
	}
	return true
}

// holdLocked starts the grace period of a prompt that waits for the rows,
// with a timer that wakes the loop when it ends.
func (s *scheduler) holdLocked() {
	if !s.held.IsZero() || len(s.prefillQ) == 0 {
		return
	}
	s.held = time.Now()
	time.AfterFunc(prefillGrace, func() {
		s.mu.Lock()
		s.wake.Signal()
		s.mu.Unlock()
	})
}

// readyLocked reports whether every row has handed over its next token.
func (s *scheduler) readyLocked() bool {
	for _, q := range s.batch.rows {
		if !q.pending && !q.gone {
			return false
		}
	}
	return len(s.batch.rows) > 0
}

// loop is the scheduler goroutine: it runs a turn whenever there is work.
// Decode steps mostly run inline instead (see Forward): the request that
// makes the batch ready runs the step on its own goroutine when no turn is
// under way, which saves two goroutine hand-offs per token.
func (s *scheduler) loop() {
	defer close(s.done)
	for {
		s.mu.Lock()
		for !s.closed && !s.workLocked() {
			s.holdLocked()
			s.wake.Wait()
		}
		if s.closed {
			s.failLocked()
			s.mu.Unlock()
			s.turnMu.Lock() // wait for an inline turn
			s.batch.close()
			s.turnMu.Unlock()
			return
		}
		s.mu.Unlock()
		s.turnMu.Lock()
		s.turn(true)
		s.turnMu.Unlock()
	}
}

// turn drops the rows that left, runs a decode step if every other row
// has handed over its next token, then (with prefill) one chunk of each
// of the oldest waiting prompts, up to lanes of them at once. The caller
// holds turnMu.
func (s *scheduler) turn(prefill bool) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	var leaving []*seq
	for _, q := range s.batch.rows {
		if q.gone {
			leaving = append(leaving, q)
		}
	}
	var pfs []*seq
	if prefill && s.prefillLocked() {
		s.held = time.Time{}
		s.prefillQ = slices.DeleteFunc(s.prefillQ, func(q *seq) bool {
			if q.gone {
				s.dropPrefill(q)
				s.releaseLocked(q)
			}
			return q.gone
		})
		pfs = slices.Clone(s.prefillQ[:min(len(s.prefillQ), s.lanes)])
		s.widest = max(s.widest, len(pfs))
	}
	step := s.readyLocked()
	s.mu.Unlock()

	if len(leaving) > 0 {
		s.leave(leaving)
	}
	if step && len(s.batch.rows) > 0 {
		// Every row now was ready above (only turns add rows); one that
		// left since steps once more, unread.
		s.tokens = s.tokens[:0]
		s.mu.Lock()
		for _, q := range s.batch.rows {
			s.tokens = append(s.tokens, q.next)
			q.pending = false
		}
		s.mu.Unlock()
		s.step(s.tokens)
	}
	if len(pfs) > 0 {
		s.prefillChunks(pfs)
	}
	s.kvBytes.Store(s.batch.bytes() + s.prefillBytes())
}

// leave drops the rows in leaving from the batch, caching their prefixes.
func (s *scheduler) leave(leaving []*seq) {
	for _, q := range leaving {
		r := slices.Index(s.batch.rows, q)
		if s.prefix != nil {
			s.prefix.insert(q.fed, s.d.headDim, func(i, h int) []float32 { return s.batch.plane(r, i, h) })
		}
		s.mu.Lock() // rows are read under s.mu too
		s.batch.remove(r)
		s.mu.Unlock()
	}
	s.batch.compact()
	s.mu.Lock()
	for _, q := range leaving {
		s.releaseLocked(q)
	}
	s.mu.Unlock()
}

// step runs one decode step over the batch and hands out the logits.
func (s *scheduler) step(tokens []int64) {
	logits, err := s.batch.step(tokens)
	v := s.d.vocabRows
	for r, q := range s.batch.rows {
		if err != nil {
			q.deliver(seqResult{err: err})
			continue
		}
		q.fed = append(q.fed, tokens[r])
		q.deliver(seqResult{logits: logits[r*v : (r+1)*v : (r+1)*v]})
	}
	s.mu.Lock()
	s.counts.Steps++
	s.counts.StepRows += uint64(len(tokens))
	s.mu.Unlock()
}

// prefillChunks runs the next chunk of each prompt in pfs on the
// prompt's own cache, concurrently when there are several: the runs then
// mostly keep to a core each, which wastes less than one run spread over
// both (a 60-token prefill on ONNX Runtime's 2-thread pool takes ~1.1x
// the CPU time it takes on one thread). After its last chunk a prompt's
// cache joins the batch and the request gets its first logits.
func (s *scheduler) prefillChunks(pfs []*seq) {
	type run struct {
		q    *seq
		ctx  context.Context
		ids  []int64
		last []float32
		err  error
	}
	runs := make([]run, 0, len(pfs))
	for _, q := range pfs {
		s.mu.Lock()
		ctx, prompt := q.ctx, q.prompt
		s.mu.Unlock()
		if q.kv == nil {
			kv, err := s.d.newStream(len(prompt))
			if err != nil {
				s.prefillFailed(q, err)
				continue
			}
			q.kv = kv
			if s.prefix != nil {
				if chain := s.prefix.lookup(prompt); len(chain) > 0 {
					kv.preload(chain, s.prefix.block)
				}
			}
		}
		kv := q.kv
		n := min(len(prompt)-kv.past, kv.chunk)
		runs = append(runs, run{q: q, ctx: ctx, ids: prompt[kv.past : kv.past+n]})
	}
	exec := func(r *run) {
		kv := r.q.kv
		r.err = RunCancellable(r.ctx, kv.opts, func() error {
			var err error
			r.last, err = kv.run(r.ids)
			return err
		})
	}
	if len(runs) == 1 {
		exec(&runs[0])
	} else {
		var wg sync.WaitGroup
		for i := range runs {
			wg.Go(func() { exec(&runs[i]) })
		}
		wg.Wait()
	}
	for i := range runs {
		s.prefillDone(runs[i].ctx, runs[i].q, runs[i].last, runs[i].err)
	}
}

// prefillDone accounts for a chunk of q's prompt (the last position's
// logits last, or err); after the last chunk q joins the batch.
func (s *scheduler) prefillDone(ctx context.Context, q *seq, last []float32, err error) {
	s.mu.Lock()
	s.counts.PrefillChunks++
	prompt := q.prompt
	s.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		s.prefillFailed(q, err)
		return
	}
	kv := q.kv
	if kv.past < len(prompt) {
		return
	}
	if s.prefix != nil {
		s.prefix.insert(prompt, s.d.headDim, kv.plane)
	}
	q.out = append(q.out[:0], last...)
	q.fed = append(q.fed[:0], prompt...)
	s.mu.Lock()
	s.batch.join(q, kv)
	s.removePrefillLocked(q)
	q.kv = nil
	s.mu.Unlock()
	kv.close()
	q.deliver(seqResult{logits: q.out})
}

// prefillFailed ends q's prefill with err.
func (s *scheduler) prefillFailed(q *seq, err error) {
	s.mu.Lock()
	s.removePrefillLocked(q)
	s.dropPrefill(q)
	s.releaseLocked(q)
	s.mu.Unlock()
	q.deliver(seqResult{err: err})
}

// removePrefillLocked takes q off the prefill queue.
func (s *scheduler) removePrefillLocked(q *seq) {
	if i := slices.Index(s.prefillQ, q); i >= 0 {
		s.prefillQ = slices.Delete(s.prefillQ, i, i+1)
	}
}

// dropPrefill frees q's prefill cache (called with s.mu held or from the
// loop; only the loop touches q.kv).
func (s *scheduler) dropPrefill(q *seq) {
	if q.kv != nil {
		q.kv.close()
		q.kv = nil
	}
}

// prefillBytes is the memory of the prompts being prefilled.
func (s *scheduler) prefillBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, q := range s.prefillQ {
		if kv := q.kv; kv != nil {
			n += int64(len(kv.cur)) * 2 * int64(cap(kv.cur[0])) * 4
		}
	}
	return n
}

// failLocked ends every request with errEngineClosed.
func (s *scheduler) failLocked() {
	for _, w := range s.queue {
		w.ok <- errEngineClosed
	}
	s.queue = nil
	for _, q := range s.admitted {
		q.deliver(seqResult{err: errEngineClosed})
		s.dropPrefill(q)
	}
	s.admitted = nil
	s.prefillQ = nil
}

// close stops the loop and waits for it; requests fail with
// errEngineClosed.
func (s *scheduler) close() {
	s.mu.Lock()
	s.closed = true
	s.wake.Signal()
	s.mu.Unlock()
	<-s.done
}

// stats returns the counters.
func (s *scheduler) stats() engine.BatchStats {
	s.mu.Lock()
	c := s.counts
	c.Running, c.Queued = len(s.admitted), len(s.queue)
	s.mu.Unlock()
	c.KVBytes = s.kvBytes.Load()
	return c
}

package llama

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// busyRetryAfter is the Retry-After of a refusal.
const busyRetryAfter = time.Second

// prefillGrace is how long a waiting prompt waits for the running rows to
// hand over their next tokens before its chunk goes without them.
const prefillGrace = 20 * time.Millisecond

// scheduler drives one llama.cpp context for all of a model's requests.
// A goroutine (loop) owns the context; requests talk to it through their
// seq (a chat.Forwarder), whose Forward hands over the prompt or the next
// token and waits for the logits.
//
// Each turn: sequences whose request is done leave (their KV memory is
// dropped and their sequence id freed); then one llama_decode carries a
// token for every running sequence that handed one over, plus chunks of
// the waiting prompts (oldest first) up to prefill_chunk tokens in all. A
// turn runs when every running sequence has handed over its token, or when
// a prompt waits and either no sequence runs or the rows kept it waiting
// prefillGrace. Each sequence has its own llama.cpp sequence id and KV
// memory, so sequences join and leave between steps without moving
// anyone else's cache.
//
// Admission: at most maxBatch sequences (prefilling or decoding) whose
// reservations (prompt + max_tokens) fit in kvCells together; others wait
// in a FIFO of maxQueue, beyond which a request is refused with
// engine.BusyError.
type scheduler struct {
	id    string
	chunk int

	turnMu sync.Mutex // held by whoever runs a turn (the loop or an inline step)
	lctx   *Context   // under turnMu
	free   []int      // under turnMu: free sequence ids
	rows   []*seq     // under turnMu: the turn's scratch
	parts  []part
	idx    []int
	clear  []leaver
	prefix *prefixCache // nil: no prefix cache

	mu       sync.Mutex
	wake     *sync.Cond
	closed   bool
	maxBatch int
	maxQueue int
	kvCells  int // KV cells the running sequences may reserve in all
	admitted []*seq
	queue    []*waiter
	running  []*seq // decoding
	prefillQ []*seq // prompts handed over, oldest first
	held     time.Time
	counts   engine.BatchStats
	// decodeTime is the time spent in llama_decode since load.
	decodeTime time.Duration
	done       chan struct{}
	stopped    bool // close was called
}

// seq is one admitted request's sequence.
type seq struct {
	s       *scheduler
	reserve int

	// Guarded by s.mu.
	ctx     context.Context
	started bool
	prompt  []int64
	next    int64
	pending bool
	gone    bool
	res     chan seqResult

	// The loop's.
	slot int     // llama.cpp sequence id, -1 before prefill
	fed  int     // prompt tokens decoded
	pos  int     // positions in the KV memory
	kv   []int64 // the tokens the KV memory holds, in order
	out  []float32
}

// leaver is a sequence id given back in a turn, with the tokens its KV
// memory holds (for the prefix cache).
type leaver struct {
	slot int
	kv   []int64
}

type seqResult struct {
	logits []float32
	err    error
}

type waiter struct {
	q  *seq
	ok chan error
}

type schedConfig struct {
	maxBatch, maxQueue, chunk, kvCells int
	prefix                             *prefixCache
}

func newScheduler(id string, lctx *Context, c schedConfig) *scheduler {
	s := &scheduler{id: id, lctx: lctx, chunk: c.chunk, maxBatch: c.maxBatch, maxQueue: c.maxQueue, kvCells: c.kvCells, prefix: c.prefix, done: make(chan struct{})}
	for i := c.maxBatch - 1; i >= 0; i-- {
		s.free = append(s.free, i)
	}
	s.wake = sync.NewCond(&s.mu)
	s.counts.MaxBatch = c.maxBatch
	go s.loop()
	return s
}

// admit returns a sequence for a request of reserve positions, waiting in
// the queue when the batch is full, or refuses it with BusyError.
func (s *scheduler) admit(ctx context.Context, reserve int) (*seq, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := &seq{s: s, reserve: reserve, slot: -1, res: make(chan seqResult, 1)}
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
		return nil, &engine.BusyError{Model: s.id, RetryAfter: busyRetryAfter}
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
		q.close()
		return nil, ctx.Err()
	}
}

// fitsLocked reports whether a sequence reserving reserve positions may
// be admitted now: a free sequence id, and the reservations of the
// admitted sequences plus this one within the KV cells (a sequence alone
// is always admitted).
func (s *scheduler) fitsLocked(reserve int) bool {
	if len(s.admitted) >= s.maxBatch {
		return false
	}
	sum := reserve
	for _, q := range s.admitted {
		sum += q.reserve
	}
	return len(s.admitted) == 0 || sum <= s.kvCells
}

// releaseLocked ends q's admission and admits queued requests.
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
// waits for the logits of the last position, which stay valid until the
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
		return nil, errors.New("llama: sequence already closed")
	case !q.started:
		if len(ids) == 0 {
			s.mu.Unlock()
			return nil, errors.New("llama: empty prompt")
		}
		q.started, q.prompt, q.ctx = true, ids, ctx
		s.prefillQ = append(s.prefillQ, q)
	case len(ids) != 1 || q.pending:
		s.mu.Unlock()
		return nil, errors.New("llama: after the prompt, feed one token per call")
	default:
		q.next, q.pending, q.ctx = ids[0], true, ctx
	}
	// The request that makes the batch ready runs the step itself when no
	// turn is under way and no prompt waits; otherwise the loop does.
	all, _ := s.rowsReadyLocked()
	inline := q.pending && all && len(s.prefillQ) == 0
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

// close tells the loop the request is done with q; its admission ends at
// once, its sequence id and KV memory at the loop's next turn.
func (q *seq) close() {
	s := q.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if q.gone {
		return
	}
	q.gone = true
	s.releaseLocked(q)
	s.wake.Signal()
}

func (q *seq) deliver(r seqResult) {
	select {
	case q.res <- r:
	default:
	}
}

// rowsReadyLocked reports whether every running sequence has handed over
// its next token (or left), and whether any did.
func (s *scheduler) rowsReadyLocked() (all, any bool) {
	all = true
	for _, q := range s.running {
		switch {
		case q.gone:
		case q.pending:
			any = true
		default:
			all = false
		}
	}
	return all, any
}

// workLocked reports whether a turn has something to do now.
func (s *scheduler) workLocked() bool {
	for _, q := range s.running {
		if q.gone {
			return true
		}
	}
	for _, q := range s.prefillQ {
		if q.gone {
			return true
		}
	}
	all, any := s.rowsReadyLocked()
	if any && all {
		return true
	}
	return s.prefillNowLocked()
}

// prefillNowLocked: a prompt waits and no row holds it back (none runs,
// all are ready, or they kept it waiting prefillGrace).
func (s *scheduler) prefillNowLocked() bool {
	if len(s.prefillQ) == 0 {
		return false
	}
	all, _ := s.rowsReadyLocked()
	live := false
	for _, q := range s.running {
		live = live || !q.gone
	}
	return !live || all || !s.held.IsZero() && time.Since(s.held) >= prefillGrace
}

// holdLocked starts a waiting prompt's grace period, with a timer that
// wakes the loop when it ends.
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

// part is a prompt chunk in a turn's batch.
type part struct {
	q    *seq
	n    int
	last int // batch index of the prompt's last token, -1 if not in this chunk
}

// loop is the scheduler goroutine: it runs a turn whenever there is work.
// Decode steps mostly run inline instead (see Forward): the request whose
// token makes the batch ready runs the step on its own goroutine when no
// turn is under way, which saves two goroutine hand-offs per token — on a
// loaded machine each hand-off waits for a time slice.
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
			s.lctx.Free()
			s.turnMu.Unlock()
			return
		}
		s.mu.Unlock()
		s.turnMu.Lock()
		s.turn(true)
		s.turnMu.Unlock()
	}
}

// turn drops the sequences that left, then runs one decode over the rows
// that handed over a token and (with prefill, when a prompt may go now)
// chunks of the waiting prompts. The caller holds turnMu.
func (s *scheduler) turn(prefill bool) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	// Sequences that left give back their ids and memory.
	var leaving []*seq
	s.running = slices.DeleteFunc(s.running, func(q *seq) bool {
		if q.gone {
			leaving = append(leaving, q)
		}
		return q.gone
	})
	s.prefillQ = slices.DeleteFunc(s.prefillQ, func(q *seq) bool {
		if q.gone {
			leaving = append(leaving, q)
		}
		return q.gone
	})
	s.clear = s.clear[:0]
	for _, q := range leaving {
		if q.slot >= 0 {
			s.clear = append(s.clear, leaver{slot: q.slot, kv: q.kv})
			s.free = append(s.free, q.slot)
			q.slot = -1
		}
	}
	prefill = prefill && s.prefillNowLocked()
	if prefill {
		s.held = time.Time{}
	}
	s.rows = s.rows[:0]
	for _, q := range s.running {
		if q.pending {
			s.rows = append(s.rows, q)
			q.pending = false
		}
	}
	s.parts = s.parts[:0]
	if prefill {
		budget, ids := s.chunk, len(s.free)
		for _, q := range s.prefillQ {
			if budget == 0 {
				break
			}
			if q.slot < 0 {
				if ids == 0 {
					break // a sequence that left frees its id next turn
				}
				ids--
			}
			n := min(len(q.prompt)-q.fed, budget)
			s.parts = append(s.parts, part{q: q, n: n, last: -1})
			budget -= n
		}
	}
	s.mu.Unlock()

	for _, l := range s.clear {
		if s.prefix != nil {
			s.prefix.store(l.slot, l.kv)
		}
		s.lctx.RemoveSequence(l.slot, -1, -1)
	}
	if len(s.rows) == 0 && len(s.parts) == 0 {
		return
	}
	s.step(s.rows, s.parts, &s.idx)
}

// step runs one llama_decode over rows (one token each) and parts (prompt
// chunks) and hands out the logits.
func (s *scheduler) step(rows []*seq, parts []part, idx *[]int) {
	b := s.lctx.Batch()
	*idx = (*idx)[:0]
	for _, q := range rows {
		*idx = append(*idx, b.Add(int32(q.next), q.pos, q.slot, true))
	}
	for i := range parts {
		p := &parts[i]
		q := p.q
		if q.slot < 0 {
			q.slot = s.free[len(s.free)-1]
			s.free = s.free[:len(s.free)-1]
			q.kv = q.kv[:0]
			if s.prefix != nil {
				m := s.prefix.lookup(q.slot, q.prompt)
				q.fed, q.pos = m, m
				q.kv = append(q.kv, q.prompt[:m]...)
			}
		}
		end := min(q.fed+p.n, len(q.prompt))
		p.n = end - q.fed
		for j := q.fed; j < end; j++ {
			k := b.Add(int32(q.prompt[j]), j, q.slot, j == len(q.prompt)-1)
			if j == len(q.prompt)-1 {
				p.last = k
			}
		}
	}
	t0 := time.Now()
	err := s.lctx.Decode()
	took := time.Since(t0)
	s.mu.Lock()
	s.decodeTime += took
	if len(rows) > 0 {
		s.counts.Steps++
		s.counts.StepRows += uint64(len(rows))
	}
	if len(parts) > 0 {
		s.counts.PrefillChunks++
	}
	s.mu.Unlock()
	for i, q := range rows {
		if err != nil {
			q.kv = nil // the memory may hold part of the step
			q.deliver(seqResult{err: err})
			continue
		}
		q.kv = append(q.kv, q.next)
		q.pos++
		q.out = append(q.out[:0], s.lctx.Logits((*idx)[i])...)
		q.deliver(seqResult{logits: q.out})
	}
	for _, p := range parts {
		q := p.q
		if err != nil {
			s.mu.Lock()
			if i := slices.Index(s.prefillQ, q); i >= 0 {
				s.prefillQ = slices.Delete(s.prefillQ, i, i+1)
				s.running = append(s.running, q) // leaves (and frees its id) once its request closes it
			}
			s.mu.Unlock()
			q.kv = nil
			q.deliver(seqResult{err: err})
			continue
		}
		q.kv = append(q.kv, q.prompt[q.fed:q.fed+p.n]...)
		q.fed += p.n
		q.pos = q.fed
		if p.last < 0 {
			continue
		}
		q.out = append(q.out[:0], s.lctx.Logits(p.last)...)
		s.mu.Lock()
		if i := slices.Index(s.prefillQ, q); i >= 0 {
			s.prefillQ = slices.Delete(s.prefillQ, i, i+1)
		}
		s.running = append(s.running, q)
		s.mu.Unlock()
		q.deliver(seqResult{logits: q.out})
	}
}

// failLocked ends every request with errEngineClosed.
func (s *scheduler) failLocked() {
	for _, w := range s.queue {
		w.ok <- errEngineClosed
	}
	s.queue = nil
	for _, q := range s.admitted {
		q.deliver(seqResult{err: errEngineClosed})
	}
	s.admitted, s.running, s.prefillQ = nil, nil, nil
}

// close stops the loop, which frees the context, and waits for it. It
// reports whether this call stopped it (false: already stopped).
func (s *scheduler) close() bool {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return false
	}
	s.stopped, s.closed = true, true
	s.wake.Signal()
	s.mu.Unlock()
	<-s.done
	return true
}

// stats returns the counters.
func (s *scheduler) stats() engine.BatchStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.counts
	c.Running, c.Queued = len(s.admitted), len(s.queue)
	return c
}

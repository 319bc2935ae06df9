package onnx

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/chat"
)

// loadTinyLlamaOpts loads the generated fp32 model with option overrides.
func loadTinyLlamaOpts(tb testing.TB, dir string, opts map[string]string) *decoder {
	tb.Helper()
	r := testRuntime(tb, Config{})
	spec := manifestSpec(tb, dir)
	for k, v := range opts {
		spec.Options[k] = v
	}
	c, err := r.LoadChat(spec)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c.(*decoder)
}

// unbatched generates plan alone on a cache of its own (the per-request
// path without the scheduler): the reference for batched runs.
func unbatched(t *testing.T, d *decoder, plan *chat.Plan) engine.ChatResponse {
	t.Helper()
	kv, err := d.newStream(len(plan.Prompt) + plan.MaxTokens)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.close()
	resp, err := d.model.Generate(context.Background(), plan, kv, nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// hookForwarder calls hook before its n-th Forward (1-based) and passes
// every call on to f.
type hookForwarder struct {
	f     chat.Forwarder
	calls int
	hook  func(n int)
}

func (h *hookForwarder) Forward(ctx context.Context, ids []int64) ([]float32, error) {
	h.calls++
	if h.hook != nil {
		h.hook(h.calls)
	}
	return h.f.Forward(ctx, ids)
}

// batchCase is one request of a staged batch: it starts when the previous
// one reached its join-th Forward call, and that one waits until this one
// has its first logits (it has joined the batch).
type batchCase struct {
	prompt    string
	maxTokens int
	join      int // Forward call of the previous request at which this one starts
	cancelAt  int // cancel this request before its cancelAt-th Forward (0: never)
}

type batchResult struct {
	resp engine.ChatResponse
	err  error
}

// runStaged runs the cases through the scheduler, each started while the
// one before is mid-stream, so sequences join and leave a running batch.
func runStaged(t *testing.T, d *decoder, plans []*chat.Plan, cases []batchCase) []batchResult {
	t.Helper()
	out := make([]batchResult, len(cases))
	started := make([]chan struct{}, len(cases)) // closed at a request's first logits (or its end)
	for i := range started {
		started[i] = make(chan struct{})
	}
	var wg sync.WaitGroup
	var launch func(i int)
	launch = func(i int) {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var once sync.Once
			first := func() { once.Do(func() { close(started[i]) }) }
			defer first()
			launched := false
			next := func() {
				if !launched && i+1 < len(cases) {
					launched = true
					launch(i + 1)
					<-started[i+1]
				}
			}
			defer next()
			q, err := d.sched.admit(ctx, len(plans[i].Prompt)+plans[i].MaxTokens)
			if err != nil {
				out[i].err = err
				return
			}
			defer q.close()
			f := &hookForwarder{f: q, hook: func(n int) {
				if n == 2 {
					first() // the prompt's logits came back: joined
				}
				if i+1 < len(cases) && n == cases[i+1].join {
					next()
				}
				if n == cases[i].cancelAt {
					cancel()
				}
			}}
			out[i].resp, out[i].err = d.model.Generate(ctx, plans[i], f, nil)
		})
	}
	launch(0)
	wg.Wait()
	return out
}

func stagedPlans(t *testing.T, d *decoder, cases []batchCase) []*chat.Plan {
	t.Helper()
	plans := make([]*chat.Plan, len(cases))
	for i, c := range cases {
		p, err := d.model.Prepare(engine.ChatRequest{Messages: userMsg(c.prompt), MaxTokens: c.maxTokens, Temperature: temp(0)})
		if err != nil {
			t.Fatal(err)
		}
		plans[i] = p
	}
	return plans
}

// TestBatchedEqualsUnbatched: greedy answers are the same whether a
// request runs alone or in a batch that others join and leave mid-stream
// (prompts of different lengths, so rows carry different padding, the
// batch widens for a longer prompt and compacts when the long rows leave).
func TestBatchedEqualsUnbatched(t *testing.T) {
	d := loadTinyLlamaOpts(t, genTinyLlama(t, "fp32"), map[string]string{"prefill_chunk": "16", "prefix_cache_mb": "0"})
	long := strings.Repeat("The river ran fast under the old stone bridge. ", 8)
	cases := []batchCase{
		{prompt: "Tell me a story about the sea.", maxTokens: 60},
		{prompt: "hi", maxTokens: 12, join: 5},
		{prompt: long, maxTokens: 40, join: 4},
		{prompt: "What is the weather like in Paris today?", maxTokens: 25, join: 6},
		{prompt: "Count with me: one, two, three.", maxTokens: 30, join: 3},
		{prompt: long + " And then?", maxTokens: 8, join: 10},
	}
	plans := stagedPlans(t, d, cases)
	want := make([]engine.ChatResponse, len(plans))
	for i, p := range plans {
		want[i] = unbatched(t, d, p)
	}
	got := runStaged(t, d, plans, cases)
	sameAnswers(t, got, want)
	st := d.BatchStats()
	t.Logf("batch stats %+v", st)
	if st.Steps == 0 || st.StepRows <= st.Steps {
		t.Fatalf("no step ran more than one row: %+v", st)
	}
	waitIdle(t, d)
}

// waitIdle waits until the scheduler has released every sequence (the
// loop drops closed rows at its next turn).
func waitIdle(t *testing.T, d *decoder) {
	t.Helper()
	// A closed sequence frees its admission at once but leaves the batch
	// (and caches its prefix) at the loop's next turn: wait for both.
	for {
		d.sched.mu.Lock()
		rows := len(d.sched.batch.rows)
		d.sched.mu.Unlock()
		if rows == 0 && d.BatchStats().Running == 0 {
			break
		}
		runtime.Gosched()
	}
	d.sched.mu.Lock()
	defer d.sched.mu.Unlock()
	if len(d.sched.prefillQ) != 0 {
		t.Fatalf("%d prompts left in the prefill queue", len(d.sched.prefillQ))
	}
}

// TestBatchCancelOneStream: a request cancelled mid-stream leaves the
// batch; the others finish exactly as they would alone.
func TestBatchCancelOneStream(t *testing.T) {
	d := loadTinyLlamaOpts(t, genTinyLlama(t, "fp32"), map[string]string{"prefix_cache_mb": "0"})
	cases := []batchCase{
		{prompt: "Tell me a story about the sea.", maxTokens: 50},
		{prompt: "Please answer in JSON, a long one.", maxTokens: 200, join: 4, cancelAt: 8},
		{prompt: "What is the weather like?", maxTokens: 30, join: 3},
	}
	plans := stagedPlans(t, d, cases)
	got := runStaged(t, d, plans, cases)
	for _, i := range []int{0, 2} {
		want := unbatched(t, d, plans[i])
		if got[i].err != nil || got[i].resp.Message.Content != want.Message.Content {
			t.Fatalf("request %d: %q (%v), alone %q", i, got[i].resp.Message.Content, got[i].err, want.Message.Content)
		}
	}
	if !errors.Is(got[1].err, context.Canceled) || got[1].resp.Usage.CompletionTokens >= 200 {
		t.Fatalf("cancelled request: %v after %d tokens", got[1].err, got[1].resp.Usage.CompletionTokens)
	}
	waitIdle(t, d)
}

// TestBatchCapBusy: with max_batch 1 and max_queue 1 a second request
// waits, a third is refused with engine.ErrBusy; cancelling the running
// stream frees its slot for the waiting one at once.
func TestBatchCapBusy(t *testing.T) {
	d := loadTinyLlamaOpts(t, genTinyLlama(t, "fp32"), map[string]string{"max_batch": "1", "max_queue": "1"})
	req := engine.ChatRequest{Messages: userMsg("Tell me a story."), MaxTokens: 20, Temperature: temp(0)}
	plan, err := d.model.Prepare(req)
	if err != nil {
		t.Fatal(err)
	}
	want := unbatched(t, d, plan).Message.Content

	// A holds the only slot, stopped before its third Forward.
	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	inA := make(chan struct{})
	releaseA := make(chan struct{})
	doneA := make(chan error, 1)
	planA, err := d.model.Prepare(engine.ChatRequest{Messages: userMsg("x"), MaxTokens: 500, Seed: seed(1)})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		q, err := d.sched.admit(ctxA, len(planA.Prompt)+planA.MaxTokens)
		if err != nil {
			close(inA)
			doneA <- err
			return
		}
		defer q.close()
		f := &hookForwarder{f: q, hook: func(n int) {
			if n == 3 {
				close(inA)
				<-releaseA
			}
		}}
		_, err = d.model.Generate(ctxA, planA, f, nil)
		doneA <- err
	}()
	<-inA
	doneB := make(chan batchResult, 1)
	go func() {
		resp, err := d.Chat(context.Background(), req, nil)
		doneB <- batchResult{resp, err}
	}()
	for d.BatchStats().Queued != 1 {
		runtime.Gosched()
	}
	_, err = d.Chat(context.Background(), req, nil)
	var be *engine.BusyError
	if !errors.Is(err, engine.ErrBusy) || !errors.As(err, &be) || be.RetryAfter <= 0 || be.Model != d.ID() {
		t.Fatalf("third request: %v, want a BusyError", err)
	}
	if st := d.BatchStats(); st.Refused != 1 || st.Running != 1 || st.MaxBatch != 1 {
		t.Fatalf("stats %+v", st)
	}
	cancelA()
	close(releaseA)
	if err := <-doneA; !errors.Is(err, context.Canceled) {
		t.Fatalf("A: %v", err)
	}
	b := <-doneB
	if b.err != nil || b.resp.Message.Content != want {
		t.Fatalf("B after A's cancel: %q (%v), want %q", b.resp.Message.Content, b.err, want)
	}
	waitIdle(t, d)
}

// TestPrefixCacheHit: a follow-up turn that shares the first turn's prompt
// reuses its cached blocks and answers exactly as a cold run does.
func TestPrefixCacheHit(t *testing.T) {
	dir := genTinyLlama(t, "fp32")
	cold := loadTinyLlamaOpts(t, dir, map[string]string{"prefix_cache_mb": "0"})
	warm := loadTinyLlamaOpts(t, dir, map[string]string{"prefix_cache_mb": "4", "prefix_block": "16", "prefill_chunk": "32"})
	history := []engine.ChatMessage{
		{Role: "system", Content: strings.Repeat("You answer questions about the mesh and its nodes. ", 6)},
		{Role: "user", Content: "What does a node keep about its peers?"},
	}
	first := engine.ChatRequest{Messages: history, MaxTokens: 24, Temperature: temp(0)}
	a := chatOnce(t, warm, first)
	if a0 := chatOnce(t, cold, first); a0.Message.Content != a.Message.Content {
		t.Fatalf("first turn differs: %q vs %q", a.Message.Content, a0.Message.Content)
	}
	st := warm.PrefixStats()
	if st.Lookups != 1 || st.HitTokens != 0 || st.Inserts == 0 || st.Bytes == 0 || st.BlockTokens != 16 {
		t.Fatalf("after the first turn: %+v", st)
	}
	follow := first
	follow.Messages = append(append([]engine.ChatMessage(nil), history...),
		engine.ChatMessage{Role: "assistant", Content: a.Message.Content},
		engine.ChatMessage{Role: "user", Content: "And how does it pick one?"})
	follow.MaxTokens = 30
	want := chatOnce(t, cold, follow)
	got := chatOnce(t, warm, follow)
	if got.Message.Content != want.Message.Content || got.Usage != want.Usage {
		t.Fatalf("prefix hit %q (%+v), cold %q (%+v)", got.Message.Content, got.Usage, want.Message.Content, want.Usage)
	}
	st = warm.PrefixStats()
	if st.Lookups != 2 || st.HitTokens < uint64(a.Usage.PromptTokens/16*16) || st.MissTokens == 0 {
		t.Fatalf("follow-up turn: %+v (first prompt %d tokens)", st, a.Usage.PromptTokens)
	}
	if cs := cold.PrefixStats(); cs != (engine.PrefixStats{}) {
		t.Fatalf("disabled cache counted %+v", cs)
	}
	// The same follow-up again hits through the whole prompt but its last
	// block (at least one token is always computed).
	before := warm.PrefixStats().HitTokens
	if again := chatOnce(t, warm, follow); again.Message.Content != want.Message.Content {
		t.Fatalf("second hit %q", again.Message.Content)
	}
	if hit := warm.PrefixStats().HitTokens - before; hit < uint64((want.Usage.PromptTokens-1)/16*16) {
		t.Fatalf("repeat hit %d tokens of %d", hit, want.Usage.PromptTokens)
	}
}

// TestPrefixCacheEviction: the budget holds, least recently used chains go
// first, and an insert never evicts its own chain.
func TestPrefixCacheEviction(t *testing.T) {
	const block, layers, heads, hd = 4, 1, 1, 2
	c := newPrefixCache(3*2*block*hd*4, block, layers, heads, hd) // three blocks
	seqOf := func(base int64, n int) []int64 {
		s := make([]int64, n)
		for i := range s {
			s[i] = base + int64(i)
		}
		return s
	}
	plane := func(toks []int64) func(i, h int) []float32 {
		return func(i, h int) []float32 {
			p := make([]float32, len(toks)*hd)
			for j := range p {
				p[j] = float32(toks[j/hd]*10 + int64(i))
			}
			return p
		}
	}
	a, b := seqOf(100, 9), seqOf(200, 9)
	c.insert(a, hd, plane(a)) // 2 blocks
	if got := c.lookup(a); len(got) != 2 || got[1].kv[1][0] != float32(a[4]*10+1) {
		t.Fatalf("lookup a: %d blocks", len(got))
	}
	c.insert(b, hd, plane(b)) // needs 2, evicts a's oldest-touched block
	st := c.stats()
	if st.Blocks != 3 || st.Evictions != 1 || st.Bytes != st.BudgetBytes {
		t.Fatalf("stats %+v", st)
	}
	if got := c.lookup(b); len(got) != 2 {
		t.Fatalf("lookup b: %d blocks", len(got))
	}
	long := seqOf(300, 40) // ten blocks: stops after evicting all others
	c.insert(long, hd, plane(long))
	if got := c.lookup(append(long, 1)); len(got) != 3 {
		t.Fatalf("lookup long: %d blocks, want the budget's 3", len(got))
	}
	if got := c.lookup(b); len(got) != 0 {
		t.Fatalf("b survived: %d", len(got))
	}
	// A differing token inside a block is a miss from there on.
	mod := append([]int64(nil), long...)
	mod[5] = 7
	if got := c.lookup(mod); len(got) != 1 {
		t.Fatalf("modified lookup: %d blocks", len(got))
	}
	if c := newPrefixCache(10, block, layers, heads, hd); c.lookup(a) != nil || c.stats().BudgetBytes != 0 {
		t.Fatal("a budget below one block must disable the cache")
	}
}

// recorder passes calls to f and records the ids fed.
type recorder struct {
	f   chat.Forwarder
	fed []int64
}

func (r *recorder) Forward(ctx context.Context, ids []int64) ([]float32, error) {
	r.fed = append(r.fed, ids...)
	return r.f.Forward(ctx, ids)
}

// TestPrefixCacheStoresBatchRows: when sequences leave the batch, the
// blocks of prompt + answer go to the cache with the same keys and values
// the unbatched path computes (rows with padding, after widening).
func TestPrefixCacheStoresBatchRows(t *testing.T) {
	const block = 8
	d := loadTinyLlamaOpts(t, genTinyLlama(t, "fp32"), map[string]string{"prefix_block": "8", "prefix_cache_mb": "16", "prefill_chunk": "16"})
	cases := []batchCase{
		{prompt: "hi", maxTokens: 30},
		{prompt: strings.Repeat("The baker had already lit the oven. ", 4), maxTokens: 20, join: 3},
	}
	plans := stagedPlans(t, d, cases)
	got := runStaged(t, d, plans, cases)
	waitIdle(t, d)
	for i, p := range plans {
		if got[i].err != nil {
			t.Fatal(got[i].err)
		}
		kv, err := d.newStream(len(p.Prompt) + p.MaxTokens)
		if err != nil {
			t.Fatal(err)
		}
		rec := &recorder{f: kv}
		if _, err := d.model.Generate(context.Background(), p, rec, nil); err != nil {
			t.Fatal(err)
		}
		chain := d.prefix.lookup(append(append([]int64(nil), rec.fed...), 0))
		if want := len(rec.fed) / block; len(chain) != want || want <= len(p.Prompt)/block {
			t.Fatalf("request %d: %d blocks cached of %d fed tokens (prompt %d)", i, len(chain), len(rec.fed), len(p.Prompt))
		}
		worst := 0.0
		for c, b := range chain {
			for pl := range b.kv {
				for h := range d.kvHeads {
					want := kv.plane(pl, h)[c*block*d.headDim : (c+1)*block*d.headDim]
					have := b.kv[pl][h*block*d.headDim : (h+1)*block*d.headDim]
					for j := range want {
						worst = max(worst, float64(abs32(want[j]-have[j])))
					}
				}
			}
		}
		kv.close()
		if worst > 1e-4 {
			t.Fatalf("request %d: cached keys/values differ from the unbatched ones by %g", i, worst)
		}
	}
}

func abs32(v float32) float32 {
	if v < 0 {
		return -v
	}
	return v
}

// TestBatchKVBudget: a second sequence whose padded cache would pass
// kv_memory_mb waits for the first to leave; a lone one always runs.
func TestBatchKVBudget(t *testing.T) {
	d := loadTinyLlamaOpts(t, genTinyLlama(t, "fp32"), map[string]string{"kv_memory_mb": "1"})
	perPos := int64(d.layers * 2 * d.kvHeads * d.headDim * 4)
	big := int(int64(1<<20)/(2*perPos)) + 1 // alone it passes the budget
	a, err := d.sched.admit(context.Background(), big)
	if err != nil {
		t.Fatalf("a lone sequence must be admitted: %v", err)
	}
	small := int(int64(1<<20)/(4*perPos)) - 1 // two of these fit
	got := make(chan error, 1)
	go func() {
		q, err := d.sched.admit(context.Background(), small)
		if err == nil {
			q.close()
		}
		got <- err
	}()
	for d.BatchStats().Queued != 1 {
		runtime.Gosched()
	}
	a.close()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	x, _ := d.sched.admit(context.Background(), small)
	y, err := d.sched.admit(context.Background(), small)
	if err != nil || d.BatchStats().Running != 2 {
		t.Fatalf("two small sequences: %v, %+v", err, d.BatchStats())
	}
	x.close()
	y.close()
}

// TestBatchBurstPrefillsSideBySide: prompts that wait together prefill
// side by side (prefill_parallel), chunk by chunk, while a running
// request keeps decoding; every answer is still the one it gets alone.
func TestBatchBurstPrefillsSideBySide(t *testing.T) {
	d := loadTinyLlamaOpts(t, genTinyLlama(t, "fp32"), map[string]string{"prefill_chunk": "8", "prefill_parallel": "3", "prefix_cache_mb": "0"})
	prompts := []string{
		"Tell me a story about the sea, with ships and storms.",
		"hi",
		strings.Repeat("The river ran fast under the old stone bridge. ", 3),
		"What is the weather like in Paris today, and tomorrow?",
		"Count with me: one, two, three, four, five, six.",
	}
	plans := make([]*chat.Plan, len(prompts))
	want := make([]engine.ChatResponse, len(prompts))
	for i, p := range prompts {
		plan, err := d.model.Prepare(engine.ChatRequest{Messages: userMsg(p), MaxTokens: 20 + 5*i, Temperature: temp(0)})
		if err != nil {
			t.Fatal(err)
		}
		plans[i], want[i] = plan, unbatched(t, d, plan)
	}
	got := make([]batchResult, len(plans))
	var wg sync.WaitGroup
	run := func(i int) {
		wg.Go(func() {
			q, err := d.sched.admit(context.Background(), len(plans[i].Prompt)+plans[i].MaxTokens)
			if err != nil {
				got[i].err = err
				return
			}
			defer q.close()
			got[i].resp, got[i].err = d.model.Generate(context.Background(), plans[i], q, nil)
		})
	}
	// The first request decodes while the others' prompts arrive; the
	// test holds the scheduler's turn until all four wait, so they start
	// their prefills together.
	joined := make(chan struct{})
	wg.Go(func() {
		q, err := d.sched.admit(context.Background(), len(plans[0].Prompt)+plans[0].MaxTokens)
		if err != nil {
			got[0].err = err
			close(joined)
			return
		}
		defer q.close()
		f := &hookForwarder{f: q, hook: func(n int) {
			if n == 3 {
				close(joined)
			}
		}}
		got[0].resp, got[0].err = d.model.Generate(context.Background(), plans[0], f, nil)
	})
	<-joined
	d.sched.turnMu.Lock()
	for i := 1; i < len(plans); i++ {
		run(i)
	}
	for {
		d.sched.mu.Lock()
		n := len(d.sched.prefillQ)
		d.sched.mu.Unlock()
		if n == len(plans)-1 {
			break
		}
		runtime.Gosched()
	}
	d.sched.turnMu.Unlock()
	wg.Wait()
	sameAnswers(t, got, want)
	d.sched.mu.Lock()
	widest := d.sched.widest
	d.sched.mu.Unlock()
	if widest != 3 {
		t.Fatalf("at most %d prompts prefilled side by side, want 3 (prefill_parallel)", widest)
	}
	waitIdle(t, d)
}

// sameAnswers fails unless every batched request succeeded with the
// answer (text, usage, finish reason) it gives alone.
func sameAnswers(t *testing.T, got []batchResult, want []engine.ChatResponse) {
	t.Helper()
	for i := range got {
		if got[i].err != nil {
			t.Fatalf("request %d: %v", i, got[i].err)
		}
		g, w := got[i].resp, want[i]
		if g.Message.Content != w.Message.Content || g.Usage != w.Usage || g.FinishReason != w.FinishReason {
			t.Errorf("request %d: batched %q (%+v, %s), alone %q (%+v, %s)", i, g.Message.Content, g.Usage, g.FinishReason, w.Message.Content, w.Usage, w.FinishReason)
		}
	}
}

package onnx

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// benchAnswerTokens is the answer length of the batching benchmarks.
const benchAnswerTokens = 64

// benchLlamaDir returns the SmolLM2-135M-shaped benchmark model, generating
// it on first use into ~/.cache/infermesh/models/bench-smollm2-135m (about
// 650 MB; a temporary folder renamed into place, so a crashed run leaves
// nothing half-written behind the name).
func benchLlamaDir(tb testing.TB) string {
	tb.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		tb.Fatal(err)
	}
	dir := filepath.Join(cache, "infermesh", "models", "bench-smollm2-135m")
	if _, err := os.Stat(filepath.Join(dir, "manifest.json")); err == nil {
		return dir
	}
	script, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "models", "gen_bench_llama.py"))
	if err != nil {
		tb.Fatal(err)
	}
	python := os.Getenv("INFERMESH_PYTHON")
	if python == "" {
		python = "/usr/bin/python3"
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		tb.Fatal(err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".bench-smollm2-135m-")
	if err != nil {
		tb.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	if out, err := exec.Command(python, script, tmp).CombinedOutput(); err != nil {
		tb.Fatalf("run %s: %v\n%s", script, err, out)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "manifest.json")); serr != nil {
			tb.Fatal(err) // not another process winning the race
		}
	}
	return dir
}

// streamTiming is what one streamed request measured.
type streamTiming struct {
	ttft   time.Duration // request start to the first content delta
	tpot   time.Duration // mean time between tokens after the first
	tokens int
}

// timedChat runs req streaming and times it; once progressAt content
// deltas have arrived (or the answer ended), progress (if not nil) is
// closed.
func timedChat(b *testing.B, d *decoder, req engine.ChatRequest, progressAt int, progress chan struct{}) streamTiming {
	start := time.Now()
	var first, last time.Time
	n := 0
	resp, err := d.Chat(context.Background(), req, func(dl engine.ChatDelta) error {
		if dl.Content == "" {
			return nil
		}
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		last = now
		if n++; progress != nil && n == progressAt {
			close(progress)
		}
		return nil
	})
	if err != nil {
		b.Error(err)
	}
	if progress != nil && n < progressAt {
		close(progress)
	}
	t := streamTiming{tokens: resp.Usage.CompletionTokens}
	if !first.IsZero() {
		t.ttft = first.Sub(start)
		if t.tokens > 1 {
			t.tpot = last.Sub(first) / time.Duration(t.tokens-1)
		}
	}
	return t
}

// benchPrompt is stream i's question (distinct, so answers differ).
func benchPrompt(i int) []engine.ChatMessage {
	topics := []string{"the weather in Paris", "a farmer at the market", "the old stone bridge", "gossip between nodes",
		"the baker and the oven", "counting to ten", "a cold morning", "cheap flights to Rome"}
	return userMsg(fmt.Sprintf("Tell me about %s, please.", topics[i%len(topics)]))
}

// BenchmarkChatBatching measures continuous batching on the generated
// SmolLM2-135M-shaped decoder with 64-token greedy answers, in three
// scenarios that every iteration runs in turn (rotating which goes first,
// so a burst of load from other processes falls on all of them alike):
//   - single: one request alone;
//   - burst: eight requests start together;
//   - staggered: request k starts when request k-1 has streamed 8 tokens
//     (arrivals spread over one answer, as with users who do not press
//     enter at the same instant).
//
// An untimed request first warms the session up. Metrics per scenario:
// tok/s (completion tokens per second of wall time), tpot_ms (mean
// per-stream time per output token after the first), ttft_ms (mean time
// to the first token). The ratios of the 8-stream scenarios to single in
// the same iteration — x-tok/s (target ≥ 3), x-tpot (≤ 2), x-ttft (≤ 3) —
// are reported as medians over iterations and logged per iteration. It
// runs with thread_spinning off (the default) and on, one sub-benchmark
// each (the model is loaded for each in turn).
func BenchmarkChatBatching(b *testing.B) {
	for _, spin := range []string{"off", "on"} {
		b.Run(spinningOption+"="+spin, func(b *testing.B) {
			benchChatBatching(b, map[string]string{"prefix_cache_mb": "0", spinningOption: spin})
		})
	}
}

// benchChatBatching is BenchmarkChatBatching on a decoder with opts.
func benchChatBatching(b *testing.B, opts map[string]string) {
	d := loadTinyLlamaOpts(b, benchLlamaDir(b), opts)
	if _, err := d.Chat(context.Background(), engine.ChatRequest{Messages: benchPrompt(0), MaxTokens: 4, Temperature: temp(0)}, nil); err != nil {
		b.Fatal(err)
	}
	type scenario struct {
		name      string
		streams   int
		staggered bool
	}
	scenarios := []scenario{{"single", 1, false}, {"burst", 8, false}, {"staggered", 8, true}}
	type measure struct{ toks, tpot, ttft float64 }
	run := func(sc scenario) measure {
		res := make([]streamTiming, sc.streams)
		var wg sync.WaitGroup
		start := time.Now()
		prev := make(chan struct{})
		close(prev)
		for i := range sc.streams {
			var mine chan struct{}
			if sc.staggered {
				<-prev
				mine = make(chan struct{})
				prev = mine
			}
			req := engine.ChatRequest{Messages: benchPrompt(i), MaxTokens: benchAnswerTokens, Temperature: temp(0)}
			wg.Go(func() { res[i] = timedChat(b, d, req, benchAnswerTokens/8, mine) })
		}
		wg.Wait()
		wall := time.Since(start)
		var tokens int
		var ttft, tpot time.Duration
		for _, t := range res {
			tokens += t.tokens
			ttft += t.ttft
			tpot += t.tpot
		}
		n := time.Duration(len(res))
		return measure{toks: float64(tokens) / wall.Seconds(), tpot: float64(tpot/n) / 1e6, ttft: float64(ttft/n) / 1e6}
	}
	var rounds [][]measure
	for b.Loop() {
		m := make([]measure, len(scenarios))
		for k := range scenarios {
			i := (k + len(rounds)) % len(scenarios)
			m[i] = run(scenarios[i])
		}
		rounds = append(rounds, m)
		for i, sc := range scenarios[1:] {
			x := m[i+1]
			b.Logf("round %d %s: x-tok/s %.2f x-tpot %.2f x-ttft %.2f (single %.1f tok/s, tpot %.0f ms, ttft %.0f ms)",
				len(rounds), sc.name, x.toks/m[0].toks, x.tpot/m[0].tpot, x.ttft/m[0].ttft, m[0].toks, m[0].tpot, m[0].ttft)
		}
	}
	median := func(f func(m []measure) float64) float64 {
		v := make([]float64, len(rounds))
		for i, m := range rounds {
			v[i] = f(m)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	for i, sc := range scenarios {
		b.ReportMetric(median(func(m []measure) float64 { return m[i].toks }), sc.name+"-tok/s")
		b.ReportMetric(median(func(m []measure) float64 { return m[i].tpot }), sc.name+"-tpot_ms")
		b.ReportMetric(median(func(m []measure) float64 { return m[i].ttft }), sc.name+"-ttft_ms")
		if i > 0 {
			b.ReportMetric(median(func(m []measure) float64 { return m[i].toks / m[0].toks }), sc.name+"-x-tok/s")
			b.ReportMetric(median(func(m []measure) float64 { return m[i].tpot / m[0].tpot }), sc.name+"-x-tpot")
			b.ReportMetric(median(func(m []measure) float64 { return m[i].ttft / m[0].ttft }), sc.name+"-x-ttft")
		}
	}
	b.ReportMetric(0, "ns/op")
	st := d.BatchStats()
	b.Logf("batch stats: %+v (mean rows per step %.2f)", st, float64(st.StepRows)/float64(max(1, st.Steps)))
}

// benchConversation is a conversation of about 1,000 prompt tokens on the
// test tokenizer, ending with an assistant turn.
func benchConversation() []engine.ChatMessage {
	para := []string{
		"Every node keeps a table of its peers: their names, their addresses, how many requests they are serving, which models they have loaded and how fast they answered recently.",
		"The table travels between nodes by gossip, a little at a time, so it is never exact but always close.",
		"It was a cold morning in the mountains. The river ran fast under the old stone bridge, and the village was still asleep.",
		"A farmer walked to the market with a basket of apples, bread and cheese. The baker had already lit the oven.",
	}
	msgs := []engine.ChatMessage{{Role: "system", Content: "You are a helpful assistant who answers questions about the mesh. " + strings.Join(para, " ")}}
	for i := range 4 {
		msgs = append(msgs,
			engine.ChatMessage{Role: "user", Content: fmt.Sprintf("Question %d: %s What does that mean for a request?", i+1, para[i%len(para)])},
			engine.ChatMessage{Role: "assistant", Content: para[(i+1)%len(para)] + " " + para[(i+2)%len(para)]})
	}
	return msgs
}

// BenchmarkChatPrefixFollowUp measures the time to the first token of a
// follow-up turn of a ~1,000-token conversation, without the prefix cache
// (cold_ttft_ms) and with the conversation so far cached (hit_ttft_ms; the
// earlier turns' prompt was served once before). speedup is cold / hit
// (target ≥ 4). Each iteration asks a new question, so only the history
// can hit.
func BenchmarkChatPrefixFollowUp(b *testing.B) {
	dir := benchLlamaDir(b)
	cold := loadTinyLlamaOpts(b, dir, map[string]string{"prefix_cache_mb": "0"})
	warm := loadTinyLlamaOpts(b, dir, map[string]string{"prefix_cache_mb": "256"})
	history := benchConversation()
	if _, err := warm.Chat(context.Background(), engine.ChatRequest{Messages: history[:len(history)-1], MaxTokens: 1, Temperature: temp(0)}, nil); err != nil {
		b.Fatal(err)
	}
	var coldT, hitT []time.Duration
	prompt := 0
	i := 0
	for b.Loop() {
		i++
		req := engine.ChatRequest{Messages: append(append([]engine.ChatMessage(nil), history...),
			engine.ChatMessage{Role: "user", Content: fmt.Sprintf("And what about question %d?", 100+i)}), MaxTokens: 1, Temperature: temp(0)}
		start := time.Now()
		resp, err := cold.Chat(context.Background(), req, nil)
		if err != nil {
			b.Fatal(err)
		}
		coldT = append(coldT, time.Since(start))
		prompt = resp.Usage.PromptTokens
		start = time.Now()
		if _, err := warm.Chat(context.Background(), req, nil); err != nil {
			b.Fatal(err)
		}
		hitT = append(hitT, time.Since(start))
	}
	med := func(v []time.Duration) time.Duration {
		sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
		return v[len(v)/2]
	}
	c, h := med(coldT), med(hitT)
	b.ReportMetric(float64(c)/1e6, "cold_ttft_ms")
	b.ReportMetric(float64(h)/1e6, "hit_ttft_ms")
	b.ReportMetric(float64(c)/float64(h), "speedup")
	b.ReportMetric(float64(prompt), "prompt_tokens")
	b.ReportMetric(0, "ns/op")
	st := warm.PrefixStats()
	b.Logf("prefix stats: %+v", st)
}

// BenchmarkChatPrefillParallel compares the prefill policies of the
// scheduler on the ChatBatching workload: the model loaded once per
// prefill_parallel setting (1: one waiting prompt's chunk per turn, the
// earlier scheduler; 2: the default), and each iteration runs, for every
// setting in turn (rotating which goes first), one stream alone and a
// burst of 8. Ratios divide each setting's burst figures by the mean of
// the iteration's lone streams (all settings), so the settings share a
// denominator; medians over iterations are reported and every iteration
// is logged.
//
//	go test ./node/engine/onnx -run '^$' -bench ChatPrefillParallel -benchtime 4x
func BenchmarkChatPrefillParallel(b *testing.B) {
	dir := benchLlamaDir(b)
	settings := []string{"1", "2"}
	ds := make([]*decoder, len(settings))
	for i, lanes := range settings {
		ds[i] = loadTinyLlamaOpts(b, dir, map[string]string{"prefix_cache_mb": "0", "prefill_parallel": lanes})
		if _, err := ds[i].Chat(context.Background(), engine.ChatRequest{Messages: benchPrompt(0), MaxTokens: 4, Temperature: temp(0)}, nil); err != nil {
			b.Fatal(err)
		}
	}
	type measure struct{ toks, tpot, ttft float64 }
	run := func(d *decoder, streams int) measure {
		res := make([]streamTiming, streams)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range streams {
			req := engine.ChatRequest{Messages: benchPrompt(i), MaxTokens: benchAnswerTokens, Temperature: temp(0)}
			wg.Go(func() { res[i] = timedChat(b, d, req, 0, nil) })
		}
		wg.Wait()
		wall := time.Since(start)
		var m measure
		for _, t := range res {
			m.toks += float64(t.tokens)
			m.tpot += float64(t.tpot) / 1e6 / float64(streams)
			m.ttft += float64(t.ttft) / 1e6 / float64(streams)
		}
		m.toks /= wall.Seconds()
		return m
	}
	ratios := make([][][3]float64, len(settings)) // setting, iteration: x-tok/s, x-tpot, x-ttft
	round := 0
	for b.Loop() {
		single := make([]measure, len(settings))
		burst := make([]measure, len(settings))
		for k := range settings {
			i := (k + round) % len(settings)
			single[i] = run(ds[i], 1)
			burst[i] = run(ds[i], 8)
		}
		var one measure
		for _, m := range single {
			one.toks += m.toks / float64(len(single))
			one.tpot += m.tpot / float64(len(single))
			one.ttft += m.ttft / float64(len(single))
		}
		for i, lanes := range settings {
			x := [3]float64{burst[i].toks / one.toks, burst[i].tpot / one.tpot, burst[i].ttft / one.ttft}
			ratios[i] = append(ratios[i], x)
			b.Logf("round %d prefill_parallel=%s: x-tok/s %.2f x-tpot %.2f x-ttft %.2f (burst ttft %.0f ms, tpot %.0f ms; lone streams ttft %.0f ms, tpot %.0f ms)",
				round+1, lanes, x[0], x[1], x[2], burst[i].ttft, burst[i].tpot, one.ttft, one.tpot)
		}
		round++
	}
	for i, lanes := range settings {
		for j, name := range []string{"x-tok/s", "x-tpot", "x-ttft"} {
			v := make([]float64, len(ratios[i]))
			for k, x := range ratios[i] {
				v[k] = x[j]
			}
			sort.Float64s(v)
			b.ReportMetric(v[len(v)/2], "p"+lanes+"-"+name)
		}
	}
	b.ReportMetric(0, "ns/op")
}

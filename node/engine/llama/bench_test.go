package llama

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// benchGGUF returns the SmolLM2-135M-shaped random-weight GGUF in ftype
// ("f32", "q8_0", "q4_0"), generating it on first use into
// <cache>/models/bench-smollm2-gguf (gen_tiny_gguf.py --shape
// smollm2-135m, then llama_model_quantize; a temporary folder renamed into
// place).
func benchGGUF(b *testing.B, lib *Lib, ftype string) string {
	b.Helper()
	dir := filepath.Join(filepath.Dir(testTinyDirNoCheck()), "bench-smollm2-gguf")
	path := filepath.Join(dir, "model-"+ftype+".gguf")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	f32 := filepath.Join(dir, "model-f32.gguf")
	if _, err := os.Stat(f32); err != nil {
		tmp, err := os.MkdirTemp(dir, ".gen-")
		if err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(tmp)
		script, _ := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "models", "gen_tiny_gguf.py"))
		if out, err := exec.Command("/usr/bin/python3", script, tmp, "--shape", "smollm2-135m").CombinedOutput(); err != nil {
			b.Fatalf("%s: %v\n%s", script, err, out)
		}
		if err := os.Rename(filepath.Join(tmp, "model.gguf"), f32); err != nil {
			b.Fatal(err)
		}
	}
	if ftype == "f32" {
		return f32
	}
	types := map[string]int{"q8_0": 7, "q4_0": 2, "q4_k_m": 15}
	tmp := path + ".tmp"
	if err := lib.Quantize(f32, tmp, types[ftype], runtime.NumCPU()); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		b.Fatal(err)
	}
	return path
}

// testTinyDirNoCheck is where the tiny model lives (its folder's parent is
// the cache's models folder).
func testTinyDirNoCheck() string {
	cache := os.Getenv("INFERMESH_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "infermesh")
	}
	return filepath.Join(cache, "models", "tiny-gguf")
}

// benchEngine loads path as a chat engine with options.
func benchEngine(b *testing.B, r *Runtime, path string, opts map[string]string) *chatEngine {
	b.Helper()
	e, err := r.loadChat(engine.Spec{ID: "gguf/bench/x", Task: engine.TaskChat, Dir: filepath.Dir(path),
		Files: map[string]string{"model": filepath.Base(path)}, Options: opts})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return e
}

const benchTokens = 32

// benchRequest is a greedy request that decodes exactly benchTokens tokens
// (the tiny vocabulary's end ids are masked out by nothing: a random model
// rarely ends early; usage tells the real count).
func benchRequest(i int) engine.ChatRequest {
	z := 0.0
	return engine.ChatRequest{Messages: user(fmt.Sprintf("Stream %d: tell me about the mesh.", i)), MaxTokens: benchTokens, Temperature: &z}
}

// bareLoop decodes n tokens greedily for each of the prompts at once with
// llama.cpp directly: every prompt in one decode, then one decode per step
// with a token per sequence — the ceiling the engine is measured against.
// It returns the time taken (prefill included) and the tokens generated.
func bareLoop(b *testing.B, c *Context, prompts [][]int64, n int) (time.Duration, int) {
	b.Helper()
	c.Clear()
	start := time.Now()
	bt := c.Batch()
	last := make([]int, len(prompts))
	for s, p := range prompts {
		for i, id := range p {
			last[s] = bt.Add(int32(id), i, s, i == len(p)-1)
		}
	}
	if err := c.Decode(); err != nil {
		b.Fatal(err)
	}
	next := make([]int32, len(prompts))
	argmax := func(lg []float32) int32 {
		best := 0
		for i := range lg {
			if lg[i] > lg[best] {
				best = i
			}
		}
		return int32(best)
	}
	for s := range prompts {
		next[s] = argmax(c.Logits(last[s]))
	}
	for step := 1; step < n; step++ {
		bt := c.Batch()
		for s, p := range prompts {
			bt.Add(next[s], len(p)+step-1, s, true)
		}
		if err := c.Decode(); err != nil {
			b.Fatal(err)
		}
		for s := range prompts {
			next[s] = argmax(c.Logits(s))
		}
	}
	return time.Since(start), n * len(prompts)
}

// engineRun runs streams concurrent greedy streamed requests through the
// engine and returns the time until the last one ended (prefill included)
// and the tokens generated (usage).
func engineRun(b *testing.B, e *chatEngine, streams int) (time.Duration, int) {
	b.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	tokens := 0
	start := time.Now()
	for i := range streams {
		wg.Go(func() {
			resp, err := e.Chat(context.Background(), benchRequest(i), func(engine.ChatDelta) error { return nil })
			if err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			tokens += resp.Usage.CompletionTokens
			mu.Unlock()
		})
	}
	wg.Wait()
	return time.Since(start), tokens
}

// BenchmarkGGUFDecode compares decoding through the engine (scheduler,
// sampling, detokenising, streaming) with a bare llama.cpp loop over the
// same library, file, threads and context settings, in alternating
// rounds, for 1 and 8 streams, Q8_0 and Q4_0. Metrics: tokens/s of each
// (generated tokens over the whole requests, prefill included, 32 tokens
// per stream) and their ratio (engine/bare).
func BenchmarkGGUFDecode(b *testing.B) {
	r, err := NewRuntime(testLibDir(b), Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	for _, ft := range []string{"q8_0", "q4_0"} {
		path := benchGGUF(b, r.lib, ft)
		for _, streams := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/streams=%d", ft, streams), func(b *testing.B) {
				e := benchEngine(b, r, path, map[string]string{"max_batch": "8"})
				threads, poll, _ := r.threads(nil)
				bare, err := e.lm.NewContext(ContextConfig{Context: defaultKVCells + 2*defaultContext, Sequences: 8 + defaultPrefixSequences, Batch: 1024, Threads: threads, Poll: poll, Unified: true})
				if err != nil {
					b.Fatal(err)
				}
				defer bare.Free()
				prompts := make([][]int64, streams)
				for i := range prompts {
					plan, err := e.model.Prepare(benchRequest(i))
					if err != nil {
						b.Fatal(err)
					}
					prompts[i] = plan.Prompt
				}
				e.sched.mu.Lock()
				dec0 := e.sched.decodeTime
				e.sched.mu.Unlock()
				var engD, bareD time.Duration
				var engN, bareN int
				for b.Loop() {
					d, n := engineRun(b, e, streams)
					engD, engN = engD+d, engN+n
					d, n = bareLoop(b, bare, prompts, benchTokens)
					bareD, bareN = bareD+d, bareN+n
				}
				et, bt := float64(engN)/engD.Seconds(), float64(bareN)/bareD.Seconds()
				b.ReportMetric(et, "engine_tok/s")
				b.ReportMetric(bt, "bare_tok/s")
				b.ReportMetric(et/bt, "ratio")
				e.sched.mu.Lock()
				b.ReportMetric(float64((e.sched.decodeTime-dec0).Milliseconds())/float64(b.N), "engine_decode_ms/round")
				e.sched.mu.Unlock()
				b.ReportMetric(float64(bareD.Milliseconds())/float64(b.N), "bare_ms/round")
				b.ReportMetric(float64(engD.Milliseconds())/float64(b.N), "engine_ms/round")
				st := e.BatchStats()
				b.ReportMetric(float64(st.StepRows)/float64(st.Steps), "rows/step")
			})
		}
	}
}

// busy starts a process that keeps one core busy until the benchmark ends.
func busy(b *testing.B) {
	b.Helper()
	cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
}

// BenchmarkGGUFThreads measures single-stream decode through the engine
// (Q8_0) for thread counts and poll levels, on the machine as it is and
// with another process holding one core busy, the settings alternating
// round by round within each case.
func BenchmarkGGUFThreads(b *testing.B) {
	r, err := NewRuntime(testLibDir(b), Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	path := benchGGUF(b, r.lib, "q8_0")
	type setting struct{ threads, poll int }
	settings := []setting{{runtime.NumCPU(), 0}, {runtime.NumCPU(), 50}, {1, 0}}
	for _, load := range []string{"idle", "busy"} {
		b.Run(load, func(b *testing.B) {
			engines := make([]*chatEngine, len(settings))
			for i, s := range settings {
				engines[i] = benchEngine(b, r, path, map[string]string{"max_batch": "1",
					"threads": fmt.Sprint(s.threads), "poll": fmt.Sprint(s.poll)})
			}
			if load == "busy" {
				busy(b)
			}
			d := make([]time.Duration, len(settings))
			n := make([]int, len(settings))
			for b.Loop() {
				for i, e := range engines {
					dd, nn := engineRun(b, e, 1)
					d[i] += dd
					n[i] += nn
				}
			}
			for i, s := range settings {
				b.ReportMetric(float64(n[i])/d[i].Seconds(), fmt.Sprintf("t%d_poll%d_tok/s", s.threads, s.poll))
			}
		})
	}
}

// BenchmarkGGUFPrefixFollowUp times the first token of a follow-up turn
// of a ~1,000-token conversation with the prefix cache on and off (Q8_0,
// alternating rounds). The first turn runs on each engine before every
// round so the "on" engine has it cached.
func BenchmarkGGUFPrefixFollowUp(b *testing.B) {
	r, err := NewRuntime(testLibDir(b), Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	path := benchGGUF(b, r.lib, "q8_0")
	on := benchEngine(b, r, path, map[string]string{"max_batch": "2"})
	off := benchEngine(b, r, path, map[string]string{"max_batch": "2", "prefix_cache_tokens": "0"})
	z := 0.0
	long := ""
	for i := 0; len(long) < 4200; i++ {
		long += fmt.Sprintf("Note %d: the mesh forwards each request to the least busy node that holds the model. ", i)
	}
	turn1 := engine.ChatRequest{Messages: user(long), MaxTokens: 8, Temperature: &z}
	ttft := func(e *chatEngine) time.Duration {
		first, err := e.Chat(context.Background(), turn1, nil)
		if err != nil {
			b.Fatal(err)
		}
		req := engine.ChatRequest{Messages: []engine.ChatMessage{{Role: engine.RoleUser, Content: long},
			{Role: engine.RoleAssistant, Content: first.Message.Content}, {Role: engine.RoleUser, Content: "And then?"}},
			MaxTokens: 2, Temperature: &z}
		start := time.Now()
		var got time.Duration
		if _, err := e.Chat(context.Background(), req, func(d engine.ChatDelta) error {
			if got == 0 && (d.Content != "" || d.FinishReason != "") {
				got = time.Since(start)
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		return got
	}
	var dOn, dOff time.Duration
	for b.Loop() {
		dOn += ttft(on)
		dOff += ttft(off)
	}
	b.ReportMetric(float64(dOn.Milliseconds())/float64(b.N), "ttft_on_ms")
	b.ReportMetric(float64(dOff.Milliseconds())/float64(b.N), "ttft_off_ms")
	b.ReportMetric(dOff.Seconds()/dOn.Seconds(), "speedup")
}

package onnx

import (
	"context"
	"fmt"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// cpuTime is the process's user and system CPU time so far (every thread:
// Go's and ONNX Runtime's).
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// medianMS is the median of v in milliseconds.
func medianMS(v []time.Duration) float64 {
	s := append([]time.Duration(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(s[len(s)/2]) / 1e6
}

// BenchmarkDecodeStep splits the batching benchmark's costs on the
// generated SmolLM2-135M-shaped decoder into its parts, without the
// scheduler: the prefill of one bench prompt (60 tokens) and one decode
// step of 1 and of 8 rows (each row that prompt's cache), for three
// session settings, run in turn each round (rotating which goes first):
//   - pool/nospin: ONNX Runtime's intra-op pool (one thread per core), idle
//     threads sleep (the decoder's default, thread_spinning off);
//   - pool/spin: the same with ONNX Runtime's default spinning threads;
//   - threads=1: one intra-op thread (Config.IntraOpThreads 1).
//
// Metrics per setting (medians over rounds): prefill, step1 and step8 wall
// milliseconds, the same in process CPU milliseconds (cpu-*; on a shared
// machine CPU time is what other processes cannot inflate), and
// step8/step1 and prefill/step1 ratios of wall times.
//
//	go test ./node/engine/onnx -run '^$' -bench DecodeStep -benchtime 4x
func BenchmarkDecodeStep(b *testing.B) {
	dir := benchLlamaDir(b)
	type setting struct {
		name string
		d    *decoder
	}
	var settings []setting
	for _, c := range []struct {
		name    string
		threads int
		spin    string
	}{{"pool/nospin", 0, "off"}, {"pool/spin", 0, "on"}, {"threads=1", 1, "off"}} {
		r := testRuntime(b, Config{IntraOpThreads: c.threads})
		spec := manifestSpec(b, dir)
		spec.Options[spinningOption] = c.spin
		spec.Options["prefix_cache_mb"] = "0"
		ch, err := r.LoadChat(spec)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ch.Close() })
		settings = append(settings, setting{c.name, ch.(*decoder)})
	}
	plan, err := settings[0].d.model.Prepare(engine.ChatRequest{Messages: benchPrompt(0), MaxTokens: benchAnswerTokens})
	if err != nil {
		b.Fatal(err)
	}
	const steps = 4 // timed steps per batch
	type timings struct{ prefill, step1, step8, cpuPrefill, cpuStep1, cpuStep8 []time.Duration }
	res := make([]timings, len(settings))
	round := 0
	for b.Loop() {
		for k := range settings {
			i := (k + round) % len(settings)
			d, t := settings[i].d, &res[i]
			kv, err := d.newStream(len(plan.Prompt) + steps + 1)
			if err != nil {
				b.Fatal(err)
			}
			w0, c0 := time.Now(), cpuTime(b)
			if _, err := kv.Forward(context.Background(), plan.Prompt); err != nil {
				b.Fatal(err)
			}
			t.prefill = append(t.prefill, time.Since(w0))
			t.cpuPrefill = append(t.cpuPrefill, cpuTime(b)-c0)
			for _, rows := range []int{1, 8} {
				batch, err := newBatchKV(d)
				if err != nil {
					b.Fatal(err)
				}
				for range rows {
					batch.join(&seq{}, kv)
				}
				tokens := make([]int64, rows)
				if _, err := batch.step(tokens); err != nil { // untimed: buffers grow
					b.Fatal(err)
				}
				w0, c0 := time.Now(), cpuTime(b)
				for range steps {
					if _, err := batch.step(tokens); err != nil {
						b.Fatal(err)
					}
				}
				wall, cpu := time.Since(w0)/steps, (cpuTime(b)-c0)/steps
				if rows == 1 {
					t.step1, t.cpuStep1 = append(t.step1, wall), append(t.cpuStep1, cpu)
				} else {
					t.step8, t.cpuStep8 = append(t.step8, wall), append(t.cpuStep8, cpu)
				}
				batch.close()
			}
			kv.close()
		}
		round++
	}
	for i, s := range settings {
		t := res[i]
		p := func(metric string) string { return fmt.Sprintf("%s-%s", s.name, metric) }
		b.ReportMetric(medianMS(t.prefill), p("prefill_ms"))
		b.ReportMetric(medianMS(t.step1), p("step1_ms"))
		b.ReportMetric(medianMS(t.step8), p("step8_ms"))
		b.ReportMetric(medianMS(t.cpuPrefill), p("cpu-prefill_ms"))
		b.ReportMetric(medianMS(t.cpuStep1), p("cpu-step1_ms"))
		b.ReportMetric(medianMS(t.cpuStep8), p("cpu-step8_ms"))
		b.ReportMetric(medianMS(t.step8)/medianMS(t.step1), p("step8/step1"))
		b.ReportMetric(medianMS(t.prefill)/medianMS(t.step1), p("prefill/step1"))
	}
	b.ReportMetric(0, "ns/op")
}

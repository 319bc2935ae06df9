package onnx

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// Settings of BenchmarkEmbeddingsBatcher: the batched side; the other side
// is MaxBatch 1. Both sides use the same session threads.
const (
	benchConcurrency = 16
	benchMaxBatch    = 32
	benchMaxWait     = 2 * time.Millisecond
)

// loadStats summarises one closed-loop load run.
type loadStats struct {
	reqPerSec float64
	p50, p99  time.Duration
}

// driveLoad sends n single-text Embed calls from conc goroutines, each
// sending its next call as soon as the previous one returns.
func driveLoad(b *testing.B, e engine.Embedder, n, conc int, texts []string) loadStats {
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				t0 := time.Now()
				_, err := e.Embed(context.Background(), engine.EmbedRequest{Texts: []string{texts[i%len(texts)]}})
				lat[i] = time.Since(t0)
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(n-1, int(p*float64(n)))] }
	return loadStats{reqPerSec: float64(n) / elapsed.Seconds(), p50: pct(0.50), p99: pct(0.99)}
}

// BenchmarkEmbeddingsBatcher serves the same closed-loop load (16 callers,
// one text per call) with the dynamic batcher (MaxBatch 32, MaxWait 2ms) and
// with MaxBatch 1 (no batching) in the same run, and reports both sides and
// the ratios x_throughput = batched req/s / batch-1 req/s and x_p99 =
// batched p99 / batch-1 p99 (lower is better). Sub-benchmarks cover short
// queries (3 to 9 words) and sentences (3 to 43 words), each with ONNX
// Runtime's default intra-op threads (one run at a time on a pool of one
// thread per core) and with one thread per run (one run per core at once),
// on two model shapes: "minilm" (the all-MiniLM-L6-v2 architecture, the
// size class real embedding models have) and "tiny" (the fast test model,
// where a session run is so cheap that only its fixed cost can be batched).
// Run with a fixed count for steady numbers:
//
//	go test -run '^$' -bench EmbeddingsBatcher -benchtime 4000x ./node/engine/onnx
func BenchmarkEmbeddingsBatcher(b *testing.B) {
	forEachEmbedCase(b, 512, benchmarkBatcher)
}

// forEachEmbedCase runs bench as a sub-benchmark for each model shape
// ("minilm", "tiny"), workload (queries: 3 to 9 words; sentences: 3 to 43,
// n texts each) and intra-op thread setting (ORT default, 1).
func forEachEmbedCase(b *testing.B, n int, bench func(b *testing.B, dir string, texts []string, threads int)) {
	for _, shape := range []string{"minilm", "tiny"} {
		dir := genBERT(b, shape)
		for _, load := range []struct {
			name   string
			spread int
		}{{"queries", 6}, {"sentences", 40}} {
			texts := testTexts(n, load.spread)
			for _, threads := range []int{0, 1} {
				b.Run(fmt.Sprintf("%s/%s/threads=%d", shape, load.name, threads), func(b *testing.B) {
					bench(b, dir, texts, threads)
				})
			}
		}
	}
}

func benchmarkBatcher(b *testing.B, dir string, texts []string, threads int) {
	base := loadTinyBERT(b, testRuntime(b, Config{MaxBatch: 1, IntraOpThreads: threads}), dir, nil)
	batched := loadTinyBERT(b, testRuntime(b, Config{
		MaxBatch: benchMaxBatch, MaxWaitMicros: int(benchMaxWait / time.Microsecond), IntraOpThreads: threads,
	}), dir, nil)
	for _, e := range []engine.Embedder{base, batched} { // warm up both sessions
		driveLoad(b, e, 4*benchConcurrency, benchConcurrency, texts)
	}
	b.ResetTimer()
	one := driveLoad(b, base, b.N, benchConcurrency, texts)
	many := driveLoad(b, batched, b.N, benchConcurrency, texts)
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(one.reqPerSec, "batch1_req/s")
	b.ReportMetric(many.reqPerSec, "batched_req/s")
	b.ReportMetric(ms(one.p50), "batch1_p50_ms")
	b.ReportMetric(ms(many.p50), "batched_p50_ms")
	b.ReportMetric(ms(one.p99), "batch1_p99_ms")
	b.ReportMetric(ms(many.p99), "batched_p99_ms")
	b.ReportMetric(many.reqPerSec/one.reqPerSec, "x_throughput")
	b.ReportMetric(ms(many.p99)/ms(one.p99), "x_p99")
}

// BenchmarkEmbeddingsBatchCeiling measures what batching can gain at all on
// this machine, without the batcher's queueing: one caller embeds the same
// texts as 16-text calls (each call runs as one batch, split only by
// length) and as 1-text calls, in the same run. x_ceiling = texts/s in
// 16-text calls / texts/s in 1-text calls is the most a dynamic batcher
// at concurrency 16 could give over batch size 1.
//
//	go test -run '^$' -bench EmbeddingsBatchCeiling -benchtime 50x ./node/engine/onnx
func BenchmarkEmbeddingsBatchCeiling(b *testing.B) {
	forEachEmbedCase(b, benchConcurrency*8, func(b *testing.B, dir string, texts []string, threads int) {
		e := loadTinyBERT(b, testRuntime(b, Config{MaxBatch: benchMaxBatch, IntraOpThreads: threads}), dir, nil)
		pass := func(per int) time.Duration {
			t0 := time.Now()
			for i := 0; i < len(texts); i += per {
				if _, err := e.Embed(context.Background(), engine.EmbedRequest{Texts: texts[i:min(i+per, len(texts))]}); err != nil {
					b.Fatal(err)
				}
			}
			return time.Since(t0)
		}
		pass(1) // warm up
		pass(benchConcurrency)
		var one, many time.Duration
		b.ResetTimer()
		for range b.N {
			one += pass(1)
			many += pass(benchConcurrency)
		}
		b.StopTimer()
		n := float64(b.N * len(texts))
		b.ReportMetric(n/one.Seconds(), "batch1_texts/s")
		b.ReportMetric(n/many.Seconds(), "batch16_texts/s")
		b.ReportMetric(one.Seconds()/many.Seconds(), "x_ceiling")
	})
}

// BenchmarkEmbeddingsThreadDefaults compares the node's default thread
// setting (IntraOpThreads 0: one single-threaded run per core for
// embeddings) with the old default (ONNX Runtime's pool, one run at a
// time, now IntraOpThreads -1) under the same closed loop of 16 callers
// with the dynamic batcher on (the node's defaults: MaxBatch 32, MaxWait
// 2ms), on the MiniLM-size model, for short queries and for sentences.
// The b.N requests of each side are split into threadRounds rounds that
// alternate between the sides (and which side goes first), so a change in
// the machine's load reaches both. x_throughput = new default req/s / old
// default req/s; the per-round ratios give min_x and max_x.
//
//	go test -run '^$' -bench EmbeddingsThreadDefaults -benchtime 2000x ./node/engine/onnx
func BenchmarkEmbeddingsThreadDefaults(b *testing.B) {
	dir := genBERT(b, "minilm")
	for _, w := range []struct {
		name   string
		spread int
	}{{"queries", 6}, {"sentences", 40}} {
		b.Run(w.name, func(b *testing.B) {
			texts := testTexts(512, w.spread)
			load := func(threads int) engine.Embedder {
				return loadTinyBERT(b, testRuntime(b, Config{
					MaxBatch: benchMaxBatch, MaxWaitMicros: int(benchMaxWait / time.Microsecond), IntraOpThreads: threads,
				}), dir, nil)
			}
			old, auto := load(-1), load(0)
			for _, e := range []engine.Embedder{old, auto} {
				driveLoad(b, e, 4*benchConcurrency, benchConcurrency, texts)
			}
			per := max(benchConcurrency, b.N/threadRounds)
			var oldTime, autoTime time.Duration
			minX, maxX := 0.0, 0.0
			b.ResetTimer()
			for r := range threadRounds {
				sides := []engine.Embedder{old, auto}
				if r%2 == 1 {
					sides = []engine.Embedder{auto, old}
				}
				var took [2]time.Duration
				for _, e := range sides {
					s := driveLoad(b, e, per, benchConcurrency, texts)
					d := time.Duration(float64(per) / s.reqPerSec * float64(time.Second))
					if e == old {
						took[0] = d
					} else {
						took[1] = d
					}
				}
				oldTime += took[0]
				autoTime += took[1]
				x := took[0].Seconds() / took[1].Seconds()
				if r == 0 || x < minX {
					minX = x
				}
				maxX = max(maxX, x)
			}
			b.StopTimer()
			n := float64(per * threadRounds)
			b.ReportMetric(n/oldTime.Seconds(), "pool_req/s")
			b.ReportMetric(n/autoTime.Seconds(), "auto_req/s")
			b.ReportMetric(oldTime.Seconds()/autoTime.Seconds(), "x_throughput")
			b.ReportMetric(minX, "min_x")
			b.ReportMetric(maxX, "max_x")
		})
	}
}

// threadRounds is how many alternating rounds
// BenchmarkEmbeddingsThreadDefaults splits each side's requests into.
const threadRounds = 8

package onnx

import (
	"context"
	"testing"
	"time"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
)

const benchTokens = 128

// bareDecode is the baseline: the same session and prompt, prefill then
// greedy steps with present fed back as past through ping-pong buffers,
// with nothing else (no sampling beyond argmax, no text, no masks). It
// returns the tokens generated.
func bareDecode(tb testing.TB, d *decoder, prompt []int64, steps int) int {
	total := len(prompt) + steps
	per := d.kvHeads * total * d.headDim
	cur := make([][]float32, 2*d.layers)
	next := make([][]float32, 2*d.layers)
	for i := range cur {
		cur[i], next[i] = make([]float32, per), make([]float32, per)
	}
	mask := make([]int64, total)
	for i := range mask {
		mask[i] = 1
	}
	pos := make([]int64, total)
	for i := range pos {
		pos[i] = int64(i)
	}
	logits := make([]float32, len(prompt)*d.vocabRows)
	ids := prompt
	past := 0
	for step := 0; step < steps; step++ {
		s, t := len(ids), past+len(ids)
		var vals []ort.Value
		mk := func(v ort.Value, err error) {
			if err != nil {
				tb.Fatal(err)
			}
			vals = append(vals, v)
		}
		mk(ort.NewTensor(ort.NewShape(1, int64(s)), ids))
		mk(ort.NewTensor(ort.NewShape(1, int64(t)), mask[:t]))
		mk(ort.NewTensor(ort.NewShape(1, int64(s)), pos[past:t]))
		for _, b := range cur {
			mk(ort.NewTensor(ort.NewShape(1, int64(d.kvHeads), int64(past), int64(d.headDim)), b))
		}
		nIn := len(vals)
		mk(ort.NewTensor(ort.NewShape(1, int64(s), int64(d.vocabRows)), logits))
		for _, b := range next {
			mk(ort.NewTensor(ort.NewShape(1, int64(d.kvHeads), int64(t), int64(d.headDim)), b))
		}
		if err := d.sess.Run(vals[:nIn], vals[nIn:]); err != nil {
			tb.Fatal(err)
		}
		for _, v := range vals {
			v.Destroy()
		}
		row := logits[(s-1)*d.vocabRows : s*d.vocabRows]
		best := 0
		for i, x := range row[:d.model.Tok.VocabSize()] {
			if x > row[best] {
				best = i
			}
		}
		ids = []int64{int64(best)}
		cur, next = next, cur
		past = t
	}
	return steps
}

// BenchmarkChatDecode compares decode throughput through the engine
// (template, tokenizer, sampling, streaming text, stop handling) with the
// bare session loop on the same model, alternating the two in one run.
// Metrics: engine_tok/s, bare_tok/s and x_bare (engine / bare; target
// >= 0.9).
func BenchmarkChatDecode(b *testing.B) {
	benchDecode(b, engine.ResponseFormat{})
}

// BenchmarkChatDecodeJSON is the same with json_object constrained
// decoding (a token mask per step).
func BenchmarkChatDecodeJSON(b *testing.B) {
	benchDecode(b, engine.ResponseFormat{Type: engine.FormatJSONObject})
}

func benchDecode(b *testing.B, format engine.ResponseFormat) {
	_, d := loadTinyLlama(b, "fp32", Config{IntraOpThreads: 1})
	req := engine.ChatRequest{Messages: userMsg("Tell me about the weather in Paris."), MaxTokens: benchTokens, Temperature: temp(0), ResponseFormat: format}
	plan, err := d.model.Prepare(req)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var engTok, bareTok int
	var engTime, bareTime time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		resp, err := d.Chat(ctx, req, func(engine.ChatDelta) error { return nil })
		if err != nil {
			b.Fatal(err)
		}
		engTime += time.Since(start)
		engTok += resp.Usage.CompletionTokens
		start = time.Now()
		bareTok += bareDecode(b, d, plan.Prompt, resp.Usage.CompletionTokens)
		bareTime += time.Since(start)
	}
	e := float64(engTok) / engTime.Seconds()
	r := float64(bareTok) / bareTime.Seconds()
	b.ReportMetric(e, "engine_tok/s")
	b.ReportMetric(r, "bare_tok/s")
	b.ReportMetric(e/r, "x_bare")
}

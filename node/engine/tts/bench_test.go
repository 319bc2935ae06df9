package tts

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"
	"time"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

const benchText = "The quick brown fox jumps over the lazy dog. Inference runs on two cores."

// BenchmarkKokoroSynthesize compares the whole engine pipeline (espeak-ng
// G2P, the session pool, fades and joins) on a two-sentence text with a
// bare ONNX Runtime loop over the same phoneme ids and style rows on a
// session of its own. Each iteration makes one of each, in alternating
// order, so that load on a shared machine falls on both alike. ratio is
// bare time over pipeline time (1 = no overhead); ratio-median is the
// median of the per-iteration ratios and ratio-min the fastest bare run
// over the fastest pipeline run (the least disturbed of each); rtf is seconds of compute per second
// of audio. The API's own benchmark (node/api, BenchmarkSpeechAPIKokoro)
// adds request handling and encoding.
func BenchmarkKokoroSynthesize(b *testing.B) {
	k := loadKokoroT(b)
	ctx := context.Background()
	ids, styles, err := k.RunInputs(ctx, benchText, k.defaultVoice)
	if err != nil {
		b.Fatal(err)
	}
	opts, err := onnxtest.Runtime(b).SessionOptions()
	if err != nil {
		b.Fatal(err)
	}
	defer opts.Destroy()
	spec := kokoroSpec(b)
	sess, err := ort.NewDynamicAdvancedSession(filepath.Join(spec.Dir, spec.Files["model"]), []string{"input_ids", "style", "speed"}, []string{"waveform"}, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer sess.Destroy()
	samples := 0
	pipeline := func() time.Duration {
		t0 := time.Now()
		if err := k.Synthesize(ctx, engine.SpeechRequest{Text: benchText}, func([]float32) error { return nil }); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	bare := func() time.Duration {
		t0 := time.Now()
		samples = 0
		for i, in := range ids {
			idT, _ := ort.NewTensor(ort.NewShape(1, int64(len(in))), in)
			stT, _ := ort.NewTensor(ort.NewShape(1, kokoroStyleDim), styles[i])
			spT, _ := ort.NewTensor(ort.NewShape(1), []float32{1})
			outs := []ort.Value{nil}
			if err := sess.Run([]ort.Value{idT, stT, spT}, outs); err != nil {
				b.Fatal(err)
			}
			samples += len(outs[0].(*ort.Tensor[float32]).GetData())
			for _, v := range []ort.Value{idT, stT, spT, outs[0]} {
				v.Destroy()
			}
		}
		return time.Since(t0)
	}
	pipeline()
	bare()
	var pT, bT time.Duration
	pMin, bMin := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
	var ratios []float64
	b.ResetTimer()
	for i := range b.N {
		var tp, tb time.Duration
		if i%2 == 0 {
			tp, tb = pipeline(), bare()
		} else {
			tb = bare()
			tp = pipeline()
		}
		pT, bT = pT+tp, bT+tb
		pMin, bMin = min(pMin, tp), min(bMin, tb)
		ratios = append(ratios, float64(tb)/float64(tp))
	}
	audio := float64(samples) / KokoroSampleRate
	n := float64(b.N)
	b.ReportMetric(pT.Seconds()/n/audio, "pipeline-rtf")
	b.ReportMetric(bT.Seconds()/n/audio, "bare-rtf")
	b.ReportMetric(float64(bT)/float64(pT), "ratio")
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "ratio-median")
	b.ReportMetric(float64(bMin)/float64(pMin), "ratio-min")
	b.ReportMetric(audio, "audio_s")
}

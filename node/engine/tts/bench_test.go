package tts

import (
	"context"
	"path/filepath"
	"testing"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

const benchText = "The quick brown fox jumps over the lazy dog. Inference runs locally on two CPU cores."

// BenchmarkKokoroSynthesize measures the whole pipeline (espeak-ng G2P,
// model runs, joins) on a fixed two-sentence text; rtf is seconds of
// compute per second of audio.
func BenchmarkKokoroSynthesize(b *testing.B) {
	k := loadKokoroT(b)
	var samples int
	b.ResetTimer()
	for range b.N {
		samples = 0
		if err := k.Synthesize(context.Background(), engine.SpeechRequest{Text: benchText}, func(c []float32) error {
			samples += len(c)
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	audio := float64(samples) / KokoroSampleRate
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)/audio, "rtf")
	b.ReportMetric(audio, "audio_s")
}

// BenchmarkKokoroBareORT runs the same phoneme ids straight through an
// ONNX Runtime session (no G2P, no pool, no joins): the floor the pipeline
// is compared with.
func BenchmarkKokoroBareORT(b *testing.B) {
	k := loadKokoroT(b)
	style := k.styles[k.defaultVoice]
	var inputs [][]int64
	for _, s := range splitSentences(benchText) {
		us, err := k.sentenceUnits(context.Background(), s, kokoroLangs['a'])
		if err != nil {
			b.Fatal(err)
		}
		for _, u := range us {
			inputs = append(inputs, append(append([]int64{0}, u.ids...), 0))
		}
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
	var samples int
	b.ResetTimer()
	for range b.N {
		samples = 0
		for _, ids := range inputs {
			row := min(len(ids)-2, kokoroStyleRows-1)
			idT, _ := ort.NewTensor(ort.NewShape(1, int64(len(ids))), ids)
			stT, _ := ort.NewTensor(ort.NewShape(1, kokoroStyleDim), style[row*kokoroStyleDim:(row+1)*kokoroStyleDim])
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
	}
	audio := float64(samples) / KokoroSampleRate
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)/audio, "rtf")
	b.ReportMetric(audio, "audio_s")
}

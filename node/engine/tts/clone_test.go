package tts

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// The converter is testdata/openvoice-tiny (made by
// testdata/gen_openvoice.py): OpenVoice v2's export I/O with random
// weights; the base speaker is the real Kokoro.
func loadClonerT(t *testing.T) *OpenVoice {
	t.Helper()
	spec := kokoroSpec(t)
	spec.ID, spec.Task = "onnx/openvoice/tiny-test", engine.TaskVoiceCloning
	abs, err := filepath.Abs("testdata/openvoice-tiny")
	if err != nil {
		t.Fatal(err)
	}
	spec.Files["extractor"] = filepath.Join(abs, "tone_color_extract_model.onnx")
	spec.Files["converter"] = filepath.Join(abs, "tone_clone_model.onnx")
	spec.Files["converter_config"] = filepath.Join(abs, "configuration.json")
	o, err := loadCloner(onnxtest.Runtime(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	return o
}

// referenceClip is real speech from Kokoro in another voice, at 16 kHz,
// padded or cut to secs seconds.
func referenceClip(t *testing.T, k *Kokoro, voice string, secs float64) []float32 {
	t.Helper()
	pcm, _ := synthAll(t, k, engine.SpeechRequest{Text: "Listen to how I speak, slowly.", Voice: voice})
	ref := resample(pcm, KokoroSampleRate, engine.SpeechSampleRate)
	n := int(secs * engine.SpeechSampleRate)
	for len(ref) < n {
		ref = append(ref, ref...)
	}
	return ref[:n]
}

func TestCloner(t *testing.T) {
	o := loadClonerT(t)
	if o.SampleRate() != 22050 {
		t.Fatalf("rate %d", o.SampleRate())
	}
	refA := referenceClip(t, o.base, "bf_emma", 5)
	refB := referenceClip(t, o.base, "am_michael", 5)
	text := "Cloning a voice."
	clone := func(ref []float32) ([]float32, int) {
		var out []float32
		n := 0
		err := o.Clone(context.Background(), engine.CloneRequest{Text: text, Reference: ref}, func(c []float32) error {
			out = append(out, c...)
			n++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out, n
	}
	a, chunks := clone(refA)
	base, _ := synthAll(t, o.base, engine.SpeechRequest{Text: text, Voice: o.baseVoice})
	want := float64(len(base)) / KokoroSampleRate
	got := float64(len(a)) / 22050
	if chunks != 1 || math.Abs(got-want)/want > 0.05 {
		t.Fatalf("%d chunks, %.3f s; the base voice says it in %.3f s", chunks, got, want)
	}
	a2, _ := clone(refA)
	b, _ := clone(refB)
	var dSame, dOther float64
	for i := range a {
		dSame += math.Abs(float64(a[i] - a2[i]))
		dOther += math.Abs(float64(a[i] - b[i]))
	}
	if dSame != 0 || dOther == 0 {
		t.Fatalf("same reference differs by %g, other reference by %g", dSame, dOther)
	}
	for _, c := range []struct {
		req   engine.CloneRequest
		param string
	}{
		{engine.CloneRequest{Text: text, Reference: refA[:2*16000]}, "reference_audio"},
		{engine.CloneRequest{Text: text, Reference: make([]float32, 31*16000)}, "reference_audio"},
		{engine.CloneRequest{Text: text, Reference: make([]float32, 5*16000)}, "reference_audio"},
		{engine.CloneRequest{Text: "", Reference: refA}, "input"},
		{engine.CloneRequest{Text: text, Reference: refA, Speed: 5}, "speed"},
	} {
		var ie *engine.InputError
		if err := o.Clone(context.Background(), c.req, func([]float32) error { return nil }); !errors.As(err, &ie) || ie.Param != c.param {
			t.Errorf("%.20q with %d reference samples: %v, want InputError on %s", c.req.Text, len(c.req.Reference), err, c.param)
		}
	}
}

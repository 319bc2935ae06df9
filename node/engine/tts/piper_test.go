package tts

import (
	"context"
	"errors"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// The Piper test model is testdata/piper-tiny.onnx, made by
// testdata/gen_piper.py: Piper's I/O with random weights, each phoneme id
// lasting ceil(4*length_scale)*64 samples.
func loadPiperT(t *testing.T) *Piper {
	t.Helper()
	p, err := loadPiper(onnxtest.Runtime(t), engine.Spec{
		ID: "onnx/piper/tiny", Task: engine.TaskTextToSpeech, Dir: "testdata",
		Files: map[string]string{"model": "piper-tiny.onnx"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestPiper(t *testing.T) {
	p := loadPiperT(t)
	if p.SampleRate() != 16000 {
		t.Fatalf("sample rate %d, want the json's 16000", p.SampleRate())
	}
	if vs := p.Voices(); len(vs) != 2 || vs[0].ID != "alice" || vs[1].ID != "bob" || vs[0].Language != "en-us" {
		t.Fatalf("voices %+v", vs)
	}
	text := "Hello world, this is a test."
	units, err := p.chunkUnits(context.Background(), []string{text})
	if err != nil || len(units) != 1 {
		t.Fatalf("units %v %v", units, err)
	}
	ids := units[0].ids
	// ^ _ p1 _ p2 _ ... $ : odd positions after BOS are pads.
	if ids[0] != 1 || ids[len(ids)-1] != 2 || len(ids)%2 != 1 {
		t.Fatalf("ids %v do not follow ^ _ (p _)* $", ids)
	}
	for i := 1; i < len(ids)-1; i += 2 {
		if ids[i] != 0 {
			t.Fatalf("ids[%d] = %d, want pad 0: %v", i, ids[i], ids)
		}
	}
	t.Logf("%d ids for %q", len(ids), text)

	a, chunks := synthAll(t, p, engine.SpeechRequest{Text: text, Voice: "alice"})
	// OpenAI's voice names select the first speaker.
	if alloy, _ := synthAll(t, p, engine.SpeechRequest{Text: text, Voice: "alloy"}); len(alloy) != len(a) {
		t.Fatalf("voice alloy: %d samples, alice %d", len(alloy), len(a))
	}
	if chunks != 1 {
		t.Fatalf("%d chunks for one sentence", chunks)
	}
	// Length: every id lasts ceil(4*1)*64 = 256 samples at speed 1.
	if len(a) != 256*len(ids) {
		t.Fatalf("%d samples, want %d", len(a), 256*len(ids))
	}
	// Deterministic for the same input.
	a2, _ := synthAll(t, p, engine.SpeechRequest{Text: text, Voice: "alice"})
	for i := range a {
		if a[i] != a2[i] {
			t.Fatalf("sample %d differs between identical runs", i)
		}
	}
	// Speaker matters.
	b, _ := synthAll(t, p, engine.SpeechRequest{Text: text, Voice: "bob"})
	same := 0
	for i := range a {
		if a[i] == b[i] {
			same++
		}
	}
	if same > len(a)/2 {
		t.Fatalf("voices alice and bob gave the same audio")
	}
	// speed 0.5 doubles length_scale: 8 frames per id; speed 4: ceil(1) = 1.
	slow, _ := synthAll(t, p, engine.SpeechRequest{Text: text, Speed: 0.5})
	fast, _ := synthAll(t, p, engine.SpeechRequest{Text: text, Speed: 4})
	if len(slow) != 512*len(ids) || len(fast) != 64*len(ids) {
		t.Fatalf("speed 0.5: %d samples, speed 4: %d; want %d and %d", len(slow), len(fast), 512*len(ids), 64*len(ids))
	}
	// Two sentences: two chunks, the second after a gap.
	two, chunks := synthAll(t, p, engine.SpeechRequest{Text: "One sentence here. And another one!"})
	if chunks != 2 || len(two) < 2*256*5 {
		t.Fatalf("two sentences: %d chunks, %d samples", chunks, len(two))
	}
	for _, c := range []struct {
		req   engine.SpeechRequest
		param string
	}{
		{engine.SpeechRequest{Text: "hi", Voice: "carol"}, "voice"},
		{engine.SpeechRequest{Text: "hi", Language: "fr"}, "language"},
		{engine.SpeechRequest{Text: ""}, "input"},
		{engine.SpeechRequest{Text: "hi", Speed: 5}, "speed"},
	} {
		var ie *engine.InputError
		if err := p.Synthesize(context.Background(), c.req, func([]float32) error { return nil }); !errors.As(err, &ie) || ie.Param != c.param {
			t.Errorf("%+v: %v, want InputError on %s", c.req, err, c.param)
		}
	}
	if err := p.Synthesize(context.Background(), engine.SpeechRequest{Text: "hi", Language: "en"}, func([]float32) error { return nil }); err != nil {
		t.Errorf("language en on an en-us voice: %v", err)
	}
}

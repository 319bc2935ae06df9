package tts

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// kokoroSpec is the spec scripts/assets-tts.sh installs.
func kokoroSpec(t testing.TB) engine.Spec {
	t.Helper()
	dir := onnxtest.AssetDir(t, "kokoro", "kokoro-quantized.onnx", "tokenizer.json", "voices/af_heart.bin", "voices/ef_dora.bin")
	return engine.Spec{
		ID: "onnx/kokoro/82m-q8", Task: engine.TaskTextToSpeech, Dir: dir,
		Files: map[string]string{"model": "kokoro-quantized.onnx", "voices": "voices", "tokenizer": "tokenizer.json"},
	}
}

func loadKokoroT(t testing.TB) *Kokoro {
	t.Helper()
	k, err := loadKokoro(onnxtest.Runtime(t), kokoroSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// synthAll collects every chunk of one synthesis.
func synthAll(t testing.TB, s engine.Speaker, req engine.SpeechRequest) ([]float32, int) {
	t.Helper()
	var pcm []float32
	chunks := 0
	if err := s.Synthesize(context.Background(), req, func(c []float32) error {
		pcm = append(pcm, c...)
		chunks++
		return nil
	}); err != nil {
		t.Fatalf("Synthesize(%q): %v", req.Text, err)
	}
	return pcm, chunks
}

// TestKokoro loads the model once and runs the checks on it.
func TestKokoro(t *testing.T) {
	k := loadKokoroT(t)
	for _, c := range []struct {
		name string
		fn   func(*testing.T, *Kokoro)
	}{
		{"Voices", testKokoroVoices}, {"Phonemes", testKokoroPhonemes}, {"BadInput", testKokoroBadInput},
		{"Synthesize", testKokoroSynthesize}, {"StreamsBeforeLastSentence", testKokoroStreamsBeforeLastSentence},
		{"OpenAIVoices", testKokoroOpenAIVoices},
		{"MarksOnly", testKokoroMarksOnly},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, k) })
	}
}

func testKokoroVoices(t *testing.T, k *Kokoro) {
	vs := k.Voices()
	if len(vs) != 41 || vs[0].ID != "af_heart" || vs[0].Language != "en-us" || vs[0].Gender != "female" {
		t.Fatalf("voices: %d, first %+v", len(vs), vs[0])
	}
	langs := map[string]bool{}
	for _, v := range vs {
		langs[v.Language] = true
		if v.ID[0] == 'j' || v.ID[0] == 'z' {
			t.Errorf("voice %s has no G2P but is offered", v.ID)
		}
	}
	for _, l := range []string{"en-us", "en-gb", "es", "fr-fr", "hi", "it", "pt-br"} {
		if !langs[l] {
			t.Errorf("no %s voice", l)
		}
	}
	if k.SampleRate() != 24000 {
		t.Fatalf("sample rate %d", k.SampleRate())
	}
}

func testKokoroPhonemes(t *testing.T, k *Kokoro) {
	ctx := context.Background()
	for _, c := range []struct{ voice, text, want string }{
		// espeak-ng's own normalisation: numbers, abbreviations, symbols.
		{"af_heart", "Dr. Smith paid $12.", "dˈɑːktɚ smˈɪθ pˈAd twˈɛlv dˈɑːlɚz."},
		{"af_heart", "It's 3:45, isn't it?", "ɪts θɹˈiː fˈoːɹɾi fˈIv, ˈɪzənt ɪt?"},
		{"af_heart", "I have 2 cats & 1 dog.", "I hæv tˈuː kˈæts ænd wˈʌn dˈɑːɡ."},
		{"bf_emma", "Hello, old boat!", "həlˈQ, ˈQld bˈQt!"},
		{"ef_dora", "¿Dónde está? Tengo 23 años.", "dˈonde estˈa? tˈɛŋɡo βˌAntitɾˈes ˈaɲos."},
	} {
		got, err := k.Phonemes(ctx, c.text, c.voice)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("Phonemes(%s, %q) = %q, want %q", c.voice, c.text, got, c.want)
		}
		for _, r := range got {
			if _, ok := k.vocab[r]; !ok {
				t.Errorf("phoneme %q of %q is not in the vocabulary", r, c.text)
			}
		}
	}
}

func testKokoroSynthesize(t *testing.T, k *Kokoro) {
	for _, c := range []struct{ voice, short, long string }{
		{"af_heart", "Hello there.", "Hello there. The quick brown fox jumps over the lazy dog."},
		{"ef_dora", "Hola amigo.", "Hola amigo. El rápido zorro marrón salta sobre el perro."},
	} {
		short, _ := synthAll(t, k, engine.SpeechRequest{Text: c.short, Voice: c.voice})
		long, chunks := synthAll(t, k, engine.SpeechRequest{Text: c.long, Voice: c.voice})
		ds, dl := float64(len(short))/24000, float64(len(long))/24000
		t.Logf("%s: %.2f s for %q, %.2f s in %d chunks for %q", c.voice, ds, c.short, dl, chunks, c.long)
		if ds < 0.4 || ds > 3 {
			t.Errorf("%s: short text gave %.2f s", c.voice, ds)
		}
		if dl < 2.5*ds {
			t.Errorf("%s: long text gave %.2f s, short %.2f s: duration does not grow with the text", c.voice, dl, ds)
		}
		if chunks != 2 {
			t.Errorf("%s: %d chunks for two sentences", c.voice, chunks)
		}
		if r := rms(long); r < 0.02 || r > 0.5 {
			t.Errorf("%s: rms %.4f is not speech-like", c.voice, r)
		}
	}
	// Speed 2 makes the same text clearly shorter.
	text := "The quick brown fox jumps."
	n1, _ := synthAll(t, k, engine.SpeechRequest{Text: text})
	n2, _ := synthAll(t, k, engine.SpeechRequest{Text: text, Speed: 2})
	if r := float64(len(n2)) / float64(len(n1)); r < 0.4 || r > 0.7 {
		t.Errorf("speed 2 gave %.2f of the speed-1 length", r)
	}
}

func testKokoroStreamsBeforeLastSentence(t *testing.T, k *Kokoro) {
	text := "First one. Then two. Three."
	start := k.m.calls.Load()
	var runsAtEmit []int64
	err := k.Synthesize(context.Background(), engine.SpeechRequest{Text: text}, func(pcm []float32) error {
		runsAtEmit = append(runsAtEmit, k.m.calls.Load()-start)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Events in order: run 1, emit 1, run 2, emit 2, run 3, emit 3.
	if len(runsAtEmit) != 3 || runsAtEmit[0] != 1 || runsAtEmit[1] != 2 || runsAtEmit[2] != 3 {
		t.Fatalf("model runs finished at each emit: %v, want [1 2 3]", runsAtEmit)
	}
	// An emit error stops the work: no further run.
	stop := errors.New("client gone")
	start = k.m.calls.Load()
	err = k.Synthesize(context.Background(), engine.SpeechRequest{Text: text}, func([]float32) error { return stop })
	if !errors.Is(err, stop) {
		t.Fatalf("emit error: got %v", err)
	}
	if n := k.m.calls.Load() - start; n != 1 {
		t.Fatalf("%d runs after the first emit failed, want 1", n)
	}
}

func testKokoroBadInput(t *testing.T, k *Kokoro) {
	for _, c := range []struct {
		req   engine.SpeechRequest
		param string
	}{
		{engine.SpeechRequest{Text: ""}, "input"},
		{engine.SpeechRequest{Text: "  \n "}, "input"},
		{engine.SpeechRequest{Text: strings.Repeat("a", 4097)}, "input"},
		{engine.SpeechRequest{Text: "hi", Voice: "zz_nobody"}, "voice"},
		{engine.SpeechRequest{Text: "hi", Voice: "jf_alpha"}, "voice"},
		{engine.SpeechRequest{Text: "hi", Speed: 5}, "speed"},
		{engine.SpeechRequest{Text: "hi", Speed: 0.2}, "speed"},
		{engine.SpeechRequest{Text: "hi", Language: "xx"}, "language"},
	} {
		called := false
		err := k.Synthesize(context.Background(), c.req, func([]float32) error { called = true; return nil })
		var ie *engine.InputError
		if !errors.As(err, &ie) || ie.Param != c.param {
			t.Errorf("%.20q voice %q speed %g: got %v, want InputError on %s", c.req.Text, c.req.Voice, c.req.Speed, err, c.param)
		}
		if called {
			t.Errorf("%.20q: emit called despite the input error", c.req.Text)
		}
	}
	// 4096 characters is accepted (checked without synthesizing it all:
	// short sentences, cancelled after the first).
	ctx, cancel := context.WithCancel(context.Background())
	err := k.Synthesize(ctx, engine.SpeechRequest{Text: strings.Repeat("Hello. ", 585) + "x"}, func([]float32) error { cancel(); return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("4096 characters, cancelled after the first chunk: %v", err)
	}
}

// testKokoroOpenAIVoices: OpenAI's voice names speak, each with the
// Kokoro voice the mapping names (the same samples), and the voice list
// says so.
func testKokoroOpenAIVoices(t *testing.T, k *Kokoro) {
	for _, c := range []struct{ openai, voice string }{{"alloy", "af_alloy"}, {"ash", "am_michael"}, {"coral", "af_heart"}} {
		a, _ := synthAll(t, k, engine.SpeechRequest{Text: "Good morning.", Voice: c.openai})
		b, _ := synthAll(t, k, engine.SpeechRequest{Text: "Good morning.", Voice: c.voice})
		if len(a) < 2400 || !slices.Equal(a, b) {
			t.Errorf("%s: %d samples, not the %d of %s", c.openai, len(a), len(b), c.voice)
		}
	}
	for _, v := range k.Voices() {
		if v.ID == "af_alloy" && !slices.Equal(v.OpenAI, []string{"alloy"}) {
			t.Errorf("af_alloy lists %v", v.OpenAI)
		}
	}
}

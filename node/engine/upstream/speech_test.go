package upstream

import (
	"context"
	"errors"
	"math"
	"net/http"
	"testing"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/upstream/upstreamtest"
)

// speaker returns the registry's speech engine of id.
func speaker(t *testing.T, r *Registry, id string) engine.Speaker {
	t.Helper()
	e, ok := r.Engine(id)
	if !ok {
		t.Fatalf("no engine %s", id)
	}
	s, ok := e.(engine.Speaker)
	if !ok {
		t.Fatalf("%s is not a speech engine", id)
	}
	return s
}

// zeroCrossingHz estimates the pitch of a tone from its zero crossings.
func zeroCrossingHz(pcm []float32, rate int) float64 {
	n := 0
	for i := 1; i < len(pcm); i++ {
		if (pcm[i-1] < 0) != (pcm[i] < 0) {
			n++
		}
	}
	return float64(n) / 2 / (float64(len(pcm)) / float64(rate))
}

// TestSpeechPassthrough: a provider text-to-speech model is asked for pcm
// with the request's voice, speed and instructions, and its audio comes
// back chunk by chunk as the provider sends it.
func TestSpeechPassthrough(t *testing.T) {
	d := upstreamtest.NewProvider(t, testKey)
	r := registry(t, d.URL(), "5s", ModelConfig{Model: "tts-1", Task: "text-to-speech"},
		ModelConfig{Model: "kokoro", Task: "text-to-speech", Voices: []string{"nova", "alloy"}},
		ModelConfig{Model: "cut-off", Task: "text-to-speech"})
	sp := speaker(t, r, "upstream/acme/tts-1")
	if sp.SampleRate() != 24000 || sp.Voices()[0].ID != "alloy" || len(sp.Voices()) != 11 {
		t.Fatalf("rate %d, voices %v", sp.SampleRate(), sp.Voices())
	}
	var pcm []float32
	chunks := 0
	err := sp.Synthesize(context.Background(), engine.SpeechRequest{Text: "one two three four", Speed: 2, Instructions: "cheerfully"}, func(c []float32) error {
		pcm = append(pcm, c...)
		chunks++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	body, auth := d.Last()
	if body["model"] != "tts-1" || body["voice"] != "alloy" || body["response_format"] != "pcm" || body["speed"] != 2.0 ||
		body["instructions"] != "cheerfully" || body["input"] != "one two three four" || auth != "Bearer "+testKey {
		t.Fatalf("provider got %v (%s)", body, auth)
	}
	want := int(4 * upstreamtest.SpeechWordSeconds * upstreamtest.SpeechRate / 2)
	if len(pcm) != want || chunks < 2 {
		t.Fatalf("%d samples in %d chunks, want %d in several", len(pcm), chunks, want)
	}
	if hz := zeroCrossingHz(pcm, 24000); math.Abs(hz-220) > 5 {
		t.Fatalf("pitch %.1f Hz, want 220", hz)
	}

	// A configured voice list: its first is the default, others are 400s.
	ko := speaker(t, r, "acme:kokoro")
	pcm = pcm[:0]
	if err := ko.Synthesize(context.Background(), engine.SpeechRequest{Text: "hi"}, func(c []float32) error { pcm = append(pcm, c...); return nil }); err != nil {
		t.Fatal(err)
	}
	if hz := zeroCrossingHz(pcm, 24000); math.Abs(hz-330) > 5 {
		t.Fatalf("default voice pitch %.1f Hz, want nova's 330", hz)
	}
	var ie *engine.InputError
	if err := ko.Synthesize(context.Background(), engine.SpeechRequest{Text: "hi", Voice: "echo"}, func([]float32) error { return nil }); !errors.As(err, &ie) || ie.Param != "voice" {
		t.Fatalf("unlisted voice: %v", err)
	}
	// The provider's own refusal passes through as a 400 naming voice.
	pe := providerError(t, sp.Synthesize(context.Background(), engine.SpeechRequest{Text: "hi", Voice: "nobody"}, func([]float32) error { return nil }), http.StatusBadRequest, "invalid_value")
	if pe.Param != "voice" {
		t.Fatalf("provider refusal names %q", pe.Param)
	}
	// An error from emit stops the request.
	stop := errors.New("client gone")
	if err := sp.Synthesize(context.Background(), engine.SpeechRequest{Text: "a b c"}, func([]float32) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("emit error: %v", err)
	}
	// A stream broken off midway is a 502, after the audio already sent.
	got := 0
	err = speaker(t, r, "upstream/acme/cut-off").Synthesize(context.Background(), engine.SpeechRequest{Text: "a b c"}, func(c []float32) error { got += len(c); return nil })
	providerError(t, err, http.StatusBadGateway, apierr.CodeUpstreamUnavailable)
	if got == 0 {
		t.Fatal("no audio before the break")
	}
	if _, err := New(Config{Providers: []ProviderConfig{{Name: "x", BaseURL: d.URL(), Models: []ModelConfig{{Model: "m", Voices: []string{"a"}}}}}}, Options{}); err == nil {
		t.Fatal("voices on a chat model accepted")
	}
}

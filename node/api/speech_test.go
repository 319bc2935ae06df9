package api

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/upstream"
	"github.com/infermesh/infermesh/node/engine/upstream/upstreamtest"
)

// TestSpeechUpstreamPassthrough: POST /v1/audio/speech on a provider
// text-to-speech model forwards the request (instructions included) and
// answers with the provider's audio in the asked format, streamed as wav
// or as server-sent events; the provider's refusals keep their status.
func TestSpeechUpstreamPassthrough(t *testing.T) {
	d := upstreamtest.NewProvider(t, "")
	reg, err := upstream.New(upstream.Config{Providers: []upstream.ProviderConfig{{Name: "acme", BaseURL: d.URL(),
		Models: []upstream.ModelConfig{{Model: "tts-1", Task: "text-to-speech"}}}}}, upstream.Options{})
	if err != nil {
		t.Fatal(err)
	}
	eng, _ := reg.Engine("upstream/acme/tts-1")
	s := New(Options{Backend: &speechBackend{eng: eng.(engine.Speaker)}, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	post := func(body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		s.audioSpeech(w, httptest.NewRequest(http.MethodPost, "/v1/audio/speech", strings.NewReader(body)))
		return w
	}
	w := post(`{"model":"kokoro","input":"one two three","voice":"nova","response_format":"wav","instructions":"whisper it"}`)
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "audio/wav" {
		t.Fatalf("status %d %s: %.200s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	sent, _ := d.Last()
	if sent["voice"] != "nova" || sent["instructions"] != "whisper it" || sent["model"] != "tts-1" {
		t.Fatalf("provider got %v", sent)
	}
	wav := w.Body.Bytes()
	if len(wav) < 44 || string(wav[:4]) != "RIFF" || binary.LittleEndian.Uint32(wav[24:]) != 24000 {
		t.Fatalf("not a 24 kHz wav: % x", wav[:min(len(wav), 44)])
	}
	if got, want := (len(wav)-44)/2, int(3*upstreamtest.SpeechWordSeconds*upstreamtest.SpeechRate); got != want {
		t.Fatalf("%d samples, want %d", got, want)
	}

	w = post(`{"model":"kokoro","input":"one two","voice":"alloy","response_format":"pcm","stream_format":"sse"}`)
	var audio []byte
	done := false
	for _, line := range strings.Split(w.Body.String(), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type  string `json:"type"`
			Audio string `json:"audio"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case "speech.audio.delta":
			b, _ := base64.StdEncoding.DecodeString(ev.Audio)
			audio = append(audio, b...)
		case "speech.audio.done":
			done = true
		}
	}
	if !done || len(audio) != 2*int(2*upstreamtest.SpeechWordSeconds*upstreamtest.SpeechRate) {
		t.Fatalf("sse: done %v, %d bytes of pcm", done, len(audio))
	}

	w = post(`{"model":"kokoro","input":"hi","voice":"nobody","response_format":"wav"}`)
	if w.Code != http.StatusBadRequest || !bytes.Contains(w.Body.Bytes(), []byte(`"param":"voice"`)) {
		t.Fatalf("provider refusal: %d %s", w.Code, w.Body)
	}
}

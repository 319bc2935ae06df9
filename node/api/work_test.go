package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/audiocodec"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
	"github.com/infermesh/infermesh/node/engine/whisper"
)

// inUse is the work of kind caller has admitted now.
func (m *workMeter) inUse(k workKind, caller string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.use[k][caller]
}

// apiError decodes an error answer.
func apiError(t testing.TB, w *httptest.ResponseRecorder) apierr.Error {
	t.Helper()
	var e struct {
		Error apierr.Error `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
		t.Fatalf("status %d, body %q: %v", w.Code, w.Body, err)
	}
	return e.Error
}

// TestWorkMeter: a request over the per-request limit is a 400 naming the
// flag whoever asks; within it, a caller's requests are admitted until
// their sum would pass the caller's share (429 with Retry-After naming
// the share's flag), each caller has its own share, a release gives the
// work back (once, however often it is called), the operator ("") and a
// share of 0 have no share limit.
func TestWorkMeter(t *testing.T) {
	m := newWorkMeter(WorkLimits{ImageWork: 100, KeyImageWork: 150, SpeechWork: 10, KeySpeechWork: 0})
	if _, err := m.admit(workImage, "", "size", 101, "x"); err == nil || err.Status != 400 || err.Code != apierr.CodeWorkLimit ||
		!strings.Contains(err.Message, "--image-max-work") || !strings.Contains(err.Message, "101") {
		t.Fatalf("101 over a limit of 100: %+v", err)
	}
	a1, err := m.admit(workImage, "key:a", "size", 100, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.admit(workImage, "key:a", "size", 60, "x"); err == nil || err.Status != 429 || err.Code != apierr.CodeWorkShare ||
		err.RetryAfter < 1 || !strings.Contains(err.Message, "--image-key-work") {
		t.Fatalf("160 of a share of 150: %+v", err)
	}
	a2, err := m.admit(workImage, "key:a", "size", 50, "x")
	if err != nil {
		t.Fatalf("150 of a share of 150: %v", err)
	}
	if _, err := m.admit(workImage, "key:b", "size", 100, "x"); err != nil {
		t.Fatalf("another key: %v", err)
	}
	for range 3 {
		if _, err := m.admit(workImage, "", "size", 100, "x"); err != nil {
			t.Fatalf("the operator: %v", err)
		}
	}
	a1()
	a1()
	if got := m.inUse(workImage, "key:a"); got != 50 {
		t.Fatalf("after one release key:a holds %d, want 50", got)
	}
	a2()
	if got := m.inUse(workImage, "key:a"); got != 0 {
		t.Fatalf("after both releases key:a holds %d", got)
	}
	for range 5 {
		if _, err := m.admit(workSpeech, "key:a", "input", 10, "x"); err != nil {
			t.Fatalf("speech without a share limit: %v", err)
		}
	}
	if _, err := m.admit(workSpeech, "key:a", "input", 11, "x"); err == nil || err.Status != 400 || !strings.Contains(err.Message, "--speech-max-work") {
		t.Fatalf("speech over its per-request limit: %+v", err)
	}
	// A share smaller than one request: that request can never run.
	m = newWorkMeter(WorkLimits{ImageWork: 100, KeyImageWork: 50})
	if _, err := m.admit(workImage, "key:a", "size", 60, "x"); err == nil || err.Status != 400 || !strings.Contains(err.Message, "--image-key-work") {
		t.Fatalf("60 with a share of 50: %+v", err)
	}
}

// holdWork admits earlier requests of the given sizes for caller, as
// requests still running would hold them; it returns their release.
func holdWork(t testing.TB, s *Server, k workKind, caller string, sizes ...int64) func() {
	t.Helper()
	var rel []func()
	for _, n := range sizes {
		r, err := s.work.admit(k, caller, "x", n, "an earlier request")
		if err != nil {
			t.Fatal(err)
		}
		rel = append(rel, r)
	}
	return func() {
		for _, r := range rel {
			r()
		}
	}
}

// TestWorkLimitsValidate: every limit is bounded; the shares may be 0.
func TestWorkLimitsValidate(t *testing.T) {
	if errs := DefaultWorkLimits().Validate(); len(errs) != 0 {
		t.Fatalf("defaults: %v", errs)
	}
	l := DefaultWorkLimits()
	l.KeyImageWork, l.KeySpeechWork, l.KeyAudioSeconds = 0, 0, 0
	if errs := l.Validate(); len(errs) != 0 {
		t.Fatalf("shares of 0: %v", errs)
	}
	bad := WorkLimits{ImagePixels: 0, ImageWork: -1, KeyImageWork: -1, SpeechWork: 0, KeySpeechWork: -5, AudioSeconds: MaxAudioSeconds + 1, KeyAudioSeconds: -1}
	if errs := bad.Validate(); len(errs) != 7 {
		t.Fatalf("%d errors, want 7: %v", len(errs), errs)
	}
}

// pngHeader is a PNG file that declares a w×h RGBA picture but carries
// only a few bytes of pixel data: its header passes for the real thing
// (decoding it would fail, or, were the data there, take the memory of
// w×h pixels).
func pngHeader(w, h int) string {
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	chunk := func(typ string, data []byte) {
		binary.Write(&b, binary.BigEndian, uint32(len(data)))
		b.WriteString(typ)
		b.Write(data)
		binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(append([]byte(typ), data...)))
	}
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8], ihdr[9] = 8, 6 // 8-bit RGBA
	chunk("IHDR", ihdr)
	chunk("IDAT", []byte{0x78, 0x9c, 0x63, 0, 0})
	chunk("IEND", nil)
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

// TestImagesWorkLimits runs the limits on the real tiny-sd pipeline: the
// issue's request (4096x4096, n 4, 200 steps) is refused before any work
// with a 400 naming the limit, as is one within the picture limit but
// over the work limit; a picture whose header declares 40 megapixels is
// refused from its header; a key whose earlier request holds its share
// gets 429 until that work is released, and is then served.
func TestImagesWorkLimits(t *testing.T) {
	s, b := newImageServer(t, false, "tiny-sd")
	caller := "key:k1"
	s.opt.WorkCaller = func(*http.Request) string { return caller }
	s.work = newWorkMeter(DefaultWorkLimits()) // with the default shares
	for _, c := range []struct {
		body, param, flag string
	}{
		{`{"model":"tiny-sd","prompt":"x","size":"4096x4096","n":4,"num_inference_steps":200}`, "size", "--image-max-pixels"},
		{`{"model":"tiny-sd","prompt":"x","size":"2048x2048","n":4,"num_inference_steps":200}`, "size", "--image-max-work"},
		{`{"model":"tiny-sd","prompt":"x","size":"1024x1024","n":4,"num_inference_steps":65}`, "size", "--image-max-work"},
		{`{"model":"tiny-sd","prompt":"x","operation":"img2img","image":"` + pngHeader(8000, 5000) + `"}`, "image", "--image-max-pixels"},
		{`{"model":"tiny-sd","prompt":"x","operation":"inpaint","image":"` + b64PNG(t, testPhoto(t)) + `","mask":"` + pngHeader(6000, 6000) + `"}`, "mask", "--image-max-pixels"},
	} {
		w := postImages(s, c.body)
		e := apiError(t, w)
		if w.Code != http.StatusBadRequest || e.Code != apierr.CodeWorkLimit || e.Param != c.param || !strings.Contains(e.Message, c.flag) {
			t.Errorf("%.90s: %d %+v, want 400 %s on %s naming %s", c.body, w.Code, e, apierr.CodeWorkLimit, c.param, c.flag)
		}
	}
	if r, q := b.gate.Depth(); r != 0 || q != 0 {
		t.Fatalf("a refused request reached the gate: %d running, %d queued", r, q)
	}
	// 1024x1024 × 1 × 200 steps = 200 megapixel-steps of the default 512
	// share: a second one waits for a share only once the first holds it.
	held := holdWork(t, s, workImage, caller, 200, 200)
	big := `{"model":"tiny-sd","prompt":"x","size":"1024x1024","num_inference_steps":200,"seed":1}`
	w := postImages(s, big)
	if e := apiError(t, w); w.Code != http.StatusTooManyRequests || e.Code != apierr.CodeWorkShare || w.Header().Get("Retry-After") == "" ||
		!strings.Contains(e.Message, "--image-key-work") {
		t.Fatalf("over the key's share: %d %+v", w.Code, e)
	}
	caller = "key:k2"
	small := `{"model":"tiny-sd","prompt":"x","size":"64x64","num_inference_steps":2,"seed":1}`
	if w := postImages(s, small); w.Code != http.StatusOK {
		t.Fatalf("another key: %d %s", w.Code, w.Body)
	}
	caller = "key:k1"
	held()
	if w := postImages(s, small); w.Code != http.StatusOK {
		t.Fatalf("after the release: %d %s", w.Code, w.Body)
	}
	if got := s.work.inUse(workImage, caller); got != 0 {
		t.Fatalf("served requests left %d megapixel-steps held", got)
	}
}

// TestSpeechWorkLimit runs on the real Kokoro: speech work is
// characters ÷ speed, so the longest input at speed 0.25 is a 400 naming
// the limit before any work, while a short one at that speed is spoken;
// a key whose earlier request holds its share gets 429 naming the share.
func TestSpeechWorkLimit(t *testing.T) {
	_, s, _ := kokoroBench(t)
	caller := "key:k1"
	s.opt.WorkCaller = func(*http.Request) string { return caller }
	s.work = newWorkMeter(DefaultWorkLimits()) // with the default shares
	post := func(input, speed string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		s.audioSpeech(w, httptest.NewRequest(http.MethodPost, "/v1/audio/speech",
			strings.NewReader(`{"model":"kokoro","input":"`+input+`","speed":`+speed+`,"response_format":"pcm"}`)))
		return w
	}
	w := post(strings.Repeat("a", 4096), "0.25")
	if e := apiError(t, w); w.Code != 400 || e.Code != apierr.CodeWorkLimit || e.Param != "input" || !strings.Contains(e.Message, "--speech-max-work") {
		t.Fatalf("4096 characters at speed 0.25: %d %+v", w.Code, e)
	}
	if w := post("Hello there.", "0.25"); w.Code != 200 || w.Body.Len() < 24000 {
		t.Fatalf("a short input at speed 0.25: %d, %d bytes", w.Code, w.Body.Len())
	}
	held := holdWork(t, s, workSpeech, caller, DefaultSpeechWork, DefaultKeySpeechWork-DefaultSpeechWork)
	w = post("Hello there.", "1")
	if e := apiError(t, w); w.Code != 429 || e.Code != apierr.CodeWorkShare || !strings.Contains(e.Message, "--speech-key-work") {
		t.Fatalf("over the key's share: %d %+v", w.Code, e)
	}
	held()
	if w := post("Hello there.", "1"); w.Code != 200 {
		t.Fatalf("after the release: %d %s", w.Code, w.Body)
	}
}

// transcribeBackend serves one real transcription engine under "whisper".
type transcribeBackend struct {
	Backend
	eng engine.Transcriber
}

func (b *transcribeBackend) TaskEngine(_ context.Context, task engine.Task, id string) (engine.Engine, string, error) {
	if id == "whisper" && task == engine.TaskSpeechToText {
		return b.eng, "whisper", nil
	}
	return nil, "", fmt.Errorf("model %s: %w", id, ErrModelNotFound)
}

// TestTranscriptionWorkLimit runs on the real whisper-base and a real
// LibriVox clip: a node whose per-request limit is shorter than the clip
// answers 413 naming --audio-max-seconds; a key whose running requests
// hold its share of audio seconds gets 429 naming --audio-key-seconds,
// and is served once they are done.
func TestTranscriptionWorkLimit(t *testing.T) {
	dir := onnxtest.AssetDir(t, "whisper-base", "encoder_model_quantized.onnx", "decoder_model_merged_quantized.onnx")
	tr, err := whisper.Load(onnxtest.Runtime(t), engine.Spec{ID: "whisper", Task: engine.TaskSpeechToText, Dir: dir, Files: map[string]string{
		"encoder": "encoder_model_quantized.onnx", "decoder": "decoder_model_merged_quantized.onnx", "config": "config.json",
		"generation_config": "generation_config.json", "tokenizer": "tokenizer.json"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	clip, err := os.ReadFile("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.wav")
	if err != nil {
		t.Fatalf("Debian pocketsphinx-testdata: %v", err)
	}
	_, secs, err := audiocodec.Decode(clip, 0)
	if err != nil || secs < 2 {
		t.Fatalf("clip: %.1f s, %v", secs, err)
	}
	post := func(s *Server) *httptest.ResponseRecorder {
		body, ct := formBody(map[string]string{"model": "whisper"}, clip)
		r := httptest.NewRequest(http.MethodPost, "/v1/audio/transcriptions", bytes.NewReader(body))
		r.Header.Set("Content-Type", ct)
		w := httptest.NewRecorder()
		s.audioTranscriptions(w, r)
		return w
	}
	lim := DefaultWorkLimits()
	lim.AudioSeconds = int64(secs) - 1
	short := New(Options{Backend: &transcribeBackend{eng: tr}, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(), Work: lim})
	w := post(short)
	if e := apiError(t, w); w.Code != http.StatusRequestEntityTooLarge || e.Param != "file" || !strings.Contains(e.Message, "--audio-max-seconds") {
		t.Fatalf("%.1f s of audio, limit %d s: %d %+v", secs, lim.AudioSeconds, w.Code, e)
	}
	s := New(Options{Backend: &transcribeBackend{eng: tr}, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(),
		Work: DefaultWorkLimits(), WorkCaller: func(*http.Request) string { return "key:k1" }})
	held := holdWork(t, s, workAudio, "key:k1", DefaultAudioSeconds, DefaultKeyAudioSeconds-DefaultAudioSeconds)
	w = post(s)
	if e := apiError(t, w); w.Code != http.StatusTooManyRequests || e.Code != apierr.CodeWorkShare || !strings.Contains(e.Message, "--audio-key-seconds") {
		t.Fatalf("over the key's share: %d %+v", w.Code, e)
	}
	held()
	if w := post(s); w.Code != http.StatusOK || !strings.Contains(strings.ToLower(w.Body.String()), "text") {
		t.Fatalf("after the release: %d %s", w.Code, w.Body)
	}
}

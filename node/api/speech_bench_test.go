package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
	"github.com/infermesh/infermesh/node/engine/tts"
)

// cpuTime is the CPU time the process and its finished children
// (espeak-ng, ffmpeg) have used, user and system, all threads.
func cpuTime() time.Duration {
	var t time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if syscall.Getrusage(who, &ru) == nil {
			t += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return t
}

// speechBackend serves one real speech engine under id "kokoro".
type speechBackend struct {
	Backend
	eng engine.Speaker
}

func (b *speechBackend) TaskEngine(_ context.Context, task engine.Task, id string) (engine.Engine, string, error) {
	if (id == "kokoro" || id == "") && task == engine.TaskTextToSpeech {
		return b.eng, "kokoro", nil
	}
	return nil, "", fmt.Errorf("model %s: %w", id, ErrModelNotFound)
}

// kokoroBench loads the Kokoro model `make assets` installs and an API
// server over it; it returns the engine, the server and the model file.
func kokoroBench(b testing.TB) (*tts.Kokoro, *Server, string) {
	b.Helper()
	dir := onnxtest.AssetDir(b, "kokoro", "kokoro-quantized.onnx", "tokenizer.json", "af_heart.bin")
	spec := engine.Spec{ID: "onnx/kokoro/82m-q8", Task: engine.TaskTextToSpeech, Dir: dir,
		Files: map[string]string{"model": "kokoro-quantized.onnx", "tokenizer": "tokenizer.json", "voice.af_heart": "af_heart.bin"}}
	sp, err := tts.LoadKokoro(onnxtest.Runtime(b), spec)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sp.Close() })
	s := New(Options{Backend: &speechBackend{eng: sp}, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	return sp.(*tts.Kokoro), s, filepath.Join(dir, spec.Files["model"])
}

// bareKokoro is a plain ONNX Runtime session on the Kokoro file with the
// runtime's session options: the floor the API is compared with.
type bareKokoro struct {
	sess   *ort.DynamicAdvancedSession
	ids    [][]int64
	styles [][]float32
}

func newBareKokoro(b *testing.B, k *tts.Kokoro, path, text string) *bareKokoro {
	b.Helper()
	ids, styles, err := k.RunInputs(context.Background(), text, "af_heart")
	if err != nil {
		b.Fatal(err)
	}
	opts, err := onnxtest.Runtime(b).SessionOptions()
	if err != nil {
		b.Fatal(err)
	}
	defer opts.Destroy()
	sess, err := ort.NewDynamicAdvancedSession(path, []string{"input_ids", "style", "speed"}, []string{"waveform"}, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sess.Destroy() })
	return &bareKokoro{sess: sess, ids: ids, styles: styles}
}

// run makes every model run of the text once and returns the samples.
func (k *bareKokoro) run(b *testing.B) int {
	samples := 0
	for i, ids := range k.ids {
		idT, err := ort.NewTensor(ort.NewShape(1, int64(len(ids))), ids)
		if err != nil {
			b.Fatal(err)
		}
		stT, _ := ort.NewTensor(ort.NewShape(1, int64(len(k.styles[i]))), k.styles[i])
		spT, _ := ort.NewTensor(ort.NewShape(1), []float32{1})
		outs := []ort.Value{nil}
		if err := k.sess.Run([]ort.Value{idT, stT, spT}, outs); err != nil {
			b.Fatal(err)
		}
		samples += len(outs[0].(*ort.Tensor[float32]).GetData())
		for _, v := range []ort.Value{idT, stT, spT, outs[0]} {
			v.Destroy()
		}
	}
	return samples
}

// benchSpeechText is two short sentences: two model runs, about four
// seconds of audio.
const benchSpeechText = "The quick brown fox jumps over the lazy dog. Inference runs on two cores."

// BenchmarkSpeechAPIKokoro compares POST /v1/audio/speech (JSON parsing,
// espeak-ng G2P, the engine's session pool, fades and joins, encoding,
// the response) with a bare ONNX Runtime loop over the same phoneme ids
// and style rows. Each iteration makes one of each, in alternating order,
// so that load on a shared machine falls on both alike. ratio is bare time
// over API time (1 = no overhead); ratio-median is the median of the
// per-iteration ratios, which one disturbed run cannot move; ratio-min is
// the fastest bare run over the fastest API run; cpu-ratio is the ratio in
// CPU time (all threads, ORT's included, and the espeak-ng and ffmpeg
// children), which waiting for a core does not inflate. rtf is
// seconds of compute per second of audio.
func BenchmarkSpeechAPIKokoro(b *testing.B) {
	k, s, path := kokoroBench(b)
	bare := newBareKokoro(b, k, path, benchSpeechText)
	for _, format := range []string{"wav", "mp3"} {
		b.Run(format, func(b *testing.B) {
			body := fmt.Sprintf(`{"model":"kokoro","voice":"af_heart","response_format":%q,"input":%q}`, format, benchSpeechText)
			post := func() int {
				w := httptest.NewRecorder()
				s.audioSpeech(w, httptest.NewRequest(http.MethodPost, "/v1/audio/speech", strings.NewReader(body)))
				if w.Code != http.StatusOK || w.Body.Len() < 1000 {
					b.Fatalf("status %d, %d bytes: %.200s", w.Code, w.Body.Len(), w.Body)
				}
				return w.Body.Len()
			}
			// Warm both paths once (first-run allocations, ffmpeg's
			// page cache).
			post()
			samples := bare.run(b)
			var api, raw time.Duration
			aMin, rMin := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
			var aCPU, rCPU time.Duration
			var ratios []float64
			b.ResetTimer()
			for i := range b.N {
				var ta, tb time.Duration
				timed := func(f func(), cpu *time.Duration) time.Duration {
					t, c := time.Now(), cpuTime()
					f()
					*cpu += cpuTime() - c
					return time.Since(t)
				}
				if i%2 == 0 {
					ta = timed(func() { post() }, &aCPU)
					tb = timed(func() { bare.run(b) }, &rCPU)
				} else {
					tb = timed(func() { bare.run(b) }, &rCPU)
					ta = timed(func() { post() }, &aCPU)
				}
				api, raw = api+ta, raw+tb
				aMin, rMin = min(aMin, ta), min(rMin, tb)
				ratios = append(ratios, float64(tb)/float64(ta))
			}
			audio := float64(samples) / tts.KokoroSampleRate
			n := float64(b.N)
			b.ReportMetric(api.Seconds()/n/audio, "api-rtf")
			b.ReportMetric(raw.Seconds()/n/audio, "bare-rtf")
			b.ReportMetric(float64(raw)/float64(api), "ratio")
			slices.Sort(ratios)
			b.ReportMetric(ratios[len(ratios)/2], "ratio-median")
			b.ReportMetric(float64(rMin)/float64(aMin), "ratio-min")
			b.ReportMetric(float64(rCPU)/float64(aCPU), "cpu-ratio")
			b.ReportMetric(audio, "audio_s")
		})
	}
}

// BenchmarkSpeechAPIFirstByte times a streamed POST /v1/audio/speech of
// three sentences over a real HTTP connection: first-byte-ms is when the
// first audio byte reaches the client, total-ms when the body ends;
// first-byte-frac is their ratio (below 1: audio arrives before synthesis
// of the whole text ends).
func BenchmarkSpeechAPIFirstByte(b *testing.B) {
	_, s, _ := kokoroBench(b)
	srv := httptest.NewServer(http.HandlerFunc(s.audioSpeech))
	defer srv.Close()
	text := "Streaming starts with the first sentence. The second one follows while you listen. The third ends it."
	for _, format := range []string{"pcm", "mp3"} {
		b.Run(format, func(b *testing.B) {
			body := fmt.Sprintf(`{"model":"kokoro","response_format":%q,"input":%q}`, format, text)
			var first, total time.Duration
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				resp, err := http.Post(srv.URL, "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				one := make([]byte, 1)
				if _, err := io.ReadFull(resp.Body, one); err != nil || resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d: %v", resp.StatusCode, err)
				}
				first += time.Since(t0)
				var rest bytes.Buffer
				if _, err := rest.ReadFrom(resp.Body); err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				total += time.Since(t0)
			}
			n := float64(b.N)
			b.ReportMetric(first.Seconds()*1e3/n, "first-byte-ms")
			b.ReportMetric(total.Seconds()*1e3/n, "total-ms")
			b.ReportMetric(float64(first)/float64(total), "first-byte-frac")
		})
	}
}

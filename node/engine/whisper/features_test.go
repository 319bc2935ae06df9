package whisper

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/audiocodec"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// TestFeatures runs the model's other paths on one loaded engine: long
// audio over several windows, translation of English, a prompt, word
// timestamps, an MP3 decoded by audiocodec, caller errors and cancellation.
func TestFeatures(t *testing.T) {
	e := loadBase(t)
	clips := librivox(t)
	ctx := context.Background()

	t.Run("long-form", func(t *testing.T) {
		// The five clips with three seconds of silence between: about 40 s,
		// two windows. (The same clips twice would put the coming text in
		// the conditioning prompt, which makes Whisper loop.)
		var long []float32
		var ref []string
		for _, c := range clips {
			long = append(long, c.samples...)
			long = append(long, make([]float32, 3*sampleRate)...)
			ref = append(ref, c.ref)
		}
		var streamed []engine.Segment
		tr, err := e.Transcribe(ctx, engine.TranscribeRequest{Samples: long, Language: "en"}, func(s engine.Segment) { streamed = append(streamed, s) })
		if err != nil {
			t.Fatal(err)
		}
		if tr.Duration < 35 {
			t.Fatalf("duration %.1f", tr.Duration)
		}
		r := normalize(strings.Join(ref, " "))
		d := editDistance(r, normalize(tr.Text))
		t.Logf("%.1f s, %d segments, WER %.1f%%: %q", tr.Duration, len(tr.Segments), 100*float64(d)/float64(len(r)), tr.Text)
		if float64(d) > 0.1*float64(len(r)) {
			t.Errorf("WER %d/%d", d, len(r))
		}
		checkSegments(t, "long", tr)
		if len(streamed) != len(tr.Segments) {
			t.Errorf("onSegment saw %d segments, transcript has %d", len(streamed), len(tr.Segments))
		}
		if last := tr.Segments[len(tr.Segments)-1]; last.End < 30 {
			t.Errorf("last segment ends at %.1f s: the second window was not transcribed", last.End)
		}
	})

	t.Run("translate-english", func(t *testing.T) {
		tr, err := e.Transcribe(ctx, engine.TranscribeRequest{Samples: clips[0].samples, Translate: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := normalize(clips[0].ref)
		d := editDistance(r, normalize(tr.Text))
		t.Logf("translate: %q (language %s)", tr.Text, tr.Language)
		if tr.Language != "en" || float64(d) > 0.2*float64(len(r)) {
			t.Errorf("translation of English is not the English text: %q (%d errors)", tr.Text, d)
		}
	})

	t.Run("prompt", func(t *testing.T) {
		tr, err := e.Transcribe(ctx, engine.TranscribeRequest{Samples: clips[1].samples, Language: "en", Prompt: "Sense and Sensibility, by Jane Austen. Mr. Dashwood."}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d := editDistance(normalize(clips[1].ref), normalize(tr.Text)); d > 1 {
			t.Errorf("with a prompt: %q", tr.Text)
		}
		if strings.Contains(tr.Text, "Austen") {
			t.Errorf("the prompt leaked into the text: %q", tr.Text)
		}
	})

	t.Run("words", func(t *testing.T) {
		if !e.WordTimestamps() {
			t.Fatal("whisper-base has cross_attentions outputs; word timestamps should be available")
		}
		tr, err := e.Transcribe(ctx, engine.TranscribeRequest{Samples: clips[0].samples, Language: "en", WordTimestamps: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		prev := 0.0
		for _, w := range tr.Words {
			got = append(got, w.Word)
			if w.Start < prev || w.End < w.Start || w.End > tr.Duration+1e-9 {
				t.Errorf("word %q [%.2f, %.2f] after %.2f", w.Word, w.Start, w.End, prev)
			}
			prev = w.End
		}
		if strings.TrimSpace(strings.Join(got, "")) != tr.Text {
			t.Errorf("words %q do not make the text %q", got, tr.Text)
		}
		// The clip's speech spans most of its 7.1 s: the words must too.
		if len(tr.Words) < 15 || tr.Words[0].Start > 1.5 || tr.Words[len(tr.Words)-1].End < tr.Duration-2 {
			t.Errorf("words do not cover the speech: %+v", tr.Words)
		}
		t.Logf("words: %+v", tr.Words[:5])
	})

	t.Run("mp3", func(t *testing.T) {
		data, err := os.ReadFile("testdata/ill_disposed.mp3")
		if err != nil {
			t.Fatal(err)
		}
		x, _, err := audiocodec.Decode(data, 60)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := e.Transcribe(ctx, engine.TranscribeRequest{Samples: x}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d := editDistance(normalize("he was not an ill disposed young man"), normalize(tr.Text)); d > 0 {
			t.Errorf("mp3: %q", tr.Text)
		}
	})

	t.Run("input-errors", func(t *testing.T) {
		for name, c := range map[string]struct {
			req   engine.TranscribeRequest
			param string
		}{
			"empty":       {engine.TranscribeRequest{}, "file"},
			"language":    {engine.TranscribeRequest{Samples: clips[1].samples, Language: "xx"}, "language"},
			"temperature": {engine.TranscribeRequest{Samples: clips[1].samples, Temperature: 2}, "temperature"},
		} {
			_, err := e.Transcribe(ctx, c.req, nil)
			var ie *engine.InputError
			if !errors.As(err, &ie) || ie.Param != c.param {
				t.Errorf("%s: %v, want an InputError on %s", name, err, c.param)
			}
		}
	})

	t.Run("cancel", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := e.Transcribe(cctx, engine.TranscribeRequest{Samples: clips[0].samples}, nil)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error %v, want the deadline", err)
		}
		t.Logf("cancelled transcription returned after %v", time.Since(start))
	})
}

// TestLoadRejectsBadSpecs checks Load's errors.
func TestLoadRejectsBadSpecs(t *testing.T) {
	rt := onnxtest.Runtime(t)
	spec := baseSpec(t)
	spec.Task = engine.TaskEmbeddings
	if _, err := Load(rt, spec); err == nil {
		t.Error("loaded with the wrong task")
	}
	spec = baseSpec(t)
	spec.Files = map[string]string{"encoder": whisperFiles[0]}
	if _, err := Load(rt, spec); err == nil {
		t.Error("loaded without a decoder, config and tokenizer")
	}
}

package whisper

import (
	"context"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// BenchmarkTranscribe measures the real-time factor of Transcribe on the
// first LibriVox clip (7.1 s) against a bare loop that makes the same
// model runs (encoder, the initial sequence, then one decoder run per
// token of the transcript Transcribe produced) with no mel, no logit
// filtering, no sampling and no text work. ratio = bare / Transcribe: 1
// means the pipeline adds nothing to the model runs.
//
//	go test ./node/engine/whisper -run XXX -bench Transcribe -benchtime 3x
func BenchmarkTranscribe(b *testing.B) {
	e := loadBase(b)
	x := librivox(b)[0].samples
	ctx := context.Background()
	req := engine.TranscribeRequest{Samples: x, Language: "en"}
	tr, err := e.Transcribe(ctx, req, nil) // warm-up, and the tokens to replay
	if err != nil {
		b.Fatal(err)
	}
	var replay []int64
	for _, s := range tr.Segments {
		for _, t := range s.Tokens {
			replay = append(replay, int64(t))
		}
	}
	// Transcribe's runs also include the timestamp tokens: decode once
	// more to get the exact sampled sequence.
	s := <-e.slots
	e.mel.compute(x, 0, s.mel)
	if err := s.encode(ctx); err != nil {
		b.Fatal(err)
	}
	res, err := e.decodeWindow(ctx, s, decodeOptions{language: e.cfg.langToID["en"], task: e.cfg.transcribe})
	if err != nil {
		b.Fatal(err)
	}
	e.slots <- s
	seq := make([]int64, len(res.tokens))
	for i, t := range res.tokens {
		seq[i] = int64(t)
	}
	_, sotSeq := e.initialTokens(decodeOptions{language: e.cfg.langToID["en"], task: e.cfg.transcribe})
	audio := float64(len(x)) / sampleRate

	var pipe, bare time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := e.Transcribe(ctx, req, nil); err != nil {
			b.Fatal(err)
		}
		pipe += time.Since(start)

		start = time.Now()
		s := <-e.slots
		if err := s.encode(ctx); err != nil {
			b.Fatal(err)
		}
		if _, err := s.start(ctx, sotSeq, nil); err != nil {
			b.Fatal(err)
		}
		for _, t := range seq {
			if _, err := s.step(ctx, []int64{t}, false, nil); err != nil {
				b.Fatal(err)
			}
		}
		e.slots <- s
		bare += time.Since(start)
	}
	n := float64(b.N)
	b.ReportMetric(pipe.Seconds()/n/audio, "rtf")
	b.ReportMetric(bare.Seconds()/n/audio, "bare-rtf")
	b.ReportMetric(bare.Seconds()/pipe.Seconds(), "ratio")
	b.Logf("%d tokens (%d text), %.1f s audio: Transcribe %.2f s, bare %.2f s per run", len(seq), len(replay), audio, pipe.Seconds()/n, bare.Seconds()/n)
}

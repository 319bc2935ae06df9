package api

import (
	"math"
	"net/url"
	"testing"
)

// feedProbs pushes one 512-sample frame per probability (frame i holds the
// value i+1 so audio can be traced) and collects the events.
func feedProbs(s *segmenter, probs []float32, first int) []segEvent {
	var out []segEvent
	for i, p := range probs {
		f := make([]float32, 512)
		for j := range f {
			f[j] = float32(first + i + 1)
		}
		out = append(out, s.push(f, p)...)
	}
	return out
}

func repeat(p float32, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = p
	}
	return out
}

func TestSegmenterUtterance(t *testing.T) {
	cfg := segmenterConfig{Threshold: 0.5, NegThreshold: 0.35, MinSpeech: 4 * 512, MinSilence: 8 * 512, Pad: 2 * 512, MaxUtterance: 1 << 20}
	s := newSegmenter(cfg)
	var probs []float32
	probs = append(probs, repeat(0.1, 10)...) // frames 0-9 silence
	probs = append(probs, repeat(0.9, 20)...) // 10-29 speech
	probs = append(probs, 0.4, 0.2)           // 30 still speech (hysteresis), 31 silence
	probs = append(probs, repeat(0.9, 5)...)  // 32-36 speech again: a short pause does not end it
	probs = append(probs, repeat(0.1, 12)...) // 37-48 silence: ends after 8 frames (at 44)
	evs := feedProbs(s, probs, 0)
	if len(evs) != 2 || evs[0].Kind != segStarted || evs[1].Kind != segStopped {
		t.Fatalf("events %+v", evs)
	}
	// Started once 4 speech frames were seen; the utterance starts 2
	// frames (the padding) before the first speech frame.
	if evs[0].Start != 8*512 {
		t.Errorf("start %d, want %d", evs[0].Start, 8*512)
	}
	// Last speech frame is 36; 2 frames of padding after it.
	if evs[1].End != 39*512 || len(evs[1].Audio) != (39-8)*512 {
		t.Errorf("end %d, audio %d", evs[1].End, len(evs[1].Audio))
	}
	if evs[1].Audio[0] != 9 || evs[1].Audio[len(evs[1].Audio)-1] != 39 {
		t.Errorf("audio runs from frame %v to %v", evs[1].Audio[0], evs[1].Audio[len(evs[1].Audio)-1])
	}
	if s.speech() != nil {
		t.Error("speech after the end")
	}
	// The next utterance's pre-roll comes from the silence after the first.
	evs = feedProbs(s, repeat(0.9, 4), 49)
	if len(evs) != 1 || evs[0].Kind != segStarted || evs[0].Start != 47*512 {
		t.Fatalf("second start %+v", evs)
	}
	if sp := s.speech(); len(sp) != 6*512 {
		t.Errorf("open speech %d samples", len(sp))
	}
	// Commit ends it at once.
	evs = s.commit()
	if len(evs) != 1 || evs[0].Kind != segStopped || evs[0].End != 53*512 {
		t.Fatalf("commit %+v", evs)
	}
	if len(s.commit()) != 0 {
		t.Error("a second commit ended something")
	}
}

func TestSegmenterDropsShortBursts(t *testing.T) {
	cfg := segmenterConfig{Threshold: 0.5, NegThreshold: 0.35, MinSpeech: 4 * 512, MinSilence: 8 * 512, Pad: 2 * 512, MaxUtterance: 1 << 20}
	s := newSegmenter(cfg)
	var probs []float32
	for range 5 {
		probs = append(probs, 0.9, 0.9, 0.9, 0.1) // 3 frames: never confirmed
	}
	if evs := feedProbs(s, probs, 0); len(evs) != 0 {
		t.Fatalf("short bursts gave %+v", evs)
	}
	if len(s.commit()) != 0 {
		t.Fatal("commit of nothing")
	}
}

func TestSegmenterCutsLongUtterances(t *testing.T) {
	cfg := segmenterConfig{Threshold: 0.5, NegThreshold: 0.35, MinSpeech: 512, MinSilence: 8 * 512, Pad: 0, MaxUtterance: 10 * 512}
	s := newSegmenter(cfg)
	evs := feedProbs(s, repeat(0.9, 25), 0)
	var stops int
	for _, e := range evs {
		if e.Kind == segStopped {
			stops++
			if len(e.Audio) != 10*512 {
				t.Errorf("cut at %d samples", len(e.Audio))
			}
		}
	}
	if stops != 2 {
		t.Fatalf("%d cuts in 25 frames of speech at 10 frames each: %+v", stops, evs)
	}
}

func TestResamplerRates(t *testing.T) {
	for _, rate := range []int{8000, 16000, 24000, 44100, 48000} {
		r := newResampler(rate)
		var out []float32
		// One second of a 440 Hz tone in uneven pieces.
		in := make([]float32, rate)
		for i := range in {
			in[i] = float32(math.Sin(2 * math.Pi * 440 * float64(i) / float64(rate)))
		}
		for i := 0; i < len(in); i += 777 {
			out = r.push(out, in[i:min(i+777, len(in))])
		}
		if d := len(out) - 16000; d < -1 || d > 1 {
			t.Errorf("%d Hz: %d samples out, want 16000", rate, len(out))
		}
		// The tone survives: compare with the ideal 16 kHz tone.
		var maxErr float64
		for i := range min(len(out), 16000) {
			want := math.Sin(2 * math.Pi * 440 * float64(i) / 16000)
			maxErr = max(maxErr, math.Abs(float64(out[i])-want))
		}
		if maxErr > 0.05 {
			t.Errorf("%d Hz: max error %.3f", rate, maxErr)
		}
	}
}

func TestLiveParams(t *testing.T) {
	for q, ok := range map[string]bool{
		"model=m": true, "model=m&sample_rate=8000": true, "model=m&sample_rate=48000&language=en": true,
		"": false, "model=m&sample_rate=7999": false, "model=m&sample_rate=48001": false,
		"model=m&sample_rate=x": false, "model=m&language=english": false,
	} {
		v, _ := url.ParseQuery(q)
		p, err := parseLiveParams(v)
		if (err == nil) != ok {
			t.Errorf("%q: %v", q, err)
		}
		if q == "model=m" && (p.binRate != 16000 || p.jsonRate != 24000) {
			t.Errorf("default rates %d/%d", p.binRate, p.jsonRate)
		}
	}
}

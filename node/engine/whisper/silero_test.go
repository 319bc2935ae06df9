package whisper

import (
	"context"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// TestSileroVAD runs Silero VAD over silence, a LibriVox clip and silence,
// and checks that speech is found only where the clip is.
func TestSileroVAD(t *testing.T) {
	dir := onnxtest.AssetDir(t, "silero-vad", "silero_vad.onnx")
	v, err := LoadVAD(onnxtest.Runtime(t), engine.Spec{ID: "onnx/silero-vad/v4", Task: engine.TaskVoiceActivity, Dir: dir, Files: map[string]string{"model": "silero_vad.onnx"}})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	clip := librivox(t)[0].samples
	var x []float32
	x = append(x, make([]float32, 2*sampleRate)...)
	x = append(x, clip...)
	x = append(x, make([]float32, 2*sampleRate)...)
	s, err := v.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n := v.FrameSize()
	var line strings.Builder
	var silenceSpeech, clipSpeech, clipFrames, silenceFrames int
	for i := 0; i+n <= len(x); i += n {
		p, err := s.ProcessFrame(context.Background(), x[i:i+n])
		if err != nil {
			t.Fatal(err)
		}
		speech := p > 0.5
		if speech {
			line.WriteByte('#')
		} else {
			line.WriteByte('.')
		}
		inClip := i >= 2*sampleRate && i+n <= 2*sampleRate+len(clip)
		inSilence := i+n <= 2*sampleRate || i >= 2*sampleRate+len(clip)
		switch {
		case inClip:
			clipFrames++
			if speech {
				clipSpeech++
			}
		case inSilence:
			silenceFrames++
			if speech {
				silenceSpeech++
			}
		}
	}
	t.Logf("%s", line.String())
	if silenceSpeech > 0 || float64(clipSpeech) < 0.6*float64(clipFrames) {
		t.Errorf("speech in %d/%d silent frames and %d/%d clip frames", silenceSpeech, silenceFrames, clipSpeech, clipFrames)
	}
	if _, err := s.ProcessFrame(context.Background(), x[:10]); err == nil {
		t.Error("a short frame was accepted")
	}
}

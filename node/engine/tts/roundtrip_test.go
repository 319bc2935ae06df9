package tts

import (
	"context"
	"strings"
	"testing"
	"unicode"

	"github.com/infermesh/infermesh/node/audiocodec"
	"github.com/infermesh/infermesh/node/audioenc"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
	"github.com/infermesh/infermesh/node/engine/whisper"
)

// TestKokoroIntelligible synthesizes English, encodes it as wav
// (node/audioenc), decodes it to 16 kHz (node/audiocodec, as the API does
// for uploads) and transcribes it with Whisper base: the word error rate
// must be at most 10 %.
func TestKokoroIntelligible(t *testing.T) {
	k := loadKokoroT(t)
	dir := onnxtest.AssetDir(t, "whisper-base", "encoder_model_quantized.onnx", "decoder_model_merged_quantized.onnx")
	w, err := whisper.Load(onnxtest.Runtime(t), engine.Spec{
		ID: "onnx/whisper/base", Task: engine.TaskSpeechToText, Dir: dir,
		Files: map[string]string{
			"encoder": "encoder_model_quantized.onnx", "decoder": "decoder_model_merged_quantized.onnx",
			"config": "config.json", "generation_config": "generation_config.json", "tokenizer": "tokenizer.json",
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	text := "The quick brown fox jumps over the lazy dog. Inference runs locally on two CPU cores."
	pcm, _ := synthAll(t, k, engine.SpeechRequest{Text: text, Voice: "af_heart"})
	wav, err := audioenc.New().Encode(context.Background(), audioenc.WAV, pcm, KokoroSampleRate)
	if err != nil {
		t.Fatal(err)
	}
	samples, _, err := audiocodec.Decode(wav, 60)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := w.Transcribe(context.Background(), engine.TranscribeRequest{Samples: samples, Language: "en"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ref, hyp := words(text), words(tr.Text)
	wer := float64(editDistance(ref, hyp)) / float64(len(ref))
	t.Logf("whisper heard %q: WER %.1f%%", tr.Text, 100*wer)
	if wer > 0.10 {
		t.Fatalf("WER %.1f%% > 10%%: said %q, heard %q", 100*wer, text, tr.Text)
	}
}

// words lower-cases s and splits it into words without punctuation
// ("CPU" and "cpu" match).
func words(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '\'' })
}

// editDistance is the word-level Levenshtein distance.
func editDistance(a, b []string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

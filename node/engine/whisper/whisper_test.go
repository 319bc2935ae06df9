package whisper

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/infermesh/infermesh/node/audiocodec"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// librivoxDir holds Debian pocketsphinx-testdata's LibriVox clips and their
// reference transcripts.
const librivoxDir = "/usr/share/pocketsphinx/test/data/librivox"

var whisperFiles = []string{"encoder_model_quantized.onnx", "decoder_model_merged_quantized.onnx", "config.json", "generation_config.json", "tokenizer.json"}

// baseSpec is the spec scripts/assets-audio.sh's manifest describes.
func baseSpec(t testing.TB) engine.Spec {
	dir := onnxtest.AssetDir(t, "whisper-base", whisperFiles...)
	return engine.Spec{
		ID: "onnx/whisper/base", Task: engine.TaskSpeechToText, Dir: dir,
		Files: map[string]string{
			"encoder": whisperFiles[0], "decoder": whisperFiles[1], "config": whisperFiles[2],
			"generation_config": whisperFiles[3], "tokenizer": whisperFiles[4],
		},
	}
}

// loadBase loads whisper-base once per test binary... per test, closed at
// the end.
func loadBase(t testing.TB) *Engine {
	t.Helper()
	e, err := load(onnxtest.Runtime(t), baseSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

type clip struct {
	name, ref string
	samples   []float32
}

var (
	clipsOnce sync.Once
	clipsErr  error
	clipsVal  []clip
)

// librivox reads the five clips and their transcripts.
func librivox(t testing.TB) []clip {
	t.Helper()
	clipsOnce.Do(func() {
		data, err := os.ReadFile(filepath.Join(librivoxDir, "transcription"))
		if err != nil {
			clipsErr = err
			return
		}
		re := regexp.MustCompile(`^<s> (.*) </s> \((.*)\)$`)
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			m := re.FindStringSubmatch(strings.TrimSpace(line))
			if m == nil {
				continue
			}
			wav, err := os.ReadFile(filepath.Join(librivoxDir, m[2]+".wav"))
			if err != nil {
				clipsErr = err
				return
			}
			x, _, err := audiocodec.Decode(wav, 60)
			if err != nil {
				clipsErr = err
				return
			}
			clipsVal = append(clipsVal, clip{name: m[2], ref: m[1], samples: x})
		}
	})
	if clipsErr != nil {
		t.Fatalf("LibriVox clips (Debian package pocketsphinx-testdata): %v", clipsErr)
	}
	if len(clipsVal) != 5 {
		t.Fatalf("read %d LibriVox clips, want 5", len(clipsVal))
	}
	return clipsVal
}

var nonWord = regexp.MustCompile(`[^a-z0-9' ]+`)

// normalize lower-cases, drops punctuation and spells out the titles the
// reference writes in full.
func normalize(s string) []string {
	s = strings.ToLower(s)
	s = strings.NewReplacer("mr.", "mister", "mrs.", "missus", "-", " ").Replace(s)
	s = nonWord.ReplaceAllString(s, " ")
	return strings.Fields(s)
}

// editDistance is the word-level Levenshtein distance.
func editDistance(a, b []string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func TestEditDistance(t *testing.T) {
	if d := editDistance(normalize("And Mr. John, went."), normalize("and mister john went home")); d != 1 {
		t.Fatalf("distance %d, want 1", d)
	}
}

// TestLibriVoxWER transcribes the five LibriVox clips with language
// detection and checks the word error rate over the set, the detected
// language and the segments.
func TestLibriVoxWER(t *testing.T) {
	e := loadBase(t)
	var errs, words int
	for _, c := range librivox(t) {
		tr, err := e.Transcribe(context.Background(), engine.TranscribeRequest{Samples: c.samples}, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		ref := normalize(c.ref)
		d := editDistance(ref, normalize(tr.Text))
		errs += d
		words += len(ref)
		t.Logf("%s: %q (%d errors / %d words)", c.name, tr.Text, d, len(ref))
		if tr.Language != "en" {
			t.Errorf("%s: language %q, want en", c.name, tr.Language)
		}
		checkSegments(t, c.name, tr)
	}
	wer := float64(errs) / float64(words)
	t.Logf("WER %.1f%% (%d errors / %d words)", 100*wer, errs, words)
	if wer > 0.10 {
		t.Fatalf("WER %.1f%% > 10%%", 100*wer)
	}
}

// checkSegments asserts segments are ordered, non-overlapping, within the
// audio and that their texts make up the transcript.
func checkSegments(t *testing.T, name string, tr engine.Transcript) {
	t.Helper()
	if len(tr.Segments) == 0 {
		t.Errorf("%s: no segments", name)
		return
	}
	var joined strings.Builder
	prevEnd := 0.0
	for i, s := range tr.Segments {
		if s.ID != i {
			t.Errorf("%s: segment %d has ID %d", name, i, s.ID)
		}
		if s.Start < prevEnd || s.End < s.Start || s.End > tr.Duration+1e-9 {
			t.Errorf("%s: segment %d [%.2f, %.2f] after %.2f in %.2f s", name, i, s.Start, s.End, prevEnd, tr.Duration)
		}
		prevEnd = s.End
		joined.WriteString(s.Text)
	}
	if strings.TrimSpace(joined.String()) != tr.Text {
		t.Errorf("%s: segments %q do not make the text %q", name, joined.String(), tr.Text)
	}
}

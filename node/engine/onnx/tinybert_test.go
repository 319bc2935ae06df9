package onnx

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

// Test helpers for the embeddings tests: the ONNX Runtime library and the
// generated tiny-bert model. (A shared onnxtest package may replace
// testRuntime later; it is local here so these tests stand alone.)

// ortLibraryPath is where `make assets` puts the ONNX Runtime library,
// unless INFERMESH_ORT_LIB names another file.
func ortLibraryPath(tb testing.TB) string {
	if p := os.Getenv("INFERMESH_ORT_LIB"); p != "" {
		return p
	}
	cache := os.Getenv("INFERMESH_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			tb.Fatalf("no home directory to find the ONNX Runtime library in: %v", err)
		}
		cache = filepath.Join(home, ".cache", "infermesh")
	}
	return filepath.Join(cache, "ort", "1.30.0", "libonnxruntime.so")
}

// testRuntime opens a Runtime with cfg on the cached library. A missing
// library fails the test: these tests must run, not skip.
func testRuntime(tb testing.TB, cfg Config) *Runtime {
	tb.Helper()
	cfg.LibraryPath = ortLibraryPath(tb)
	if _, err := os.Stat(cfg.LibraryPath); err != nil {
		tb.Fatalf("ONNX Runtime library missing (%v): run `make assets` (scripts/assets.sh) first, or set INFERMESH_ORT_LIB", err)
	}
	r, err := NewRuntime(cfg)
	if err != nil {
		tb.Fatalf("NewRuntime: %v", err)
	}
	tb.Cleanup(func() { r.Close() })
	return r
}

// genTinyBERT runs testdata/models/gen_tiny_bert.py into a temporary
// directory and returns it.
func genTinyBERT(tb testing.TB) string { return genBERT(tb, "tiny") }

// genBERT generates the test encoder of the given shape ("tiny" or
// "minilm", the all-MiniLM-L6-v2 architecture with random weights).
func genBERT(tb testing.TB, shape string) string {
	return genModel(tb, "gen_tiny_bert.py", "--shape", shape)
}

// genModel runs a generator from testdata/models into a temporary
// directory and returns it.
func genModel(tb testing.TB, script string, args ...string) string {
	tb.Helper()
	path, err := filepath.Abs(filepath.Join("..", "..", "..", "testdata", "models", script))
	if err != nil {
		tb.Fatal(err)
	}
	python := os.Getenv("INFERMESH_PYTHON")
	if python == "" {
		python = "/usr/bin/python3"
	}
	dir := tb.TempDir()
	out, err := exec.Command(python, append([]string{path, dir}, args...)...).CombinedOutput()
	if err != nil {
		tb.Fatalf("run %s %s: %v\n%s\n(needs python3 with onnx and numpy: apt-get install python3-onnx python3-numpy)", python, path, err, out)
	}
	return dir
}

// tinyBERTSpec reads the generated manifest into a Spec, then applies
// option overrides.
func tinyBERTSpec(tb testing.TB, dir string, overrides map[string]string) engine.Spec {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var m struct {
		ID      string            `json:"id"`
		Task    string            `json:"task"`
		Files   map[string]string `json:"files"`
		Options map[string]string `json:"options"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		tb.Fatal(err)
	}
	for k, v := range overrides {
		m.Options[k] = v
	}
	return engine.Spec{ID: m.ID, Task: engine.Task(m.Task), Dir: dir, Files: m.Files, Options: m.Options}
}

// loadTinyBERT loads the generated model on r and closes it with the test.
func loadTinyBERT(tb testing.TB, r *Runtime, dir string, overrides map[string]string) *embedder {
	tb.Helper()
	e, err := r.LoadEmbedder(tinyBERTSpec(tb, dir, overrides))
	if err != nil {
		tb.Fatalf("LoadEmbedder: %v", err)
	}
	tb.Cleanup(func() { e.Close() })
	return e.(*embedder)
}

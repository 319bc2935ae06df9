package llama

import (
	"os"
	"path/filepath"
	"testing"
)

// testLibDir mirrors llamatest.LibDir for the package's internal tests.
func testLibDir(t testing.TB) string {
	t.Helper()
	d := os.Getenv("INFERMESH_LLAMA_DIR")
	if d == "" {
		cache := os.Getenv("INFERMESH_CACHE")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "infermesh")
		}
		d = filepath.Join(cache, "llama", "3.21.1")
	}
	if _, err := os.Stat(filepath.Join(d, libLlama)); err != nil {
		t.Fatalf("llama.cpp library missing in %s: run `make assets` (%v)", d, err)
	}
	return d
}

// testTinyDir is the generated tiny GGUF model's folder.
func testTinyDir(t testing.TB) string {
	t.Helper()
	d := os.Getenv("INFERMESH_TINY_GGUF_DIR")
	if d == "" {
		cache := os.Getenv("INFERMESH_CACHE")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "infermesh")
		}
		d = filepath.Join(cache, "models", "tiny-gguf")
	}
	if _, err := os.Stat(filepath.Join(d, "model.gguf")); err != nil {
		t.Fatalf("tiny GGUF model missing in %s: run `make assets` (%v)", d, err)
	}
	return d
}

// Package llamatest finds the real llama.cpp libraries and the generated
// GGUF test model that `make assets` puts in the cache, for tests that run
// llama.cpp in-process. A missing asset fails the test, never skips it.
package llamatest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine/llama"
)

// NPMVersion is the @node-llama-cpp/linux-x64 release scripts/assets-llama.sh
// fetches; the libraries land in <cache>/llama/<NPMVersion>.
const NPMVersion = "3.21.1"

// CacheDir returns $INFERMESH_CACHE, else ~/.cache/infermesh.
func CacheDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("INFERMESH_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatalf("llamatest: no home directory for the asset cache (%v); set INFERMESH_CACHE and run `make assets`", err)
	}
	return filepath.Join(home, ".cache", "infermesh")
}

// LibDir returns $INFERMESH_LLAMA_DIR, else <cache>/llama/<NPMVersion>,
// failing t when libllama is not there.
func LibDir(t testing.TB) string {
	t.Helper()
	d := os.Getenv("INFERMESH_LLAMA_DIR")
	if d == "" {
		d = filepath.Join(CacheDir(t), "llama", NPMVersion)
	}
	require(t, filepath.Join(d, "libllama.v0.4.0.so"), "llama.cpp library")
	return d
}

// Lib opens the library at LibDir, closed when the test ends.
func Lib(t testing.TB) *llama.Lib {
	t.Helper()
	l, err := llama.Open(LibDir(t))
	if err != nil {
		t.Fatalf("llamatest: %v", err)
	}
	t.Cleanup(l.Close)
	return l
}

// TinyDir returns the folder of the generated tiny GGUF chat model
// ($INFERMESH_TINY_GGUF_DIR, else <cache>/models/tiny-gguf).
func TinyDir(t testing.TB) string {
	t.Helper()
	d := os.Getenv("INFERMESH_TINY_GGUF_DIR")
	if d == "" {
		d = filepath.Join(CacheDir(t), "models", "tiny-gguf")
	}
	require(t, filepath.Join(d, "model.gguf"), "tiny GGUF test model")
	return d
}

func require(t testing.TB, path, what string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("llamatest: %s missing at %s: run `make assets` (%v)", what, path, err)
	}
}

// Package onnxtest finds the real ONNX Runtime library and model assets that
// scripts/assets.sh (`make assets`) puts in the cache, for tests of packages
// that run models in-process. A missing asset fails the test, never skips it:
// a green run must mean the real code ran against the real runtime.
package onnxtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine/onnx"
)

// ORTVersion is the ONNX Runtime release scripts/assets.sh fetches.
const ORTVersion = "1.30.0"

// CacheDir returns $INFERMESH_CACHE, else ~/.cache/infermesh (the same
// default as scripts/assets.sh).
func CacheDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("INFERMESH_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatalf("onnxtest: no home directory for the asset cache (%v); set INFERMESH_CACHE and run `make assets`", err)
	}
	return filepath.Join(home, ".cache", "infermesh")
}

// LibraryPath returns $INFERMESH_ORT_LIB, else the cached
// ort/<ORTVersion>/libonnxruntime.so, and fails t when the file is missing.
func LibraryPath(t testing.TB) string {
	t.Helper()
	p := os.Getenv("INFERMESH_ORT_LIB")
	if p == "" {
		p = filepath.Join(CacheDir(t), "ort", ORTVersion, "libonnxruntime.so")
	}
	requireFile(t, p, "ONNX Runtime library")
	return p
}

// Runtime returns an onnx.Runtime on LibraryPath, closed when the test ends.
func Runtime(t testing.TB) *onnx.Runtime {
	t.Helper()
	rt, err := onnx.NewRuntime(onnx.Config{LibraryPath: LibraryPath(t)})
	if err != nil {
		t.Fatalf("onnxtest: %v", err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("onnxtest: close runtime: %v", err)
		}
	})
	return rt
}

// AssetDir returns the folder of the named model asset: $INFERMESH_<NAME>_DIR
// (name upper-cased, non-alphanumerics as '_'; "isnet" reads
// INFERMESH_ISNET_DIR), else <CacheDir>/models/<name>. It fails t unless the
// folder exists and holds every file in files.
func AssetDir(t testing.TB, name string, files ...string) string {
	t.Helper()
	env := "INFERMESH_" + envName(name) + "_DIR"
	dir := os.Getenv(env)
	if dir == "" {
		dir = filepath.Join(CacheDir(t), "models", name)
	}
	requireDir(t, dir, name+" model folder ($"+env+")")
	for _, f := range files {
		requireFile(t, filepath.Join(dir, f), name+" model file")
	}
	return dir
}

func envName(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, name)
}

func requireFile(t testing.TB, path, what string) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("onnxtest: %s not found at %s (%v); run `make assets`", what, path, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() == 0 {
		t.Fatalf("onnxtest: %s at %s is not a non-empty file; run `make assets`", what, path)
	}
}

func requireDir(t testing.TB, path, what string) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("onnxtest: %s not found at %s (%v); run `make assets`", what, path, err)
	}
	if !fi.IsDir() {
		t.Fatalf("onnxtest: %s at %s is not a directory; run `make assets`", what, path)
	}
}

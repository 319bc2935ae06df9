package models

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tinyGGUF returns the bytes of the generated tiny GGUF model (make assets).
func tinyGGUF(t *testing.T) []byte {
	t.Helper()
	cache := os.Getenv("INFERMESH_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "infermesh")
	}
	b, err := os.ReadFile(filepath.Join(cache, "models", "tiny-gguf", "model.gguf"))
	if err != nil {
		t.Fatalf("tiny GGUF model missing: run `make assets` (%v)", err)
	}
	return b
}

// TestImportGGUFFile: a bare .gguf file imports under a manifest made from
// its metadata, with its size and digest recorded.
func TestImportGGUFFile(t *testing.T) {
	s := testStore(t)
	src := filepath.Join(t.TempDir(), "tiny.gguf")
	data := tinyGGUF(t)
	os.WriteFile(src, data, 0o644)
	m, err := s.Import(src)
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != "gguf/tiny-gguf/f32" || m.WireID() != "tiny-gguf:f32" || m.Task != "chat" || m.Files["model"] != "tiny.gguf" || m.Sizes["tiny.gguf"] != int64(len(data)) {
		t.Fatalf("manifest %+v", m)
	}
	if _, err := s.Get("tiny-gguf:f32"); err != nil {
		t.Fatal(err)
	}
}

// TestImportRefusesBadGGUF: truncated files, a wrong magic, an absurd
// tensor count and an unsupported architecture are refused at import with
// an error saying so, and nothing is installed.
func TestImportRefusesBadGGUF(t *testing.T) {
	good := tinyGGUF(t)
	badMagic := append([]byte("GGML"), good[4:]...)
	absurd := bytes.Clone(good)
	binary.LittleEndian.PutUint64(absurd[8:], 1<<40)
	otherArch := bytes.Clone(good)
	i := bytes.Index(otherArch, []byte("llama"))
	copy(otherArch[i:], "mamba")
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"truncated header", good[:100], "truncated"},
		{"truncated data", good[:len(good)-1000], "past the end"},
		{"wrong magic", badMagic, "not a GGUF file"},
		{"absurd tensor count", absurd, "tensors"},
		{"unsupported architecture", otherArch, `architecture "mamba" is not supported`},
		{"empty", nil, "not a GGUF file"},
	}
	for _, c := range cases {
		s := testStore(t)
		src := filepath.Join(t.TempDir(), "bad.gguf")
		os.WriteFile(src, c.data, 0o644)
		_, err := s.Import(src)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
		if len(s.List()) != 0 {
			t.Errorf("%s: something was installed", c.name)
		}
	}
}

package models

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func testStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "models"), slog.New(slog.NewTextHandler(io.Discard, nil)), func() time.Time { return time.Unix(1700000000, 0) })
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func writeModel(t *testing.T, m Manifest, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	b, _ := json.Marshal(m)
	os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o644)
	for name, content := range files {
		os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644)
	}
	return dir
}

func TestImportGetListRemove(t *testing.T) {
	s := testStore(t)
	src := writeModel(t, Manifest{ID: "onnx/fam/v1", Name: "fam", Tag: "v1", Task: "embeddings", Files: map[string]string{"model": "m.onnx", "tokenizer": "tok.json"}},
		map[string]string{"m.onnx": "weights", "tok.json": "{}"})
	m, err := s.Import(src)
	if err != nil {
		t.Fatal(err)
	}
	if m.Sizes["m.onnx"] != 7 || m.SHA256["m.onnx"] != "9a129038d9a00aed0cf6a7ea059ca50a813449061ab87848cf1a13eafdf33b2c" || m.Created != 1700000000 {
		t.Fatalf("manifest after import: %+v", m)
	}
	for _, id := range []string{"onnx/fam/v1", "fam:v1"} {
		got, err := s.Get(id)
		if err != nil || got.ID != "onnx/fam/v1" {
			t.Fatalf("get %s: %v %v", id, got, err)
		}
	}
	if _, err := s.Get("fam:v2"); err != ErrNotFound {
		t.Fatalf("unknown id: %v", err)
	}
	if err := s.Verify(m); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(s.Dir(m), "m.onnx"), []byte("tampered"), 0o644)
	if err := s.Verify(m); err == nil {
		t.Fatal("tampered file verified")
	}
	// A reopened store sees the same model.
	s2, err := Open(s.dir, s.log, s.clock)
	if err != nil || len(s2.List()) != 1 {
		t.Fatalf("reopen: %v %d", err, len(s2.List()))
	}
	if err := s.Remove("fam:v1"); err != nil {
		t.Fatal(err)
	}
	if len(s.List()) != 0 {
		t.Fatal("model still listed after remove")
	}
}

func TestImportFailureLeavesNothing(t *testing.T) {
	s := testStore(t)
	// The manifest names a file that does not exist.
	src := writeModel(t, Manifest{ID: "onnx/fam/v1", Name: "fam", Tag: "v1", Task: "embeddings", Files: map[string]string{"model": "missing.onnx"}}, nil)
	if _, err := s.Import(src); err == nil {
		t.Fatal("import of an incomplete folder succeeded")
	}
	entries, _ := os.ReadDir(s.dir)
	if len(entries) != 0 || len(s.List()) != 0 {
		t.Fatalf("leftovers after a failed import: %v", entries)
	}
}

func TestManifestValidation(t *testing.T) {
	good := Manifest{ID: "onnx/fam/v1", Name: "fam", Tag: "v1", Task: "embeddings", Files: map[string]string{"model": "m.onnx"}}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*Manifest){
		"two segments":    func(m *Manifest) { m.ID = "onnx/fam" },
		"upper case":      func(m *Manifest) { m.ID = "onnx/Fam/v1" },
		"unknown runtime": func(m *Manifest) { m.ID = "torch/fam/v1" },
		"bad wire":        func(m *Manifest) { m.Tag = "a:b" },
		"no task":         func(m *Manifest) { m.Task = "" },
		"no files":        func(m *Manifest) { m.Files = nil },
		"path escape":     func(m *Manifest) { m.Files = map[string]string{"model": "../x"} },
		"sub dir":         func(m *Manifest) { m.Files = map[string]string{"model": "a/b"} },
		"manifest itself": func(m *Manifest) { m.Files = map[string]string{"model": "manifest.json"} },
		"long part":       func(m *Manifest) { m.ID = "onnx/" + strings.Repeat("a", 80) + "/v1" },
	}
	for name, mut := range cases {
		m := good
		m.Files = map[string]string{"model": "m.onnx"}
		mut(&m)
		if err := m.Validate(); err == nil {
			t.Errorf("%s: accepted %+v", name, m)
		}
	}
}

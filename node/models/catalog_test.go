package models

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
)

func entry(key, name string) Entry {
	return Entry{Listing: Listing{Key: key, DisplayName: name, Modalities: []string{"embeddings"}},
		Install: Recipe{Name: name, Tag: "v1", Task: "embeddings", Files: map[string]string{"model": "model.onnx"}},
		Files:   []File{{Name: "model.onnx", URL: "https://example.invalid/" + name + "/model.onnx", Size: 10}}}
}

func writeSource(t *testing.T, path string, es ...Entry) {
	t.Helper()
	b, _ := json.Marshal(catalogFile{Entries: es})
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestBuiltinCatalogueIsValidAndCoversEveryEngine(t *testing.T) {
	es, err := parseCatalog(builtinCatalog)
	if err != nil {
		t.Fatal(err)
	}
	tasks := map[string]bool{}
	for _, e := range es {
		tasks[e.Install.Task] = true
		if e.Card == nil || e.License == "" || e.HomepageURL == "" || e.DownloadSizeBytes <= 0 {
			t.Errorf("%s: card, licence, homepage and download size are required in the built-in catalogue", e.Key)
		}
	}
	for _, task := range []string{"embeddings", "chat", "background-removal"} {
		if !tasks[task] {
			t.Errorf("the built-in catalogue has no %s model", task)
		}
	}
}

func TestRefreshReportsChangesAndBadSources(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "extra.json")
	writeSource(t, file, entry("onnx/a/v1", "a"), entry("onnx/b/v1", "b"))
	var served atomic.Value
	served.Store(`{"entries":[]}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(served.Load().(string))) }))
	defer srv.Close()
	c, err := NewCatalog(context.Background(), []string{file, srv.URL, filepath.Join(dir, "missing.json")})
	if err != nil {
		t.Fatal(err)
	}
	st := c.Status()
	if len(st) != 4 || st[0].Source != BuiltinSource || st[1].Entries != 2 || st[2].Error != "" || st[3].Error == "" {
		t.Fatalf("status %+v", st)
	}
	if _, ok := c.Get("onnx/a/v1"); !ok {
		t.Fatal("entry of the file source missing")
	}
	if e, ok := c.Get("b:v1"); !ok || e.Key != "onnx/b/v1" {
		t.Fatal("wire id lookup failed")
	}

	// The file drops b and changes a; the URL adds c; a later source wins.
	changed := entry("onnx/a/v1", "a")
	changed.Description = "new text"
	writeSource(t, file, changed)
	b, _ := json.Marshal(catalogFile{Entries: []Entry{entry("onnx/c/v1", "c")}})
	served.Store(string(b))
	ch, err := c.Refresh(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ch.Added, []string{"onnx/c/v1"}) || !reflect.DeepEqual(ch.Removed, []string{"onnx/b/v1"}) || !reflect.DeepEqual(ch.Changed, []string{"onnx/a/v1"}) {
		t.Fatalf("change %+v", ch)
	}

	// An invalid source is reported and leaves the others loaded.
	bad := entry("onnx/d/v1", "d")
	bad.Files[0].URL = "file:///etc/passwd"
	writeSource(t, file, bad)
	ch, err = c.Refresh(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ch.Sources[1].Error == "" || !strings.Contains(ch.Sources[1].Error, "http(s) URL") {
		t.Fatalf("invalid source not reported: %+v", ch.Sources[1])
	}
	if _, ok := c.Get("onnx/c/v1"); !ok {
		t.Fatal("the good source was dropped with the bad one")
	}
}

func TestEntryValidation(t *testing.T) {
	for name, mutate := range map[string]func(*Entry){
		"bad key":          func(e *Entry) { e.Key = "Not/A Key" },
		"file not listed":  func(e *Entry) { e.Install.Files["tokenizer"] = "tokenizer.json" },
		"path in name":     func(e *Entry) { e.Files[0].Name = "../x" },
		"bad sha":          func(e *Entry) { e.Files[0].SHA256 = "xyz" },
		"duplicate file":   func(e *Entry) { e.Files = append(e.Files, e.Files[0]) },
		"no task":          func(e *Entry) { e.Install.Task = "" },
		"negative size":    func(e *Entry) { e.Files[0].Size = -1 },
		"non-http url":     func(e *Entry) { e.Files[0].URL = "ftp://x/y" },
		"manifest as file": func(e *Entry) { e.Files[0].Name = "manifest.json"; e.Install.Files["model"] = "manifest.json" },
	} {
		e := entry("onnx/a/v1", "a")
		mutate(&e)
		if err := e.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	e := entry("onnx/a/v1", "a")
	if err := e.Validate(); err != nil {
		t.Fatal(err)
	}
}

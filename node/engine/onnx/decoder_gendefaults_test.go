package onnx

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

// TestGenerationConfigDefaults: a model whose generation_config.json says
// do_sample false decodes greedily when the request leaves temperature
// unset (any seed gives the temperature-0 answer), while the same model
// with its sampling defaults samples (seeds differ); explicit parameters
// still win.
func TestGenerationConfigDefaults(t *testing.T) {
	r, plain := loadTinyLlama(t, "fp32", Config{})
	src := genTinyLlama(t, "fp32")
	dir := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Symlink(filepath.Join(src, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	var gen map[string]any
	b, err := os.ReadFile(filepath.Join(src, "generation_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &gen); err != nil {
		t.Fatal(err)
	}
	gen["do_sample"] = false
	b, _ = json.Marshal(gen)
	os.Remove(filepath.Join(dir, "generation_config.json"))
	if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := r.LoadChat(manifestSpec(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	req := func(s int64, temperature *float64) engine.ChatRequest {
		return engine.ChatRequest{Messages: userMsg("Tell me a story about a cat."), Seed: seed(s), MaxTokens: 12, Temperature: temperature}
	}
	greedy := chatOnce(t, plain, req(1, temp(0))).Message.Content
	for _, s := range []int64{1, 2, 3} {
		if got := chatOnce(t, c, req(s, nil)).Message.Content; got != greedy {
			t.Fatalf("do_sample false, seed %d, temperature unset: %q, want the greedy %q", s, got, greedy)
		}
	}
	differ := false
	for _, s := range []int64{2, 3, 4, 5} {
		differ = differ || chatOnce(t, plain, req(s, nil)).Message.Content != chatOnce(t, plain, req(1, nil)).Message.Content
	}
	if !differ {
		t.Fatal("without the default, unset temperature did not sample (every seed gave the same answer)")
	}
	// Explicit parameters win over both configs (the generated model's own
	// generation_config.json sets temperature 0.7 and top_p 0.8).
	explicit := req(4, temp(1))
	explicit.TopP = temp(1)
	sampled := chatOnce(t, plain, explicit).Message.Content
	if got := chatOnce(t, c, explicit).Message.Content; got != sampled {
		t.Fatalf("explicit temperature and top_p 1 with do_sample false: %q, with the sampling defaults: %q", got, sampled)
	}
}

package chat

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

func TestParseGenerationDefaults(t *testing.T) {
	// Qwen2.5-Instruct's generation_config.json.
	qwen := []byte(`{"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
		"repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0"}`)
	g, err := ParseGenerationDefaults(qwen)
	if err != nil {
		t.Fatal(err)
	}
	if *g.Temperature != 0.7 || *g.TopP != 0.8 || *g.TopK != 20 || *g.RepetitionPenalty != 1.05 || !*g.DoSample || g.Greedy() {
		t.Fatalf("qwen defaults = %+v", g)
	}
	var req engine.ChatRequest
	g.Apply(&req)
	if req.Temperature == nil || *req.Temperature != 0.7 || req.TopP == nil || *req.TopP != 0.8 {
		t.Fatalf("applied = %v %v", req.Temperature, req.TopP)
	}
	// The request's own values win, and Apply copies (no aliasing).
	one, half := 1.0, 0.5
	req = engine.ChatRequest{Temperature: &one, TopP: &half}
	g.Apply(&req)
	if *req.Temperature != 1 || *req.TopP != 0.5 {
		t.Fatalf("request values overridden: %v %v", *req.Temperature, *req.TopP)
	}
	req = engine.ChatRequest{}
	g.Apply(&req)
	*req.Temperature = 2
	if *g.Temperature != 0.7 {
		t.Fatal("Apply aliases the defaults")
	}

	// do_sample false: greedy unless the request asks for a temperature.
	greedy, err := ParseGenerationDefaults([]byte(`{"do_sample": false, "temperature": 0.6, "top_p": 0.9, "top_k": 0}`))
	if err != nil {
		t.Fatal(err)
	}
	if !greedy.Greedy() || greedy.TopK != nil {
		t.Fatalf("greedy defaults = %+v", greedy)
	}
	req = engine.ChatRequest{}
	greedy.Apply(&req)
	if req.Temperature == nil || *req.Temperature != 0 || req.TopP != nil {
		t.Fatalf("do_sample false applied = %v %v", req.Temperature, req.TopP)
	}
	req = engine.ChatRequest{Temperature: &one}
	greedy.Apply(&req)
	if *req.Temperature != 1 {
		t.Fatal("an explicit temperature must win over do_sample false")
	}

	// No sampling fields: nothing changes.
	none, err := ParseGenerationDefaults([]byte(`{"eos_token_id": 2, "temperature": null}`))
	if err != nil {
		t.Fatal(err)
	}
	req = engine.ChatRequest{}
	none.Apply(&req)
	if req.Temperature != nil || req.TopP != nil {
		t.Fatal("empty defaults changed the request")
	}
	none.Apply(nil)

	for _, bad := range []string{`{"temperature": -1}`, `{"top_p": 0}`, `{"top_p": 1.5}`, `{"top_k": 2.5}`, `{"repetition_penalty": 0}`, `{"do_sample": "yes"}`, `[`} {
		if _, err := ParseGenerationDefaults([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestLoadGenerationDefaults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "generation_config.json")
	if err := os.WriteFile(path, []byte(`{"temperature": 0.3, "top_k": 40}`), 0o644); err != nil {
		t.Fatal(err)
	}
	g, err := LoadGenerationDefaults(path)
	if err != nil || *g.Temperature != 0.3 || *g.TopK != 40 || g.TopP != nil {
		t.Fatalf("%+v, %v", g, err)
	}
	if _, err := LoadGenerationDefaults(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Fatal("a missing file must fail")
	}
}

package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	ollama "github.com/ollama/ollama/api"
	"github.com/openai/openai-go/v3"

	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// TestLegacyOllamaGGUF drives a node serving the generated GGUF model as
// a chat model and as an embeddings model (mean pooling) through Ollama's
// Go client: tags (format gguf, real sizes), chat and generate equal to
// /v1, embed equal to /v1 embeddings.
func TestLegacyOllamaGGUF(t *testing.T) {
	const legacyAddr = "127.0.94.1:11434"
	data := t.TempDir()
	chatDir := onnxtest.AssetDir(t, "tiny-gguf", "manifest.json", "model.gguf")
	embedDir := filepath.Join(t.TempDir(), "tiny-gguf-embed")
	os.MkdirAll(embedDir, 0o755)
	model, err := os.ReadFile(filepath.Join(chatDir, "model.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(embedDir, "model.gguf"), model, 0o644)
	os.WriteFile(filepath.Join(embedDir, "manifest.json"), []byte(`{"id": "gguf/tiny-gguf/embed", "name": "tiny-gguf", "tag": "embed",
		"task": "embeddings", "modalities": ["embeddings"], "files": {"model": "model.gguf"}, "options": {"pooling": "mean"}}`), 0o644)
	for _, dir := range []string{chatDir, embedDir} {
		if out, err := exec.Command(binPath, "models", "import", "--data-dir", data, dir).CombinedOutput(); err != nil {
			t.Fatalf("import %s: %v\n%s", dir, err, out)
		}
	}
	p := launch(t, "legacy-gguf", []string{"serve", "--data-dir", data, "--node-id", "legacy-gguf", "--listen", "127.0.94.1:0",
		"--gossip-listen", "127.0.94.1:0", "--rpc-listen", "127.0.94.1:0", "--legacy-listen", legacyAddr, "--legacy-end-date", "2999-12-31"})
	cl := legacyClient(legacyAddr)
	v1 := p.client()
	ctx := context.Background()

	tags, err := cl.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(tags.Models) != 2 {
		t.Fatalf("tags %+v", tags.Models)
	}
	for _, m := range tags.Models {
		if m.Details.Format != "gguf" || m.Size != int64(len(model)) || len(m.Digest) != 64 {
			t.Errorf("tag %+v (file %d bytes)", m, len(model))
		}
	}

	const prompt = "Tell me about the weather today."
	opts := map[string]any{"seed": 7, "num_predict": 24, "temperature": 0.7}
	var pieces []string
	var last ollama.ChatResponse
	err = cl.Chat(ctx, &ollama.ChatRequest{Model: "tiny-gguf:test", Messages: []ollama.Message{{Role: "user", Content: prompt}}, Options: opts},
		func(r ollama.ChatResponse) error {
			if !r.Done {
				pieces = append(pieces, r.Message.Content)
			}
			last = r
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	want, err := v1.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "tiny-gguf:test", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		Seed: openai.Int(7), MaxTokens: openai.Int(24), Temperature: openai.Float(0.7)})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(pieces, ""); got != want.Choices[0].Message.Content || got == "" || len(pieces) < 3 {
		t.Errorf("streamed chat %q (%d pieces), /v1 %q", got, len(pieces), want.Choices[0].Message.Content)
	}
	if !last.Done || last.EvalCount != int(want.Usage.CompletionTokens) || last.PromptEvalCount != int(want.Usage.PromptTokens) {
		t.Errorf("final chunk %+v", last)
	}
	var gen strings.Builder
	err = cl.Generate(ctx, &ollama.GenerateRequest{Model: "tiny-gguf:test", Prompt: prompt, Options: opts}, func(r ollama.GenerateResponse) error {
		gen.WriteString(r.Response)
		return nil
	})
	if err != nil || gen.String() != want.Choices[0].Message.Content {
		t.Errorf("generate %q (%v), /v1 %q", gen.String(), err, want.Choices[0].Message.Content)
	}

	texts := []string{"hello world", "another text"}
	emb, err := cl.Embed(ctx, &ollama.EmbedRequest{Model: "tiny-gguf:embed", Input: texts})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := v1.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "tiny-gguf:embed", Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: texts}})
	if err != nil {
		t.Fatal(err)
	}
	if len(emb.Embeddings) != 2 || len(emb.Embeddings[0]) != 64 || emb.PromptEvalCount != int(ref.Usage.PromptTokens) {
		t.Fatalf("embed: %d vectors of %d, prompt %d", len(emb.Embeddings), len(emb.Embeddings[0]), emb.PromptEvalCount)
	}
	for i := range texts {
		for j, x := range emb.Embeddings[i] {
			if float64(x) != float64(float32(ref.Data[i].Embedding[j])) {
				t.Fatalf("embed vector %d differs from /v1 at %d", i, j)
			}
		}
	}
	raw, _ := json.Marshal(emb.Embeddings[0][:2])
	t.Logf("embed ok, first values %s", raw)
}

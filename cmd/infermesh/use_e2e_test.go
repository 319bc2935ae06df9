package main

import (
	"context"
	"testing"

	"github.com/openai/openai-go/v3"
)

// TestEndToEndSentenceEncoder: the Universal Sentence Encoder lite that
// `make run` installs (scripts/assets-use.sh) serves /v1/embeddings through
// a real node, called with the official OpenAI Go SDK: of three sentences,
// the paraphrase pair is the closest.
func TestEndToEndSentenceEncoder(t *testing.T) {
	p := startNode(t, "e2e-use", "use-lite")
	c := p.client()
	ctx := context.Background()
	const id, wire = "onnx/use/lite-en", "use:lite-en"
	texts := []string{
		"How do I reset my password?",
		"I forgot my password and need to change it.",
		"The train to Berlin leaves at nine in the morning.",
	}
	res, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: wire,
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: texts},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Model != id || len(res.Data) != len(texts) || res.Usage.PromptTokens <= int64(len(texts)) {
		t.Fatalf("model %s, %d vectors, usage %+v", res.Model, len(res.Data), res.Usage)
	}
	v := make([][]float64, len(texts))
	for i, d := range res.Data {
		if int(d.Index) != i || len(d.Embedding) != 512 {
			t.Fatalf("item %d: index %d, %d dimensions", i, d.Index, len(d.Embedding))
		}
		v[i] = d.Embedding
	}
	cos := func(a, b []float64) float64 {
		var s float64
		for k := range a {
			s += a[k] * b[k]
		}
		return s / (norm(a) * norm(b))
	}
	para, other1, other2 := cos(v[0], v[1]), cos(v[0], v[2]), cos(v[1], v[2])
	t.Logf("cosine: paraphrases %.3f, unrelated %.3f and %.3f", para, other1, other2)
	if para < other1+0.2 || para < other2+0.2 {
		t.Errorf("paraphrase cosine %.3f is not 0.2 above the unrelated pairs' %.3f, %.3f", para, other1, other2)
	}

	// An empty string has no row in the model's sparse batch: a 400.
	_, err = c.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: id,
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"fine", ""}},
	})
	expectAPIError(t, err, 400, "invalid_value", "input")
}

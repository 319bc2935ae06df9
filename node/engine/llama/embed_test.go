package llama

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

func loadTinyEmbedder(t *testing.T, pooling string) *embedEngine {
	t.Helper()
	r, err := NewRuntime(testLibDir(t), Config{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	e, err := r.loadEmbedder(engine.Spec{ID: "gguf/tiny-gguf/embed", Task: engine.TaskEmbeddings, Dir: testTinyDir(t),
		Files: map[string]string{"model": "model.gguf"}, Options: map[string]string{"pooling": pooling}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close()
		r.Close()
	})
	return e
}

// TestEmbeddings: pooled vectors (mean, cls, last) are unit length, the
// same text alone or in a batch of ten gives the same vector (within
// 5e-4: the batch changes float summation order), different
// texts give different vectors, token arrays equal their text, and caller
// mistakes are InputErrors.
func TestEmbeddings(t *testing.T) {
	texts := []string{"the mesh answers questions", "a cold morning in the mountains", "{\"city\": \"Paris\"}", "x",
		"numbers 1 2 3", "café", "tell me about the nodes", "rain tomorrow", "one more", "and the tenth"}
	for _, pooling := range []string{"mean", "cls", "last"} {
		e := loadTinyEmbedder(t, pooling)
		all, err := e.Embed(context.Background(), engine.EmbedRequest{Texts: texts})
		if err != nil {
			t.Fatal(err)
		}
		if len(all.Vectors) != len(texts) || all.PromptTokens == 0 {
			t.Fatalf("%s: %d vectors, %d tokens", pooling, len(all.Vectors), all.PromptTokens)
		}
		for i, text := range texts {
			one, err := e.Embed(context.Background(), engine.EmbedRequest{Texts: []string{text}})
			if err != nil {
				t.Fatal(err)
			}
			v, w := one.Vectors[0], all.Vectors[i]
			var n, diff float64
			for j := range v {
				n += float64(v[j]) * float64(v[j])
				diff = max(diff, math.Abs(float64(v[j]-w[j])))
			}
			if math.Abs(n-1) > 1e-4 || diff > 5e-4 || len(v) != e.MaxDimensions() {
				t.Fatalf("%s %q: norm² %v, batch difference %v, dims %d", pooling, text, n, diff, len(v))
			}
		}
		if pooling != "cls" && all.Vectors[0][0] == all.Vectors[1][0] && all.Vectors[0][1] == all.Vectors[1][1] {
			t.Errorf("%s: different texts gave the same vector", pooling)
		}
		ids, _ := e.lm.Tokenize(texts[0], true, false)
		toks := make([]int64, len(ids))
		for i, id := range ids {
			toks[i] = int64(id)
		}
		byTokens, err := e.Embed(context.Background(), engine.EmbedRequest{Tokens: [][]int64{toks}})
		if err != nil || math.Abs(float64(byTokens.Vectors[0][3]-all.Vectors[0][3])) > 5e-4 {
			t.Fatalf("%s: token input %v differs from text", pooling, err)
		}
		var ie *engine.InputError
		for _, bad := range []engine.EmbedRequest{{}, {Texts: []string{"a"}, Tokens: [][]int64{{1}}}, {Tokens: [][]int64{{1 << 30}}}, {Texts: []string{"a"}, Dimensions: 3}} {
			if _, err := e.Embed(context.Background(), bad); !errors.As(err, &ie) {
				t.Errorf("%s: %+v: want an InputError, got %v", pooling, bad, err)
			}
		}
	}
}

package llama_test

import (
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine/llama"
	"github.com/infermesh/infermesh/node/engine/llama/llamatest"
)

func TestOpenAndGreedyDecode(t *testing.T) {
	lib := llamatest.Lib(t)
	t.Logf("llama.cpp %s", lib.Version())
	m, err := lib.LoadModel(filepath.Join(llamatest.TinyDir(t), "model.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	ids, err := m.Tokenize("<|im_start|>user\nHello there<|im_end|>\n", false, true)
	if err != nil || len(ids) < 4 {
		t.Fatalf("tokenize: %v %v", ids, err)
	}
	c, err := m.NewContext(llama.ContextConfig{Context: 256, Sequences: 2, Batch: 64, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Free()
	b := c.Batch()
	for i, id := range ids {
		b.Add(id, i, 0, i == len(ids)-1)
	}
	if err := c.Decode(); err != nil {
		t.Fatal(err)
	}
	lg := c.Logits(len(ids) - 1)
	if len(lg) != m.VocabSize() {
		t.Fatalf("logits %d, vocab %d", len(lg), m.VocabSize())
	}
	t.Logf("vocab %d, first logits %v", m.VocabSize(), lg[:4])
}

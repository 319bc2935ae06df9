package onnx

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

// testTexts returns n distinct texts of varied length (3 to 3+spread words
// plus "number <i>."), mostly from tiny-bert's vocabulary.
func testTexts(n, spread int) []string {
	sampleWords := strings.Fields(`the quick brown fox jumps over a lazy dog while
		people watch from the river bank and talk about music science water history
		computer network cluster service memory queue worker signal weather garden
		mountain ocean island winter summer morning evening happy tired unaffable`)
	out := make([]string, n)
	for i := range out {
		words := make([]string, 3+(i*37)%(spread+1))
		for j := range words {
			words[j] = sampleWords[(i*13+j*5+j*j)%len(sampleWords)]
		}
		out[i] = fmt.Sprintf("%s number %d.", strings.Join(words, " "), i)
	}
	return out
}

func vecNorm(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

func vecDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

func mustEmbed(t testing.TB, e engine.Embedder, req engine.EmbedRequest) engine.EmbedResult {
	t.Helper()
	res, err := e.Embed(context.Background(), req)
	if err != nil {
		t.Fatalf("Embed: %v", err)
	}
	return res
}

func wantInputError(t *testing.T, err error, param string) {
	t.Helper()
	var ie *engine.InputError
	if !errors.As(err, &ie) || ie.Param != param || !errors.Is(err, engine.ErrInvalidInput) {
		t.Fatalf("err = %v, want an InputError for %q", err, param)
	}
}

func TestEmbedVectors(t *testing.T) {
	dir := genTinyBERT(t)
	for _, maxBatch := range []int{1, 32} {
		t.Run(fmt.Sprintf("maxbatch=%d", maxBatch), func(t *testing.T) {
			e := loadTinyBERT(t, testRuntime(t, Config{MaxBatch: maxBatch, MaxWaitMicros: 500}), dir, nil)
			if e.MaxDimensions() != 128 || !e.TruncatableDimensions() || e.ID() != "onnx/tiny-bert/test-128" {
				t.Fatalf("MaxDimensions %d, Truncatable %v, ID %q", e.MaxDimensions(), e.TruncatableDimensions(), e.ID())
			}
			texts := []string{"The quick brown fox.", "A lazy dog sleeps in the sun all day long", "The quick brown fox."}
			res := mustEmbed(t, e, engine.EmbedRequest{Texts: texts})
			if len(res.Vectors) != 3 {
				t.Fatalf("%d vectors, want 3", len(res.Vectors))
			}
			wantTokens := 0
			for i, v := range res.Vectors {
				if len(v) != 128 || math.Abs(vecNorm(v)-1) > 1e-5 {
					t.Fatalf("vector %d: len %d, norm %v", i, len(v), vecNorm(v))
				}
				enc, err := e.tok.Encode(texts[i], 0)
				if err != nil {
					t.Fatal(err)
				}
				wantTokens += len(enc.IDs)
			}
			if res.PromptTokens != wantTokens {
				t.Fatalf("PromptTokens = %d, want %d", res.PromptTokens, wantTokens)
			}
			if d := vecDiff(res.Vectors[0], res.Vectors[2]); d > 1e-6 {
				t.Fatalf("identical inputs differ by %g", d)
			}
			if d := vecDiff(res.Vectors[0], res.Vectors[1]); d < 1e-3 {
				t.Fatalf("different inputs differ by only %g", d)
			}
			again := mustEmbed(t, e, engine.EmbedRequest{Texts: texts[:1]})
			if d := vecDiff(res.Vectors[0], again.Vectors[0]); d > 1e-5 {
				t.Fatalf("repeated call differs by %g", d)
			}
		})
	}
}

// TestBatchMatchesSingles runs sequences of very different lengths as one
// padded session run and one at a time: padding must not leak into the
// pooled vectors.
func TestBatchMatchesSingles(t *testing.T) {
	dir := genTinyBERT(t)
	for _, pooling := range []string{"mean", "cls"} {
		t.Run(pooling, func(t *testing.T) {
			e := loadTinyBERT(t, testRuntime(t, Config{MaxBatch: 1}), dir, map[string]string{"pooling": pooling})
			texts := append(testTexts(6, 40), "x", strings.Repeat("water river ocean ", 60))
			seqs, err := e.sequences(engine.EmbedRequest{Texts: texts})
			if err != nil {
				t.Fatal(err)
			}
			batched, err := e.infer(seqs)
			if err != nil {
				t.Fatal(err)
			}
			for i := range seqs {
				single, err := e.infer(seqs[i : i+1])
				if err != nil {
					t.Fatal(err)
				}
				l2normalize(single[0])
				l2normalize(batched[i])
				if d := vecDiff(single[0], batched[i]); d > 1e-5 {
					t.Fatalf("input %d (%d tokens): batched differs from single by %g", i, len(seqs[i].ids), d)
				}
			}
		})
	}
}

func TestPoolingModesDiffer(t *testing.T) {
	dir := genTinyBERT(t)
	r := testRuntime(t, Config{MaxBatch: 1})
	mean := mustEmbed(t, loadTinyBERT(t, r, dir, nil), engine.EmbedRequest{Texts: []string{"happy dog"}})
	cls := mustEmbed(t, loadTinyBERT(t, r, dir, map[string]string{"pooling": "cls"}), engine.EmbedRequest{Texts: []string{"happy dog"}})
	if d := vecDiff(mean.Vectors[0], cls.Vectors[0]); d < 1e-3 {
		t.Fatalf("mean and cls pooling agree to %g", d)
	}
	raw := mustEmbed(t, loadTinyBERT(t, r, dir, map[string]string{"normalize": "false"}), engine.EmbedRequest{Texts: []string{"happy dog"}})
	if n := vecNorm(raw.Vectors[0]); math.Abs(n-1) < 1e-3 {
		t.Fatalf("unnormalised vector has norm %g", n)
	}
	l2normalize(raw.Vectors[0])
	if d := vecDiff(raw.Vectors[0], mean.Vectors[0]); d > 1e-6 {
		t.Fatalf("normalised raw vector differs from the normalised one by %g", d)
	}
}

func TestEmbedTokenArrays(t *testing.T) {
	dir := genTinyBERT(t)
	e := loadTinyBERT(t, testRuntime(t, Config{MaxBatch: 8, MaxWaitMicros: 200}), dir, nil)
	texts := []string{"Unaffable people watch the river.", "memory queue"}
	fromText := mustEmbed(t, e, engine.EmbedRequest{Texts: texts})
	var tokens [][]int64
	for _, s := range texts {
		enc, err := e.tok.Encode(s, 0)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, enc.IDs)
	}
	fromTokens := mustEmbed(t, e, engine.EmbedRequest{Tokens: tokens})
	for i := range texts {
		if d := vecDiff(fromText.Vectors[i], fromTokens.Vectors[i]); d > 1e-5 {
			t.Fatalf("input %d: token array differs from text by %g", i, d)
		}
	}
	if fromTokens.PromptTokens != fromText.PromptTokens {
		t.Fatalf("PromptTokens %d from tokens, %d from text", fromTokens.PromptTokens, fromText.PromptTokens)
	}

	vocab := int64(e.tok.VocabSize())
	for name, req := range map[string]engine.EmbedRequest{
		"id past vocabulary": {Tokens: [][]int64{{2, vocab, 3}}},
		"negative id":        {Tokens: [][]int64{{2, -1, 3}}},
		"empty array":        {Tokens: [][]int64{{2, 3}, {}}},
		"nothing":            {},
		"texts and tokens":   {Texts: []string{"a"}, Tokens: [][]int64{{2, 3}}},
		"text too large":     {Texts: []string{strings.Repeat("a", 2<<20)}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := e.Embed(context.Background(), req)
			wantInputError(t, err, "input")
		})
	}
}

func TestEmbedTruncation(t *testing.T) {
	dir := genTinyBERT(t)
	r := testRuntime(t, Config{MaxBatch: 4, MaxWaitMicros: 100})
	short := loadTinyBERT(t, r, dir, map[string]string{"max_tokens": "16"})
	long := loadTinyBERT(t, r, dir, nil)
	text := strings.Join(testTexts(20, 10), " ")

	res := mustEmbed(t, short, engine.EmbedRequest{Texts: []string{text}})
	if res.PromptTokens != 16 {
		t.Fatalf("PromptTokens = %d, want 16", res.PromptTokens)
	}
	enc, err := short.tok.Encode(text, 16)
	if err != nil {
		t.Fatal(err)
	}
	first16 := mustEmbed(t, long, engine.EmbedRequest{Tokens: [][]int64{enc.IDs}})
	if d := vecDiff(res.Vectors[0], first16.Vectors[0]); d > 1e-5 {
		t.Fatalf("truncated text differs from its first 16 tokens by %g", d)
	}
	full := mustEmbed(t, long, engine.EmbedRequest{Texts: []string{text}})
	if full.PromptTokens <= 16 || vecDiff(full.Vectors[0], res.Vectors[0]) < 1e-3 {
		t.Fatalf("untruncated: %d tokens, differs by %g", full.PromptTokens, vecDiff(full.Vectors[0], res.Vectors[0]))
	}

	// Token arrays are cut at max_tokens as given, with no [SEP] added.
	all, err := long.tok.Encode(text, 0)
	if err != nil {
		t.Fatal(err)
	}
	cut := mustEmbed(t, short, engine.EmbedRequest{Tokens: [][]int64{all.IDs}})
	want := mustEmbed(t, long, engine.EmbedRequest{Tokens: [][]int64{all.IDs[:16]}})
	if cut.PromptTokens != 16 || vecDiff(cut.Vectors[0], want.Vectors[0]) > 1e-5 {
		t.Fatalf("token array cut: %d tokens, differs by %g", cut.PromptTokens, vecDiff(cut.Vectors[0], want.Vectors[0]))
	}

	// Longer than the model's 512 positions still works: it is cut at 512.
	huge := mustEmbed(t, long, engine.EmbedRequest{Texts: []string{strings.Repeat("dog ", 2000)}})
	if huge.PromptTokens != 512 {
		t.Fatalf("PromptTokens = %d, want 512", huge.PromptTokens)
	}
}

func TestEmbedDimensions(t *testing.T) {
	dir := genTinyBERT(t)
	r := testRuntime(t, Config{MaxBatch: 1})
	e := loadTinyBERT(t, r, dir, nil)
	texts := []string{"summer garden", "winter mountain"}
	full := mustEmbed(t, e, engine.EmbedRequest{Texts: texts})
	short := mustEmbed(t, e, engine.EmbedRequest{Texts: texts, Dimensions: 32})
	for i := range texts {
		v := short.Vectors[i]
		if len(v) != 32 || math.Abs(vecNorm(v)-1) > 1e-5 {
			t.Fatalf("vector %d: len %d norm %g", i, len(v), vecNorm(v))
		}
		want := append([]float32(nil), full.Vectors[i][:32]...)
		l2normalize(want)
		if d := vecDiff(v, want); d > 1e-6 {
			t.Fatalf("vector %d: truncated differs from prefix by %g", i, d)
		}
	}
	same := mustEmbed(t, e, engine.EmbedRequest{Texts: texts, Dimensions: 128})
	if d := vecDiff(same.Vectors[0], full.Vectors[0]); d > 1e-6 {
		t.Fatalf("dimensions 128 differs by %g", d)
	}
	for _, d := range []int{129, -1} {
		_, err := e.Embed(context.Background(), engine.EmbedRequest{Texts: texts, Dimensions: d})
		wantInputError(t, err, "dimensions")
	}

	fixed := loadTinyBERT(t, r, dir, map[string]string{"truncatable_dimensions": "false"})
	if fixed.TruncatableDimensions() {
		t.Fatal("truncatable_dimensions false not honoured")
	}
	_, err := fixed.Embed(context.Background(), engine.EmbedRequest{Texts: texts, Dimensions: 32})
	wantInputError(t, err, "dimensions")
	mustEmbed(t, fixed, engine.EmbedRequest{Texts: texts, Dimensions: 128})
}

func TestLoadEmbedderRejectsBadSpecs(t *testing.T) {
	dir := genTinyBERT(t)
	r := testRuntime(t, Config{MaxBatch: 1})
	for name, c := range map[string]struct {
		opts map[string]string
		edit func(*engine.Spec)
		want string
	}{
		"pooling":         {opts: map[string]string{"pooling": "max"}, want: "pooling"},
		"dimensions":      {opts: map[string]string{"dimensions": "64"}, want: "dimensions 64"},
		"max_tokens":      {opts: map[string]string{"max_tokens": "2"}, want: "max_tokens"},
		"normalize":       {opts: map[string]string{"normalize": "maybe"}, want: "normalize"},
		"no model file":   {edit: func(s *engine.Spec) { s.Files = map[string]string{"tokenizer": "tokenizer.json"} }, want: "files"},
		"missing model":   {edit: func(s *engine.Spec) { s.Files["model"] = "nope.onnx" }, want: "nope.onnx"},
		"wrong task":      {edit: func(s *engine.Spec) { s.Task = engine.TaskBackgroundRemoval }, want: "task"},
		"bad tokenizer":   {edit: func(s *engine.Spec) { s.Files["tokenizer"] = "manifest.json" }, want: "model"},
		"not a tokenizer": {edit: func(s *engine.Spec) { s.Files["tokenizer"] = "model.onnx" }, want: "tokenizer"},
	} {
		t.Run(name, func(t *testing.T) {
			spec := tinyBERTSpec(t, dir, c.opts)
			if c.edit != nil {
				c.edit(&spec)
			}
			e, err := r.LoadEmbedder(spec)
			if err == nil {
				e.Close()
				t.Fatal("LoadEmbedder succeeded")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
		})
	}
}

// TestConcurrentCallsGetTheirOwnVectors sends many distinct texts at once
// through the batcher and checks each against the same text run alone.
func TestConcurrentCallsGetTheirOwnVectors(t *testing.T) {
	dir := genTinyBERT(t)
	e := loadTinyBERT(t, testRuntime(t, Config{MaxBatch: 16, MaxWaitMicros: 2000}), dir, nil)
	texts := testTexts(96, 30)
	want := make([][]float32, len(texts))
	for i, s := range texts {
		seqs, err := e.sequences(engine.EmbedRequest{Texts: []string{s}})
		if err != nil {
			t.Fatal(err)
		}
		v, err := e.infer(seqs)
		if err != nil {
			t.Fatal(err)
		}
		l2normalize(v[0])
		want[i] = v[0]
	}
	got := make([][]float32, len(texts))
	errs := make([]error, len(texts))
	var wg sync.WaitGroup
	for i := range texts {
		wg.Go(func() {
			// Every third call sends two inputs to mix multi-input calls in.
			req := engine.EmbedRequest{Texts: []string{texts[i]}}
			if i%3 == 0 {
				req.Texts = append(req.Texts, texts[(i+1)%len(texts)])
			}
			res, err := e.Embed(context.Background(), req)
			if err == nil && len(res.Vectors) != len(req.Texts) {
				err = fmt.Errorf("%d vectors for %d texts", len(res.Vectors), len(req.Texts))
			}
			if err == nil && i%3 == 0 && vecDiff(res.Vectors[1], want[(i+1)%len(texts)]) > 1e-5 {
				err = fmt.Errorf("second input got another input's vector")
			}
			if err == nil {
				got[i] = res.Vectors[0]
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i := range texts {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if d := vecDiff(got[i], want[i]); d > 1e-5 {
			t.Fatalf("call %d (%q) differs from its own text by %g", i, texts[i], d)
		}
	}
}

func TestEmbedAfterClose(t *testing.T) {
	dir := genTinyBERT(t)
	for _, maxBatch := range []int{1, 4} {
		e := loadTinyBERT(t, testRuntime(t, Config{MaxBatch: maxBatch}), dir, nil)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Embed(context.Background(), engine.EmbedRequest{Texts: []string{"x"}}); err == nil {
			t.Fatalf("maxbatch %d: Embed after Close succeeded", maxBatch)
		}
		if err := e.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	}
}

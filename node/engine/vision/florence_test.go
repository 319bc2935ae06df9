package vision

import (
	"context"
	"errors"
	"image"
	"reflect"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// florenceSpec is a spec for the generated Florence-2 test export in
// testdata/florence, with decoder the merged decoder file to use.
func florenceSpec(decoder string, options map[string]string) engine.Spec {
	return engine.Spec{
		ID: "onnx/florence-2/test", Task: engine.TaskImageDescription, Dir: "testdata/florence",
		Files: map[string]string{
			"vision_encoder": "vision_encoder.onnx", "embed_tokens": "embed_tokens.onnx",
			"encoder": "encoder_model.onnx", "decoder": decoder,
			"tokenizer": "tokenizer.json", "generation_config": "generation_config.json",
		},
		Options: options,
	}
}

func loadFlorenceTest(t testing.TB, decoder string, options map[string]string) *florence {
	t.Helper()
	d, err := LoadFlorence(onnxtest.Runtime(t), florenceSpec(decoder, options))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d.(*florence)
}

// TestFlorenceSignature checks what the loader read from the generated
// export: 2 layers, 2 heads of 8, BART's decoding ids from the generation
// config.
func TestFlorenceSignature(t *testing.T) {
	f := loadFlorenceTest(t, "decoder_model_merged.onnx", nil)
	if f.layers != 2 || f.heads != 2 || f.headDim != 8 || f.start != 2 || f.eos != 2 || f.forcedBOS != 0 || f.noRepeat != 3 {
		t.Errorf("layers %d heads %d head dim %d start %d eos %d bos %d no-repeat %d", f.layers, f.heads, f.headDim, f.start, f.eos, f.forcedBOS, f.noRepeat)
	}
	ids, err := f.tok.Encode(florencePrompts[engine.DetailCaption][1], 0)
	if err != nil || ids.IDs[0] != 0 || ids.IDs[len(ids.IDs)-1] != 2 {
		t.Errorf("prompt ids %v (%v): want <s> ... </s>", ids.IDs, err)
	}
}

// TestFlorencePlanted decodes with a decoder whose logits spell "A cat."
// then </s> (a one-hot row chosen by the cache length): the caption must be
// exactly that, and generation must stop at </s> (6 tokens: the forced <s>,
// four of text, </s>), for every detail level.
func TestFlorencePlanted(t *testing.T) {
	f := loadFlorenceTest(t, "decoder_planted.onnx", nil)
	img := photo(t, "astronaut.png")
	for _, detail := range []string{"", engine.DetailCaption, engine.DetailDetailed, engine.DetailMore} {
		got, err := f.Describe(context.Background(), engine.DescribeRequest{Image: img, Detail: detail})
		if err != nil {
			t.Fatal(err)
		}
		if got != "A cat." {
			t.Errorf("detail %q: %q, want \"A cat.\"", detail, got)
		}
	}
	ids, eos, err := f.generate(context.Background(), img, "What does the image describe?", 100)
	if err != nil || !eos || len(ids) != 6 || ids[0] != 0 || ids[5] != 2 {
		t.Errorf("generate: ids %v eos %v err %v; want 6 ids from <s> to </s>", ids, eos, err)
	}
}

// TestFlorenceRandom runs the random-weight export: generation stops at
// max_new_tokens (or at </s>), is deterministic, depends on the image, and
// respects no_repeat_ngram_size.
func TestFlorenceRandom(t *testing.T) {
	f := loadFlorenceTest(t, "decoder_model_merged.onnx", map[string]string{"max_new_tokens": "12"})
	ctx := context.Background()
	a := photo(t, "astronaut.png")
	ids1, eos1, err := f.generate(ctx, a, "What does the image describe?", 12)
	if err != nil {
		t.Fatal(err)
	}
	if !eos1 && len(ids1) != 12 || eos1 && ids1[len(ids1)-1] != f.eos {
		t.Errorf("ids %v eos %v: want 12 tokens or an ending </s>", ids1, eos1)
	}
	ids2, _, err := f.generate(ctx, a, "What does the image describe?", 12)
	if err != nil || !reflect.DeepEqual(ids1, ids2) {
		t.Errorf("second run %v (%v) differs from %v", ids2, err, ids1)
	}
	seen := map[[3]int64]bool{}
	for i := 0; i+3 <= len(ids1); i++ {
		k := [3]int64{ids1[i], ids1[i+1], ids1[i+2]}
		if seen[k] {
			t.Errorf("trigram %v repeated in %v", k, ids1)
		}
		seen[k] = true
	}
	other := image.NewRGBA(image.Rect(0, 0, 64, 48))
	for i := range other.Pix {
		other.Pix[i] = uint8(i * 7)
	}
	ids3, _, err := f.generate(ctx, other, "What does the image describe?", 12)
	if err != nil || reflect.DeepEqual(ids1, ids3) {
		t.Errorf("another image gave the same ids %v (%v)", ids3, err)
	}
	t.Logf("astronaut: %v; other: %v", ids1, ids3)
	text, err := f.Describe(ctx, engine.DescribeRequest{Image: a, Detail: engine.DetailMore})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("text %q", text)
}

// TestFlorenceErrors checks caller errors and cancellation.
func TestFlorenceErrors(t *testing.T) {
	f := loadFlorenceTest(t, "decoder_model_merged.onnx", nil)
	var ie *engine.InputError
	if _, err := f.Describe(context.Background(), engine.DescribeRequest{Image: image.NewRGBA(image.Rect(0, 0, 4, 4)), Detail: "poem"}); !errors.As(err, &ie) || ie.Param != "detail" {
		t.Errorf("detail poem: %v", err)
	}
	if _, err := f.Describe(context.Background(), engine.DescribeRequest{}); !errors.As(err, &ie) || ie.Param != "image" {
		t.Errorf("no image: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	time.Sleep(2 * time.Millisecond)
	if _, err := f.Describe(ctx, engine.DescribeRequest{Image: photo(t, "astronaut.png")}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("expired context: %v", err)
	}
}

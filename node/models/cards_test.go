package models

import (
	"context"
	"strings"
	"testing"
)

// TestBuiltinCardForShippedISNet: the ISNet model `make assets` installs
// (no catalogue entry, no card in its manifest) has a registered card.
func TestBuiltinCardForShippedISNet(t *testing.T) {
	c, err := NewCatalog(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	card, ok := c.Card("onnx/isnet/general-use-small")
	if !ok || card.Publisher == "" || card.Source == "" || card.License == "" || card.IntendedUse == "" || card.KnownLimitations == "" {
		t.Fatalf("card: %+v %v", card, ok)
	}
	e, _ := c.Get("onnx/all-minilm-l6-v2/fp32")
	if e.Card == nil {
		t.Fatal("entries keep their own cards")
	}
	if got, ok := c.Card(e.Key); !ok || got != *e.Card {
		t.Errorf("Card of an entry: %+v %v", got, ok)
	}
	if _, ok := c.Card("onnx/nobody/none"); ok {
		t.Error("a card for an unknown id")
	}
	if _, err := parseCards([]byte(`{"cards":{"isnet:small":{"publisher":"p","source":"s","license":"l"}}}`)); err == nil {
		t.Error("a card under a wire id was accepted")
	}
}

// TestBuiltinFilesPinnedWhereDigestFixed: a file whose sha256 the catalogue
// fixes must come from a URL pinned to a commit, not a moving branch.
func TestBuiltinFilesPinnedWhereDigestFixed(t *testing.T) {
	c, err := NewCatalog(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// No public record pairs this file's sha256 with a commit of its
	// repository that could be checked here; it stays on main (a changed
	// file fails its checksum, it is never installed).
	unresolved := map[string]bool{"onnx/smollm2/360m-instruct-q4": true}
	for _, e := range c.Entries() {
		for _, f := range e.Files {
			if f.SHA256 != "" && strings.Contains(f.URL, "/resolve/main/") && !unresolved[e.Key] {
				t.Errorf("%s: %s has a fixed sha256 but follows main: %s", e.Key, f.Name, f.URL)
			}
		}
	}
}

// TestBuiltinCardsForShippedModels: every model `make assets` installs,
// and so every model `make run` serves, has a registered card with all
// its fields (provenance answers 200 for each).
func TestBuiltinCardsForShippedModels(t *testing.T) {
	c, err := NewCatalog(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{
		// make run's models
		"onnx/isnet/general-use-small", "onnx/use/lite-en", "onnx/tiny-bert/test-128", "onnx/tiny-llama/test", "onnx/centernet/mobilenetv3-coco",
		"onnx/blazeface/faceres", "onnx/composed-describer/v1", "onnx/whisper/base", "onnx/silero-vad/v4", "onnx/kokoro/82m-q8",
		// the other assets
		"onnx/esrgan/thick", "onnx/ppocr/v4", "gguf/tiny-gguf/test", "onnx/tiny-sd/test", "onnx/tiny-sd-inpaint/test",
		"onnx/tiny-sd-pix2pix/test", "onnx/tiny-sd-turbo/test",
	} {
		card, ok := c.Card(id)
		if !ok || card.Publisher == "" || card.Source == "" || card.License == "" || card.IntendedUse == "" || card.KnownLimitations == "" {
			t.Errorf("%s: card %+v %v", id, card, ok)
		}
	}
}

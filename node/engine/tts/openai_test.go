package tts

import (
	"slices"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

// kokoroVoiceList is the voice list of Kokoro-82M v1.0 as the engine
// builds it (id, language, gender), the part openai.go reads.
func kokoroVoiceList(ids ...string) []engine.Voice {
	langs := map[byte]string{'a': "en-us", 'b': "en-gb", 'e': "es"}
	out := make([]engine.Voice, 0, len(ids))
	for _, id := range ids {
		out = append(out, engine.Voice{ID: id, Language: langs[id[0]], Gender: map[byte]string{'f': "female", 'm': "male"}[id[1]]})
	}
	return out
}

func TestKokoroOpenAIAliases(t *testing.T) {
	full := kokoroVoiceList("af_alloy", "af_bella", "af_heart", "af_kore", "af_nova", "af_sarah", "am_echo", "am_fenrir",
		"am_michael", "am_onyx", "am_puck", "bm_fable", "bm_george", "ef_dora")
	got := kokoroAliases(full, "af_heart")
	want := map[string]string{"alloy": "af_alloy", "ash": "am_michael", "ballad": "bm_george", "cedar": "am_fenrir",
		"coral": "af_heart", "echo": "am_echo", "fable": "bm_fable", "marin": "af_kore", "nova": "af_nova",
		"onyx": "am_onyx", "sage": "af_sarah", "shimmer": "af_bella", "verse": "am_puck"}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s -> %q, want %q", name, got[name], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d aliases, want %d", len(got), len(want))
	}
	// The voice list says which OpenAI names select each voice.
	for _, v := range full {
		switch v.ID {
		case "af_alloy":
			if !slices.Equal(v.OpenAI, []string{"alloy"}) {
				t.Errorf("af_alloy lists %v", v.OpenAI)
			}
		case "ef_dora":
			if len(v.OpenAI) != 0 {
				t.Errorf("ef_dora lists %v", v.OpenAI)
			}
		}
	}

	// Voices missing: the same gender in the default's language, else
	// the same gender anywhere, else the default.
	few := kokoroVoiceList("af_heart", "bm_lewis", "ef_dora")
	got = kokoroAliases(few, "af_heart")
	for name, v := range map[string]string{"alloy": "af_heart", "onyx": "bm_lewis", "nova": "af_heart", "fable": "bm_lewis"} {
		if got[name] != v {
			t.Errorf("few voices: %s -> %q, want %q", name, got[name], v)
		}
	}
	if !slices.Contains(few[0].OpenAI, "alloy") || !slices.Contains(few[1].OpenAI, "onyx") {
		t.Errorf("few voices list %v and %v", few[0].OpenAI, few[1].OpenAI)
	}
	only := kokoroVoiceList("ef_dora")
	if got := kokoroAliases(only, "ef_dora"); got["onyx"] != "ef_dora" {
		t.Errorf("a single female voice: onyx -> %q", got["onyx"])
	}
}

func TestPiperOpenAIAliases(t *testing.T) {
	vs := []engine.Voice{{ID: "alice"}, {ID: "bob"}, {ID: "nova"}}
	got := piperAliases(vs)
	if got["alloy"] != "alice" || got["onyx"] != "alice" {
		t.Fatalf("aliases %v", got)
	}
	// A speaker that has an OpenAI voice's name keeps it.
	if _, ok := got["nova"]; ok {
		t.Fatal("the speaker named nova was shadowed by the alias")
	}
	if len(vs[0].OpenAI) != 12 || len(vs[1].OpenAI) != 0 {
		t.Fatalf("listed %v / %v", vs[0].OpenAI, vs[1].OpenAI)
	}
}

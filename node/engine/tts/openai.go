package tts

import (
	"sort"

	"github.com/infermesh/infermesh/node/engine"
)

// OpenAI's speech voices, so that an OpenAI client's voice: "alloy" is
// spoken by a local engine. Each local engine maps every name to one of
// its own voices; the voice list (GET /v1/audio/voices) shows under each
// voice the OpenAI names that select it.
//
// Kokoro ships five voices trained to OpenAI's of the same name (alloy,
// echo, fable, nova, onyx); the others go to a Kokoro voice of the same
// gender and accent:
//
//	alloy   af_alloy     ash     am_michael   ballad  bm_george
//	cedar   am_fenrir    coral   af_heart     echo    am_echo
//	fable   bm_fable     marin   af_kore      nova    af_nova
//	onyx    am_onyx      sage    af_sarah     shimmer af_bella
//	verse   am_puck
//
// When that voice is not installed, the first installed voice of the
// same gender stands in, else the default voice. A Piper model speaks
// with one voice per speaker: every OpenAI name selects its first
// (default) speaker.

// openAIVoice is one OpenAI voice: its name, the gender it sounds, and the
// Kokoro voice closest to it.
type openAIVoice struct {
	name, gender, kokoro string
}

// openAIVoices lists OpenAI's voices.
func openAIVoices() []openAIVoice {
	return []openAIVoice{
		{"alloy", "female", "af_alloy"}, {"ash", "male", "am_michael"}, {"ballad", "male", "bm_george"},
		{"cedar", "male", "am_fenrir"}, {"coral", "female", "af_heart"}, {"echo", "male", "am_echo"},
		{"fable", "male", "bm_fable"}, {"marin", "female", "af_kore"}, {"nova", "female", "af_nova"},
		{"onyx", "male", "am_onyx"}, {"sage", "female", "af_sarah"}, {"shimmer", "female", "af_bella"},
		{"verse", "male", "am_puck"},
	}
}

// kokoroAliases maps every OpenAI voice to one of voices (the engine's,
// defaultVoice among them) and records the names on the voices they
// select.
func kokoroAliases(voices []engine.Voice, defaultVoice string) map[string]string {
	return mapAliases(voices, func(v openAIVoice) string {
		have := func(id string) bool {
			for _, x := range voices {
				if x.ID == id {
					return true
				}
			}
			return false
		}
		if have(v.kokoro) {
			return v.kokoro
		}
		// The same gender in the default voice's language, else any.
		var lang string
		for _, x := range voices {
			if x.ID == defaultVoice {
				lang = x.Language
			}
		}
		for _, sameLang := range []bool{true, false} {
			for _, x := range voices {
				if x.Gender == v.gender && (!sameLang || x.Language == lang) {
					return x.ID
				}
			}
		}
		return defaultVoice
	})
}

// piperAliases maps every OpenAI voice to the first speaker.
func piperAliases(voices []engine.Voice) map[string]string {
	return mapAliases(voices, func(openAIVoice) string { return voices[0].ID })
}

// mapAliases maps each OpenAI voice with pick and writes the names into
// the OpenAI field of the voices picked. A name that is already one of
// the engine's voices keeps meaning that voice.
func mapAliases(voices []engine.Voice, pick func(openAIVoice) string) map[string]string {
	out := map[string]string{}
	for _, v := range openAIVoices() {
		taken := false
		for _, x := range voices {
			taken = taken || x.ID == v.name
		}
		if taken {
			continue
		}
		id := pick(v)
		out[v.name] = id
		for i := range voices {
			if voices[i].ID == id {
				voices[i].OpenAI = append(voices[i].OpenAI, v.name)
			}
		}
	}
	for i := range voices {
		sort.Strings(voices[i].OpenAI)
	}
	return out
}

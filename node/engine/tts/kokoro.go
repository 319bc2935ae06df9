package tts

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// Kokoro-82M constants.
const (
	// KokoroSampleRate is the rate of Kokoro's waveform output, in Hz.
	KokoroSampleRate = 24000
	// kokoroMaxPhonemes is the most phonemes one run takes (the model's
	// 512 positions less the two pads).
	kokoroMaxPhonemes = 510
	// kokoroStyleDim is the width of a style vector; a voice file holds
	// kokoroStyleRows of them, row n for an input of n phonemes.
	kokoroStyleDim  = 256
	kokoroStyleRows = 510
)

// kokoroLang is what a voice-name prefix (or a request's Language) selects.
type kokoroLang struct {
	code    string // the Voice.Language reported, e.g. "en-us"
	espeak  string // espeak-ng voice
	english bool   // apply the English-only phoneme mappings
}

// kokoroLangs maps Kokoro's one-letter language prefixes to espeak-ng
// voices. Japanese (j) and Mandarin (z) voices need a G2P other than
// espeak-ng (misaki) and are not offered.
var kokoroLangs = map[byte]kokoroLang{
	'a': {"en-us", "en-us", true},
	'b': {"en-gb", "en-gb", true},
	'e': {"es", "es", false},
	'f': {"fr-fr", "fr-fr", false},
	'h': {"hi", "hi", false},
	'i': {"it", "it", false},
	'p': {"pt-br", "pt-br", false},
}

// languageAliases maps accepted SpeechRequest.Language values to a prefix.
var languageAliases = map[string]byte{
	"en": 'a', "en-us": 'a', "en-gb": 'b', "es": 'e', "es-es": 'e', "fr": 'f', "fr-fr": 'f',
	"hi": 'h', "hi-in": 'h', "it": 'i', "it-it": 'i', "pt": 'p', "pt-br": 'p',
}

// Kokoro is the Kokoro-82M text-to-speech pipeline: espeak-ng G2P, the
// model's IPA vocabulary, one ONNX run per sentence (input_ids i64[1,T]
// padded with 0 at both ends, style f32[1,256] taken from the voice's table
// at the phoneme count, speed f32[1]) giving waveform f32[1,S] at 24 kHz.
type Kokoro struct {
	id           string
	m            *model
	vocab        map[rune]int64
	voices       []engine.Voice
	styles       map[string][]float32 // voice id -> [510*256]
	defaultVoice string
	// aliases maps OpenAI's voice names to voices (openai.go).
	aliases map[string]string
}

// LoadKokoro loads Kokoro-82M from spec.Dir. spec.Files names "model" (the
// ONNX file), "voices" (a folder of <voice>.bin style tables, 510x256
// float32 little-endian each; voices of languages without an espeak-ng G2P
// are skipped) and "tokenizer" (tokenizer.json with the phoneme
// vocabulary). spec.Options: "default_voice" (default af_heart when
// present, else the first voice) and "concurrency" (simultaneous model
// runs, default 1).
func LoadKokoro(rt *onnx.Runtime, spec engine.Spec) (engine.Speaker, error) {
	return loadKokoro(rt, spec)
}

func loadKokoro(rt *onnx.Runtime, spec engine.Spec) (*Kokoro, error) {
	wrap := func(err error) error { return fmt.Errorf("tts: %s: %w", spec.ID, err) }
	if rt == nil {
		return nil, wrap(fmt.Errorf("no runtime"))
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, wrap(err)
	}
	if spec.Task != "" && spec.Task != engine.TaskTextToSpeech && spec.Task != engine.TaskVoiceCloning {
		return nil, wrap(fmt.Errorf("task %q is not %q", spec.Task, engine.TaskTextToSpeech))
	}
	for _, role := range []string{"model", "tokenizer"} {
		if spec.Files[role] == "" {
			return nil, wrap(fmt.Errorf("spec names no %q file", role))
		}
	}
	voiceFiles, err := kokoroVoiceFiles(spec)
	if err != nil {
		return nil, wrap(err)
	}
	n, err := onnx.IntOption(spec.Options, "concurrency", 1, 1, maxRuns)
	if err != nil {
		return nil, wrap(err)
	}
	vocab, err := loadKokoroVocab(filepath.Join(spec.Dir, spec.Files["tokenizer"]))
	if err != nil {
		return nil, wrap(err)
	}
	k := &Kokoro{id: spec.ID, vocab: vocab, styles: map[string][]float32{}}
	if err := k.loadVoices(voiceFiles); err != nil {
		return nil, wrap(err)
	}
	k.defaultVoice = k.voices[0].ID
	if _, ok := k.styles["af_heart"]; ok {
		k.defaultVoice = "af_heart"
	}
	if v := spec.Options["default_voice"]; v != "" {
		if _, ok := k.styles[v]; !ok {
			return nil, wrap(fmt.Errorf("option default_voice=%q: no such voice", v))
		}
		k.defaultVoice = v
	}
	k.aliases = kokoroAliases(k.voices, k.defaultVoice)
	// The default voice is listed first.
	sort.SliceStable(k.voices, func(i, j int) bool { return k.voices[i].ID == k.defaultVoice && k.voices[j].ID != k.defaultVoice })
	path := filepath.Join(spec.Dir, spec.Files["model"])
	ins, outs, err := modelIO(path)
	if err != nil {
		return nil, wrap(err)
	}
	if err := requireIO("input", ins, map[string]ort.TensorElementDataType{
		"input_ids": ort.TensorElementDataTypeInt64, "style": ort.TensorElementDataTypeFloat, "speed": ort.TensorElementDataTypeFloat,
	}); err != nil {
		return nil, wrap(err)
	}
	if err := requireIO("output", outs, map[string]ort.TensorElementDataType{"waveform": ort.TensorElementDataTypeFloat}); err != nil {
		return nil, wrap(err)
	}
	if k.m, err = openModel(rt, spec.ID, path, []string{"input_ids", "style", "speed"}, []string{"waveform"}, n); err != nil {
		return nil, wrap(err)
	}
	return k, nil
}

// loadKokoroVocab reads model.vocab of a tokenizer.json: one IPA symbol
// (a single rune) per id.
func loadKokoroVocab(path string) (map[rune]int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var tj struct {
		Model struct {
			Vocab map[string]int64 `json:"vocab"`
		} `json:"model"`
	}
	if err := json.Unmarshal(data, &tj); err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", path, err)
	}
	vocab := map[rune]int64{}
	for s, id := range tj.Model.Vocab {
		rs := []rune(s)
		if len(rs) != 1 {
			return nil, fmt.Errorf("tokenizer %s: vocabulary entry %q is not one symbol", path, s)
		}
		vocab[rs[0]] = id
	}
	if len(vocab) < 50 {
		return nil, fmt.Errorf("tokenizer %s: vocabulary has %d symbols, want Kokoro's phoneme set", path, len(vocab))
	}
	return vocab, nil
}

// kokoroVoiceFiles lists a spec's voice style tables, voice id to path:
// the "voice.<id>" roles of an installed model (the store keeps plain
// files only), or every <id>.bin of the folder named by the "voices" role.
func kokoroVoiceFiles(spec engine.Spec) (map[string]string, error) {
	out := map[string]string{}
	for role, f := range spec.Files {
		if id, ok := strings.CutPrefix(role, "voice."); ok {
			out[id] = filepath.Join(spec.Dir, f)
		}
	}
	if dir := spec.Files["voices"]; dir != "" {
		entries, err := os.ReadDir(filepath.Join(spec.Dir, dir))
		if err != nil {
			return nil, fmt.Errorf("voices: %w", err)
		}
		for _, e := range entries {
			if id, ok := strings.CutSuffix(e.Name(), ".bin"); ok {
				out[id] = filepath.Join(spec.Dir, dir, e.Name())
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf(`spec names no voices ("voice.<id>" files or a "voices" folder)`)
	}
	return out, nil
}

// loadVoices reads the style table of every voice whose language has a
// G2P, in voice id order.
func (k *Kokoro) loadVoices(files map[string]string) error {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	want := kokoroStyleRows * kokoroStyleDim * 4
	for _, name := range names {
		if len(name) < 3 || name[2] != '_' {
			continue
		}
		lang, ok := kokoroLangs[name[0]]
		if !ok {
			continue
		}
		data, err := os.ReadFile(files[name])
		if err != nil {
			return fmt.Errorf("voice %s: %w", name, err)
		}
		if len(data) != want {
			return fmt.Errorf("voice %s: %d bytes, want %d (510x256 float32)", name, len(data), want)
		}
		style := make([]float32, kokoroStyleRows*kokoroStyleDim)
		for i := range style {
			style[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		gender := map[byte]string{'f': "female", 'm': "male"}[name[1]]
		k.voices = append(k.voices, engine.Voice{ID: name, Language: lang.code, Gender: gender})
		k.styles[name] = style
	}
	if len(k.voices) == 0 {
		return fmt.Errorf("voices: none of the %d voice files is usable", len(files))
	}
	sort.Slice(k.voices, func(i, j int) bool { return k.voices[i].ID < k.voices[j].ID })
	return nil
}

// ID returns the canonical model id.
func (k *Kokoro) ID() string { return k.id }

// Voices lists the voices, the default first.
func (k *Kokoro) Voices() []engine.Voice { return append([]engine.Voice(nil), k.voices...) }

// SampleRate is 24000.
func (k *Kokoro) SampleRate() int { return KokoroSampleRate }

// Close waits for runs in flight and releases the session.
func (k *Kokoro) Close() error { return k.m.close() }

// resolve checks req and returns the voice's style table, language and speed.
func (k *Kokoro) resolve(req engine.SpeechRequest) ([]float32, kokoroLang, float32, error) {
	speed, err := checkText(req.Text, req.Speed)
	if err != nil {
		return nil, kokoroLang{}, 0, err
	}
	voice := req.Voice
	if voice == "" {
		voice = k.defaultVoice
	}
	if v, ok := k.aliases[voice]; ok {
		voice = v
	}
	style, ok := k.styles[voice]
	if !ok {
		return nil, kokoroLang{}, 0, &engine.InputError{Param: "voice", Msg: fmt.Sprintf("unknown voice %q", req.Voice)}
	}
	lang := kokoroLangs[voice[0]]
	if req.Language != "" {
		p, ok := languageAliases[strings.ToLower(strings.ReplaceAll(req.Language, "_", "-"))]
		if !ok {
			return nil, kokoroLang{}, 0, &engine.InputError{Param: "language", Msg: fmt.Sprintf("unsupported language %q", req.Language)}
		}
		lang = kokoroLangs[p]
	}
	return style, lang, speed, nil
}

// Synthesize speaks req.Text sentence by sentence; see engine.Speaker.
func (k *Kokoro) Synthesize(ctx context.Context, req engine.SpeechRequest, emit func(pcm []float32) error) error {
	style, lang, speed, err := k.resolve(req)
	if err != nil {
		return err
	}
	return k.synthesize(ctx, req.Text, style, lang, speed, emit)
}

func (k *Kokoro) synthesize(ctx context.Context, text string, style []float32, lang kokoroLang, speed float32, emit func([]float32) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := prepareAhead(ctx, splitSentences(text), func(ctx context.Context, ss []string) ([]unit, error) {
		return k.chunkUnits(ctx, ss, lang)
	})
	return speak(ctx, ch, KokoroSampleRate, speed, func(ctx context.Context, u unit) ([]float32, error) {
		return k.run(ctx, u.ids, style, speed)
	}, emit)
}

// phonemize returns the sentences as Kokoro phonemes, one espeak-ng
// call for all; "" for a sentence without words.
func (k *Kokoro) phonemize(ctx context.Context, sentences []string, lang kokoroLang) ([]string, error) {
	pieces := make([][]piece, len(sentences))
	for i, s := range sentences {
		pieces[i] = splitPieces(prenormalize(s, lang.english))
	}
	ipas, err := phonemizeSentences(ctx, lang.espeak, pieces)
	if err != nil {
		return nil, err
	}
	for i, ipa := range ipas {
		if ipa != "" {
			ipas[i] = k.normalize(ipa, lang.english)
		}
	}
	return ipas, nil
}

// chunkUnits phonemizes a chunk of sentences and cuts each into runs of
// at most kokoroMaxPhonemes; a sentence without words has none.
func (k *Kokoro) chunkUnits(ctx context.Context, sentences []string, lang kokoroLang) ([]unit, error) {
	phs, err := k.phonemize(ctx, sentences, lang)
	if err != nil {
		return nil, err
	}
	var us []unit
	for _, ph := range phs {
		parts := splitRunes([]rune(ph), kokoroMaxPhonemes)
		for i, p := range parts {
			ids := make([]int64, len(p))
			for j, r := range p {
				ids[j] = k.vocab[r]
			}
			us = append(us, unit{ids: ids, sentenceEnd: i == len(parts)-1})
		}
	}
	return us, nil
}

// Phonemes returns the Kokoro phoneme string for text in the given voice's
// language, as it is fed to the model (sentences joined by spaces). It is
// meant for inspection and benchmarks.
func (k *Kokoro) Phonemes(ctx context.Context, text, voice string) (string, error) {
	_, lang, _, err := k.resolve(engine.SpeechRequest{Text: text, Voice: voice})
	if err != nil {
		return "", err
	}
	phs, err := k.phonemize(ctx, splitSentences(text), lang)
	if err != nil {
		return "", err
	}
	var out []string
	for _, ph := range phs {
		if ph != "" {
			out = append(out, ph)
		}
	}
	return strings.Join(out, " "), nil
}

// RunInputs returns what Synthesize feeds the model for text in voice, run
// by run: the input_ids (with the two pads) and the style vector. It is
// meant for benchmarks that drive an ONNX Runtime session directly on the
// same inputs as the pipeline.
func (k *Kokoro) RunInputs(ctx context.Context, text, voice string) (ids [][]int64, styles [][]float32, err error) {
	style, lang, _, err := k.resolve(engine.SpeechRequest{Text: text, Voice: voice})
	if err != nil {
		return nil, nil, err
	}
	for _, chunk := range chunkSentences(splitSentences(text)) {
		us, err := k.chunkUnits(ctx, chunk, lang)
		if err != nil {
			return nil, nil, err
		}
		for _, u := range us {
			if len(u.ids) == 0 {
				continue
			}
			row := min(len(u.ids), kokoroStyleRows-1)
			ids = append(ids, append(append([]int64{0}, u.ids...), 0))
			styles = append(styles, append([]float32(nil), style[row*kokoroStyleDim:(row+1)*kokoroStyleDim]...))
		}
	}
	return ids, styles, nil
}

// run makes one model call on ids (without pads).
func (k *Kokoro) run(ctx context.Context, ids []int64, voice []float32, speed float32) ([]float32, error) {
	n := len(ids)
	if n == 0 {
		return nil, nil
	}
	padded := make([]int64, n+2)
	copy(padded[1:], ids)
	row := min(n, kokoroStyleRows-1)
	style := append([]float32(nil), voice[row*kokoroStyleDim:(row+1)*kokoroStyleDim]...)
	var in tensors
	defer func() { in.destroyAll() }() // a closure: destroy (and keep alive) the tensors appended below
	if err := in.i64(ort.NewShape(1, int64(n+2)), padded); err != nil {
		return nil, err
	}
	if err := in.f32(ort.NewShape(1, kokoroStyleDim), style); err != nil {
		return nil, err
	}
	if err := in.f32(ort.NewShape(1), []float32{speed}); err != nil {
		return nil, err
	}
	out, _, err := k.m.run(ctx, in)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

package tts

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// Piper phoneme-id conventions (piper-phonemize).
const (
	piperPad = "_"
	piperBOS = "^"
	piperEOS = "$"
	// piperMaxPhonemes bounds one run; VITS has no hard context limit, this
	// keeps activation memory and latency per chunk bounded.
	piperMaxPhonemes = 400
)

// piperConfig is the part of a Piper voice's .onnx.json the pipeline uses.
type piperConfig struct {
	Audio struct {
		SampleRate int `json:"sample_rate"`
	} `json:"audio"`
	Espeak struct {
		Voice string `json:"voice"`
	} `json:"espeak"`
	Language struct {
		Code string `json:"code"`
	} `json:"language"`
	Inference struct {
		NoiseScale  float32 `json:"noise_scale"`
		LengthScale float32 `json:"length_scale"`
		NoiseW      float32 `json:"noise_w"`
	} `json:"inference"`
	PhonemeType  string             `json:"phoneme_type"`
	PhonemeIDMap map[string][]int64 `json:"phoneme_id_map"`
	NumSpeakers  int                `json:"num_speakers"`
	SpeakerIDMap map[string]int64   `json:"speaker_id_map"`
	Dataset      string             `json:"dataset"`
}

// Piper is a Piper (VITS) voice: espeak-ng G2P with the voice's espeak
// voice, ids from the .onnx.json phoneme_id_map ("^", then each phoneme
// followed by "_", then "$"), one run per sentence with inputs input
// i64[1,T], input_lengths i64[1], scales f32[3] (noise_scale,
// length_scale / speed, noise_w) and, for multi-speaker voices, sid i64[1];
// output f32[1,1,S] at audio.sample_rate.
type Piper struct {
	id      string
	m       *model
	cfg     piperConfig
	lang    string
	voices  []engine.Voice
	speaker map[string]int64
	multi   bool
	// aliases maps OpenAI's voice names to voices (openai.go).
	aliases map[string]string
}

// LoadPiper loads a Piper voice: spec.Files "model" (the .onnx) and
// "config" (its .onnx.json; default: the model's name + ".json").
// spec.Options "concurrency" sets simultaneous runs (default 1). Voices are
// the speaker_id_map names of a multi-speaker model (in id order), or one
// voice named after the json's dataset ("default" if none).
func LoadPiper(rt *onnx.Runtime, spec engine.Spec) (engine.Speaker, error) {
	return loadPiper(rt, spec)
}

func loadPiper(rt *onnx.Runtime, spec engine.Spec) (*Piper, error) {
	wrap := func(err error) error { return fmt.Errorf("tts: %s: %w", spec.ID, err) }
	if rt == nil {
		return nil, wrap(fmt.Errorf("no runtime"))
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, wrap(err)
	}
	if spec.Task != "" && spec.Task != engine.TaskTextToSpeech {
		return nil, wrap(fmt.Errorf("task %q is not %q", spec.Task, engine.TaskTextToSpeech))
	}
	if spec.Files["model"] == "" {
		return nil, wrap(fmt.Errorf("spec names no \"model\" file"))
	}
	n, err := onnx.IntOption(spec.Options, "concurrency", 1, 1, maxRuns)
	if err != nil {
		return nil, wrap(err)
	}
	path := filepath.Join(spec.Dir, spec.Files["model"])
	cfgPath := path + ".json"
	if c := spec.Files["config"]; c != "" {
		cfgPath = filepath.Join(spec.Dir, c)
	}
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		return nil, wrap(fmt.Errorf("config: %w", err))
	}
	p := &Piper{id: spec.ID, speaker: map[string]int64{}}
	if err := json.Unmarshal(data, &p.cfg); err != nil {
		return nil, wrap(fmt.Errorf("config %s: %w", cfgPath, err))
	}
	c := &p.cfg
	switch {
	case c.Audio.SampleRate < 8000 || c.Audio.SampleRate > 96000:
		return nil, wrap(fmt.Errorf("config: audio.sample_rate %d", c.Audio.SampleRate))
	case c.PhonemeType != "" && c.PhonemeType != "espeak":
		return nil, wrap(fmt.Errorf("config: phoneme_type %q is not supported (only espeak)", c.PhonemeType))
	case c.Espeak.Voice == "":
		return nil, wrap(fmt.Errorf("config: no espeak.voice"))
	}
	for _, s := range []string{piperPad, piperBOS, piperEOS} {
		if len(c.PhonemeIDMap[s]) == 0 {
			return nil, wrap(fmt.Errorf("config: phoneme_id_map has no %q", s))
		}
	}
	if c.Inference.LengthScale == 0 {
		c.Inference.LengthScale = 1
	}
	p.lang = strings.ToLower(strings.ReplaceAll(c.Language.Code, "_", "-"))
	if p.lang == "" {
		p.lang = c.Espeak.Voice
	}
	p.multi = c.NumSpeakers > 1
	if p.multi {
		names := make([]string, 0, len(c.SpeakerIDMap))
		for name, id := range c.SpeakerIDMap {
			names = append(names, name)
			p.speaker[name] = id
		}
		sort.Slice(names, func(i, j int) bool { return c.SpeakerIDMap[names[i]] < c.SpeakerIDMap[names[j]] })
		for _, name := range names {
			p.voices = append(p.voices, engine.Voice{ID: name, Language: p.lang})
		}
		if len(p.voices) == 0 {
			return nil, wrap(fmt.Errorf("config: %d speakers but no speaker_id_map", c.NumSpeakers))
		}
	} else {
		name := c.Dataset
		if name == "" {
			name = "default"
		}
		p.voices = []engine.Voice{{ID: name, Language: p.lang}}
		p.speaker[name] = 0
	}
	p.aliases = piperAliases(p.voices)
	ins, outs, err := modelIO(path)
	if err != nil {
		return nil, wrap(err)
	}
	want := map[string]ort.TensorElementDataType{
		"input": ort.TensorElementDataTypeInt64, "input_lengths": ort.TensorElementDataTypeInt64, "scales": ort.TensorElementDataTypeFloat,
	}
	inNames := []string{"input", "input_lengths", "scales"}
	if p.multi {
		want["sid"] = ort.TensorElementDataTypeInt64
		inNames = append(inNames, "sid")
	}
	if err := requireIO("input", ins, want); err != nil {
		return nil, wrap(err)
	}
	if len(ins) != len(inNames) {
		return nil, wrap(fmt.Errorf("model has inputs %v, want %v (num_speakers %d)", ins, inNames, c.NumSpeakers))
	}
	if err := requireIO("output", outs, map[string]ort.TensorElementDataType{"output": ort.TensorElementDataTypeFloat}); err != nil {
		return nil, wrap(err)
	}
	if p.m, err = openModel(rt, spec.ID, path, inNames, []string{"output"}, n); err != nil {
		return nil, wrap(err)
	}
	return p, nil
}

// ID returns the canonical model id.
func (p *Piper) ID() string { return p.id }

// Voices lists the speakers (one for single-speaker voices).
func (p *Piper) Voices() []engine.Voice { return append([]engine.Voice(nil), p.voices...) }

// SampleRate is the .onnx.json's audio.sample_rate.
func (p *Piper) SampleRate() int { return p.cfg.Audio.SampleRate }

// Close waits for runs in flight and releases the session.
func (p *Piper) Close() error { return p.m.close() }

// Synthesize speaks req.Text sentence by sentence; see engine.Speaker.
// Language must be "" or the voice's language: a Piper voice speaks one.
func (p *Piper) Synthesize(ctx context.Context, req engine.SpeechRequest, emit func(pcm []float32) error) error {
	speed, err := checkText(req.Text, req.Speed)
	if err != nil {
		return err
	}
	voice := req.Voice
	if voice == "" {
		voice = p.voices[0].ID
	}
	if v, ok := p.aliases[voice]; ok {
		voice = v
	}
	sid, ok := p.speaker[voice]
	if !ok {
		return &engine.InputError{Param: "voice", Msg: fmt.Sprintf("unknown voice %q", req.Voice)}
	}
	if l := strings.ToLower(strings.ReplaceAll(req.Language, "_", "-")); l != "" && l != p.lang && !strings.HasPrefix(p.lang, l+"-") {
		return &engine.InputError{Param: "language", Msg: fmt.Sprintf("this voice speaks %s, not %q", p.lang, req.Language)}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	scales := []float32{p.cfg.Inference.NoiseScale, p.cfg.Inference.LengthScale / speed, p.cfg.Inference.NoiseW}
	ch := prepareAhead(ctx, splitSentences(req.Text), p.chunkUnits)
	return speak(ctx, ch, p.cfg.Audio.SampleRate, speed, func(ctx context.Context, u unit) ([]float32, error) {
		return p.run(ctx, u.ids, scales, sid)
	}, emit)
}

// chunkUnits phonemizes a chunk of sentences (one espeak-ng call) and
// maps each to ids with the BOS, PAD and EOS conventions; a sentence
// without words has none.
func (p *Piper) chunkUnits(ctx context.Context, sentences []string) ([]unit, error) {
	pieces := make([][]piece, len(sentences))
	for i, s := range sentences {
		pieces[i] = splitPieces(s)
	}
	ipas, err := phonemizeSentences(ctx, p.cfg.Espeak.Voice, pieces)
	if err != nil {
		return nil, err
	}
	var us []unit
	for _, ipa := range ipas {
		if ipa != "" {
			us = append(us, p.sentenceUnits(ipa)...)
		}
	}
	return us, nil
}

// sentenceUnits maps one sentence's IPA to ids with the BOS, PAD and EOS
// conventions, in runs of at most piperMaxPhonemes.
func (p *Piper) sentenceUnits(ipa string) []unit {
	ipa = strings.ReplaceAll(ipa, zwj, "")
	parts := splitRunes([]rune(collapseSpaces(ipa)), piperMaxPhonemes)
	m := p.cfg.PhonemeIDMap
	us := make([]unit, 0, len(parts))
	for i, part := range parts {
		ids := append([]int64(nil), m[piperBOS]...)
		ids = append(ids, m[piperPad]...)
		for _, r := range part {
			id, ok := m[string(r)]
			if !ok {
				continue // a phoneme the voice was not trained on
			}
			ids = append(ids, id...)
			ids = append(ids, m[piperPad]...)
		}
		ids = append(ids, m[piperEOS]...)
		us = append(us, unit{ids: ids, sentenceEnd: i == len(parts)-1})
	}
	return us
}

// run makes one model call.
func (p *Piper) run(ctx context.Context, ids []int64, scales []float32, sid int64) ([]float32, error) {
	var in tensors
	defer func() { in.destroyAll() }() // a closure: destroy (and keep alive) the tensors appended below
	if err := in.i64(ort.NewShape(1, int64(len(ids))), ids); err != nil {
		return nil, err
	}
	if err := in.i64(ort.NewShape(1), []int64{int64(len(ids))}); err != nil {
		return nil, err
	}
	if err := in.f32(ort.NewShape(3), append([]float32(nil), scales...)); err != nil {
		return nil, err
	}
	if p.multi {
		if err := in.i64(ort.NewShape(1), []int64{sid}); err != nil {
			return nil, err
		}
	}
	out, _, err := p.m.run(ctx, in)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

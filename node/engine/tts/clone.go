package tts

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// OpenVoice is the voice-cloning pipeline: Kokoro speaks the text in a
// base voice, then OpenVoice v2's tone-colour converter gives it the
// timbre of the reference clip (see DESIGN.md for the choice).
//
// Per request: the 16 kHz reference is resampled to the converter's rate
// and its linear magnitude spectrogram goes through the extractor
// (input f32[1,F,bins] -> tone colour, 256 values) once. Per Kokoro chunk:
// the 24 kHz audio is resampled, its spectrogram gives the source tone
// colour (extractor) and the converter (audio f32[1,bins,F], audio_length
// i64[1], src_tone f32[1,256,1], dest_tone f32[1,256,1], tau f32[1] ->
// output f32[1,1,S]) renders it in the reference's tone colour. The
// reference audio and its tone colour live only for the request.
type OpenVoice struct {
	id        string
	base      *Kokoro
	baseVoice string
	extractor *model
	converter *model
	spec      *stft
	rate      int
	gin       int
	tau       float32
}

// openVoiceConfig is the part of the converter's configuration.json used.
type openVoiceConfig struct {
	Data struct {
		SamplingRate int `json:"sampling_rate"`
		FilterLength int `json:"filter_length"`
		HopLength    int `json:"hop_length"`
		WinLength    int `json:"win_length"`
	} `json:"data"`
	Model struct {
		GinChannels int `json:"gin_channels"`
	} `json:"model"`
}

// LoadCloner loads the cloning pipeline from spec.Dir. spec.Files names
// the Kokoro base ("model", "voices", "tokenizer", as LoadKokoro) and the
// OpenVoice v2 tone-colour converter export: "extractor"
// (tone_color_extract_model.onnx), "converter" (tone_clone_model.onnx)
// and "converter_config" (its configuration.json); a file name may be
// absolute, so the converter can live outside the Kokoro folder.
// spec.Options:
// "base_voice" (Kokoro voice spoken before conversion, default af_heart),
// "tau" (converter temperature, default 0.3) and "concurrency".
func LoadCloner(rt *onnx.Runtime, spec engine.Spec) (engine.Cloner, error) {
	return loadCloner(rt, spec)
}

func loadCloner(rt *onnx.Runtime, spec engine.Spec) (*OpenVoice, error) {
	wrap := func(err error) error { return fmt.Errorf("tts: %s: %w", spec.ID, err) }
	if rt == nil {
		return nil, wrap(fmt.Errorf("no runtime"))
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, wrap(err)
	}
	if spec.Task != "" && spec.Task != engine.TaskVoiceCloning {
		return nil, wrap(fmt.Errorf("task %q is not %q", spec.Task, engine.TaskVoiceCloning))
	}
	for _, role := range []string{"extractor", "converter", "converter_config"} {
		if spec.Files[role] == "" {
			return nil, wrap(fmt.Errorf("spec names no %q file", role))
		}
	}
	n, err := onnx.IntOption(spec.Options, "concurrency", 1, 1, maxRuns)
	if err != nil {
		return nil, wrap(err)
	}
	data, err := os.ReadFile(specPath(spec, "converter_config"))
	if err != nil {
		return nil, wrap(err)
	}
	var cfg openVoiceConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, wrap(fmt.Errorf("converter_config: %w", err))
	}
	d := cfg.Data
	if d.SamplingRate < 8000 || d.SamplingRate > 48000 {
		return nil, wrap(fmt.Errorf("converter_config: sampling_rate %d", d.SamplingRate))
	}
	o := &OpenVoice{id: spec.ID, rate: d.SamplingRate, gin: cfg.Model.GinChannels, tau: 0.3}
	if o.gin == 0 {
		o.gin = 256
	}
	if o.spec, err = newSTFT(d.FilterLength, d.HopLength, d.WinLength); err != nil {
		return nil, wrap(err)
	}
	if s := spec.Options["tau"]; s != "" {
		v, err := strconv.ParseFloat(s, 32)
		if err != nil || v < 0 || v > 1 {
			return nil, wrap(fmt.Errorf("option tau=%q: want a number in [0, 1]", s))
		}
		o.tau = float32(v)
	}
	exPath, cvPath := specPath(spec, "extractor"), specPath(spec, "converter")
	ins, outs, err := modelIO(exPath)
	if err != nil {
		return nil, wrap(err)
	}
	if err := requireIO("input", ins, map[string]ort.TensorElementDataType{"input": ort.TensorElementDataTypeFloat}); err != nil {
		return nil, wrap(fmt.Errorf("extractor: %w", err))
	}
	if len(outs) == 0 {
		return nil, wrap(fmt.Errorf("extractor has no output"))
	}
	exOut := outs[0].Name
	ins, outs, err = modelIO(cvPath)
	if err != nil {
		return nil, wrap(err)
	}
	cvIn := []string{"audio", "audio_length", "src_tone", "dest_tone", "tau"}
	if err := requireIO("input", ins, map[string]ort.TensorElementDataType{
		"audio": ort.TensorElementDataTypeFloat, "audio_length": ort.TensorElementDataTypeInt64,
		"src_tone": ort.TensorElementDataTypeFloat, "dest_tone": ort.TensorElementDataTypeFloat, "tau": ort.TensorElementDataTypeFloat,
	}); err != nil {
		return nil, wrap(fmt.Errorf("converter: %w", err))
	}
	if len(outs) == 0 {
		return nil, wrap(fmt.Errorf("converter has no output"))
	}
	baseSpec := spec
	baseSpec.Options = map[string]string{"concurrency": strconv.Itoa(n)}
	if o.base, err = loadKokoro(rt, baseSpec); err != nil {
		return nil, err
	}
	o.baseVoice = o.base.defaultVoice
	if v := spec.Options["base_voice"]; v != "" {
		if _, ok := o.base.styles[v]; !ok {
			o.base.Close()
			return nil, wrap(fmt.Errorf("option base_voice=%q: no such Kokoro voice", v))
		}
		o.baseVoice = v
	}
	if o.extractor, err = openModel(rt, spec.ID, exPath, []string{"input"}, []string{exOut}, n); err != nil {
		o.Close()
		return nil, wrap(err)
	}
	if o.converter, err = openModel(rt, spec.ID, cvPath, cvIn, []string{outs[0].Name}, n); err != nil {
		o.Close()
		return nil, wrap(err)
	}
	return o, nil
}

// specPath is spec.Files[role] inside spec.Dir, or as given when absolute.
func specPath(spec engine.Spec, role string) string {
	if p := spec.Files[role]; filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(spec.Dir, spec.Files[role])
}

// ID returns the canonical model id.
func (o *OpenVoice) ID() string { return o.id }

// SampleRate is the converter's sampling rate (22050 for OpenVoice v2).
func (o *OpenVoice) SampleRate() int { return o.rate }

// Close releases the three sessions.
func (o *OpenVoice) Close() error {
	var err error
	for _, m := range []*model{o.extractor, o.converter} {
		if m != nil {
			if e := m.close(); e != nil && err == nil {
				err = e
			}
		}
	}
	if o.base != nil {
		if e := o.base.Close(); e != nil && err == nil {
			err = e
		}
	}
	return err
}

// Clone speaks req.Text in the reference's voice; see engine.Cloner.
func (o *OpenVoice) Clone(ctx context.Context, req engine.CloneRequest, emit func(pcm []float32) error) error {
	speed, err := checkText(req.Text, req.Speed)
	if err != nil {
		return err
	}
	secs := float64(len(req.Reference)) / engine.SpeechSampleRate
	if secs < engine.MinReferenceSeconds || secs > engine.MaxReferenceSeconds {
		return &engine.InputError{Param: "reference_audio", Msg: fmt.Sprintf("reference audio is %.1f s; it must be %d to %d s long", secs, engine.MinReferenceSeconds, engine.MaxReferenceSeconds)}
	}
	if rms(req.Reference) < 1e-3 {
		return &engine.InputError{Param: "reference_audio", Msg: "reference audio is silent"}
	}
	dest, err := o.tone(ctx, resample(req.Reference, engine.SpeechSampleRate, o.rate))
	if err != nil {
		return err
	}
	style := o.base.styles[o.baseVoice]
	lang := kokoroLangs[o.baseVoice[0]]
	return o.base.synthesize(ctx, req.Text, style, lang, speed, func(pcm []float32) error {
		out, err := o.convert(ctx, resample(pcm, KokoroSampleRate, o.rate), dest)
		if err != nil {
			return err
		}
		fadeEdges(out, int(fadeSeconds*float64(o.rate)))
		return emit(out)
	})
}

// tone runs the extractor on y (at the converter's rate).
func (o *OpenVoice) tone(ctx context.Context, y []float32) ([]float32, error) {
	mag, frames := o.spec.magnitude(y)
	if frames == 0 {
		return nil, fmt.Errorf("tts: %s: audio too short for a spectrogram", o.id)
	}
	var in tensors
	defer func() { in.destroyAll() }() // a closure: destroy (and keep alive) the tensors appended below
	if err := in.f32(ort.NewShape(1, int64(frames), int64(o.spec.bins())), mag); err != nil {
		return nil, err
	}
	out, _, err := o.extractor.run(ctx, in)
	if err != nil {
		return nil, err
	}
	if len(out[0]) != o.gin {
		return nil, fmt.Errorf("tts: %s: extractor gave %d values, want %d", o.id, len(out[0]), o.gin)
	}
	return out[0], nil
}

// convert renders y (at the converter's rate) with the tone colour dest.
func (o *OpenVoice) convert(ctx context.Context, y, dest []float32) ([]float32, error) {
	src, err := o.tone(ctx, y)
	if err != nil {
		return nil, err
	}
	mag, frames := o.spec.magnitude(y)
	k := o.spec.bins()
	// [frames, bins] -> [bins, frames]
	spec := make([]float32, len(mag))
	for f := range frames {
		for b := range k {
			spec[b*frames+f] = mag[f*k+b]
		}
	}
	var in tensors
	defer func() { in.destroyAll() }() // a closure: destroy (and keep alive) the tensors appended below
	g := int64(o.gin)
	for _, err := range []error{
		in.f32(ort.NewShape(1, int64(k), int64(frames)), spec),
		in.i64(ort.NewShape(1), []int64{int64(frames)}),
		in.f32(ort.NewShape(1, g, 1), src),
		in.f32(ort.NewShape(1, g, 1), append([]float32(nil), dest...)),
		in.f32(ort.NewShape(1), []float32{o.tau}),
	} {
		if err != nil {
			return nil, err
		}
	}
	out, _, err := o.converter.run(ctx, in)
	if err != nil {
		return nil, err
	}
	for _, v := range out[0] {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("tts: %s: converter output is not finite", o.id)
		}
	}
	return out[0], nil
}

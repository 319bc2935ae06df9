// Package diffusion runs Stable Diffusion class pipelines exported to ONNX
// in the diffusers/Optimum layout (SD 1.x, SD 2.x, SD-Turbo, their
// inpainting and InstructPix2Pix variants, with ControlNets) in the node's
// in-process ONNX Runtime: engine.TaskImageGeneration. It makes images
// from text and runs every image operation of the API (img2img, inpaint,
// outpaint, variations, edit, layers, remove-background) with optional
// ControlNet canny/depth guidance and the safety checker.
//
// A model folder holds the export's components. Each is found through the
// manifest's file role, else at its diffusers path:
//
//	role               diffusers path                     needed
//	text_encoder       text_encoder/model.onnx            yes
//	unet               unet/model.onnx                    yes
//	vae_decoder        vae_decoder/model.onnx             yes
//	vae_encoder        vae_encoder/model.onnx             image operations
//	vocab, merges      tokenizer/vocab.json, merges.txt   yes
//	tokenizer_config   tokenizer/tokenizer_config.json    no (pad token)
//	scheduler          scheduler/scheduler_config.json    yes
//	vae_config         vae_decoder/config.json            no (scaling_factor)
//	safety_checker     safety_checker/model.onnx          safety_check
//	controlnet_canny   controlnet/canny/model.onnx        control_type canny
//	controlnet_depth   controlnet/depth/model.onnx        control_type depth
//	depth_estimator    depth_estimator/model.onnx         control_type depth
//	segmenter          segmenter/model.onnx (ISNet)       no (else the node's)
//
// Options (all optional): "steps" (default 25, 1 for LCM), "guidance_scale"
// (default 7.5; <= 1 turns classifier-free guidance off),
// "image_guidance_scale" (InstructPix2Pix, default 1.5), "size_multiple"
// (default 8; real SD UNets want 64), "default_size" (default 512),
// "vae_scale" (default from vae_config, else 0.18215), "controlnet_divisors"
// (comma list of each ControlNet output's spatial divisor; default the SD
// layout for 13 outputs), "depth_size" (depth estimator input side when the
// graph leaves it open, default 518), "segmenter_size" (ISNet input, 1024).
//
// Graph dtypes are read from the graphs: float32 and float16 exports load
// (float16 tensors are converted at the boundary); the timestep may be
// int64, int32, float32 or float16.
package diffusion

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// Defaults of the options.
const (
	defaultSteps        = 25
	defaultGuidance     = 7.5
	defaultImgGuidance  = 1.5
	defaultVAEScale     = 0.18215
	defaultSizeMultiple = 8
	defaultSize         = 512
	defaultDepthSize    = 518
	maxSteps            = 200
	vaeFactor           = 8
)

// diffusersPath is a component role's path in the diffusers layout.
func diffusersPath(role string) string {
	return map[string]string{
		"text_encoder":     "text_encoder/model.onnx",
		"unet":             "unet/model.onnx",
		"vae_decoder":      "vae_decoder/model.onnx",
		"vae_encoder":      "vae_encoder/model.onnx",
		"vocab":            "tokenizer/vocab.json",
		"merges":           "tokenizer/merges.txt",
		"tokenizer_config": "tokenizer/tokenizer_config.json",
		"scheduler":        "scheduler/scheduler_config.json",
		"vae_config":       "vae_decoder/config.json",
		"safety_checker":   "safety_checker/model.onnx",
		"controlnet_canny": "controlnet/canny/model.onnx",
		"controlnet_depth": "controlnet/depth/model.onnx",
		"depth_estimator":  "depth_estimator/model.onnx",
		"segmenter":        "segmenter/model.onnx",
	}[role]
}

// errClosed is returned by calls on a closed engine.
var errClosed = errors.New("diffusion: engine is closed")

// Engine is a loaded pipeline. Its sessions serve concurrent jobs; each
// job owns its tensors. How many jobs run at once is the node's business
// (the API's image gate).
type Engine struct {
	id string
	// rt is the model's view of the runtime: its run options shrink the
	// arenas when the model gives memory back (see RunImages).
	rt       *onnx.Runtime
	tok      *clipTokenizer
	sched    *schedConfig
	text     *component
	unet     *component
	vaeDec   *component
	vaeEnc   *component
	safety   *component
	controls map[string]*controlNet
	depth    *component
	seg      engine.BackgroundRemover

	idsType    ort.TensorElementDataType // text encoder input_ids
	hidden     int                       // text embedding width
	seqLen     int
	inChannels int // UNet sample channels: 4, 8 (InstructPix2Pix) or 9 (inpainting)
	latentCh   int
	unetBatch1 bool     // the UNet's batch is fixed at 1
	unetExtra  []string // UNet inputs beyond the three standard ones (ControlNet residuals)
	vaeScale   float32
	multiple   int
	defSize    int
	steps      int
	guidance   float64
	imgGuide   float64
	depthSize  int

	// life guards the sessions: jobs hold it for reading, Close for
	// writing.
	life   sync.RWMutex
	closed bool
}

var (
	_ engine.ImageGenerator = (*Engine)(nil)
	_ engine.ImageOperator  = (*Engine)(nil)
)

// controlNet is one ControlNet and the spatial divisors of its outputs.
type controlNet struct {
	c        *component
	scaleIn  bool // takes conditioning_scale
	channels []int
	divisors []int
}

// Load opens the pipeline of spec (see the package comment for the files
// and options) with the runtime's session options.
func Load(rt *onnx.Runtime, spec engine.Spec) (*Engine, error) {
	if spec.Task != "" && spec.Task != engine.TaskImageGeneration {
		return nil, fmt.Errorf("diffusion: %s: task %q is not %q", spec.ID, spec.Task, engine.TaskImageGeneration)
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, err
	}
	e := &Engine{id: spec.ID, rt: rt, controls: map[string]*controlNet{}}
	if err := e.load(rt, spec); err != nil {
		e.Close()
		return nil, fmt.Errorf("diffusion: %s: %w", spec.ID, err)
	}
	return e, nil
}

// LoadImageGenerator is Load as the engine contract's type, for the node's
// loader.
func LoadImageGenerator(rt *onnx.Runtime, spec engine.Spec) (engine.ImageGenerator, error) {
	e, err := Load(rt, spec)
	if err != nil {
		return nil, err
	}
	return e, nil
}

// path resolves a component role: the manifest's file, else the diffusers
// path; "" when neither exists.
func path(spec engine.Spec, role string) string {
	if f := spec.Files[role]; f != "" {
		return filepath.Join(spec.Dir, f)
	}
	p := filepath.Join(spec.Dir, diffusersPath(role))
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

func (e *Engine) load(rt *onnx.Runtime, spec engine.Spec) error {
	opt := spec.Options
	var err error
	if e.steps, err = onnx.IntOption(opt, "steps", 0, 1, maxSteps); err != nil {
		return err
	}
	if e.multiple, err = onnx.IntOption(opt, "size_multiple", defaultSizeMultiple, 8, 512); err != nil {
		return err
	}
	if e.multiple%8 != 0 {
		return fmt.Errorf("option size_multiple %d is not a multiple of 8", e.multiple)
	}
	if e.defSize, err = onnx.IntOption(opt, "default_size", defaultSize, 64, 4096); err != nil {
		return err
	}
	if e.depthSize, err = onnx.IntOption(opt, "depth_size", defaultDepthSize, 14, 4096); err != nil {
		return err
	}
	if e.guidance, err = floatOption(opt, "guidance_scale", defaultGuidance, 0, 50); err != nil {
		return err
	}
	if e.imgGuide, err = floatOption(opt, "image_guidance_scale", defaultImgGuidance, 0, 50); err != nil {
		return err
	}
	for _, role := range []string{"text_encoder", "unet", "vae_decoder", "vocab", "merges", "scheduler"} {
		if path(spec, role) == "" {
			return fmt.Errorf("no %s (file role %q or %s)", role, role, diffusersPath(role))
		}
	}
	if e.sched, err = readSchedConfig(path(spec, "scheduler")); err != nil {
		return err
	}
	if e.steps == 0 {
		e.steps = defaultSteps
		if e.sched.Class == schedLCM {
			e.steps = 1
		}
	}
	if err := e.loadVAEScale(spec); err != nil {
		return err
	}
	if err := e.openText(rt, spec); err != nil {
		return err
	}
	if err := e.openUNet(rt, spec); err != nil {
		return err
	}
	if e.vaeDec, err = openComponent(rt, "vae_decoder", path(spec, "vae_decoder"), "sample"); err != nil {
		return err
	}
	if _, err := e.vaeDec.input("latent_sample"); err != nil {
		return err
	}
	if p := path(spec, "vae_encoder"); p != "" {
		if e.vaeEnc, err = openComponent(rt, "vae_encoder", p, "latent_sample"); err != nil {
			return err
		}
		if _, err := e.vaeEnc.input("sample"); err != nil {
			return err
		}
	}
	if p := path(spec, "safety_checker"); p != "" {
		if e.safety, err = openComponent(rt, "safety_checker", p, "has_nsfw_concepts"); err != nil {
			return err
		}
		for _, n := range []string{"clip_input", "images"} {
			if _, err := e.safety.input(n); err != nil {
				return err
			}
		}
	}
	if err := e.openControls(rt, spec); err != nil {
		return err
	}
	if p := path(spec, "segmenter"); p != "" {
		size := opt["segmenter_size"]
		if size == "" {
			size = "1024"
		}
		e.seg, err = rt.LoadBackgroundRemover(engine.Spec{ID: spec.ID + "/segmenter", Task: engine.TaskBackgroundRemoval,
			Dir: filepath.Dir(p), Files: map[string]string{"model": filepath.Base(p)}, Options: map[string]string{"input_size": size}})
		if err != nil {
			return fmt.Errorf("segmenter: %w", err)
		}
	}
	return nil
}

func floatOption(opt map[string]string, key string, def, lo, hi float64) (float64, error) {
	s, ok := opt[key]
	if !ok || s == "" {
		return def, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < lo || v > hi {
		return 0, fmt.Errorf("option %s=%q is not a number in [%g, %g]", key, s, lo, hi)
	}
	return v, nil
}

// loadVAEScale reads the latent scaling factor: option, vae config, default.
func (e *Engine) loadVAEScale(spec engine.Spec) error {
	e.vaeScale = defaultVAEScale
	if p := path(spec, "vae_config"); p != "" {
		raw, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("vae config: %w", err)
		}
		var c struct {
			Scale float64 `json:"scaling_factor"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return fmt.Errorf("vae config %s: %w", p, err)
		}
		if c.Scale > 0 {
			e.vaeScale = float32(c.Scale)
		}
	}
	v, err := floatOption(spec.Options, "vae_scale", float64(e.vaeScale), 1e-4, 10)
	e.vaeScale = float32(v)
	return err
}

func (e *Engine) openText(rt *onnx.Runtime, spec engine.Spec) error {
	var err error
	if e.text, err = openComponent(rt, "text_encoder", path(spec, "text_encoder"), "last_hidden_state"); err != nil {
		return err
	}
	ids, err := e.text.input("input_ids")
	if err != nil {
		return err
	}
	switch ids.DataType {
	case ort.TensorElementDataTypeInt32, ort.TensorElementDataTypeInt64:
		e.idsType = ids.DataType
	default:
		return fmt.Errorf("text_encoder: input_ids is %s, want int32 or int64", ids.DataType)
	}
	if len(e.text.ins) != 1 {
		return fmt.Errorf("text_encoder: inputs %v, want input_ids only", ioNames(e.text.ins))
	}
	if _, err := floatType(e.text, e.text.outs[0]); err != nil {
		return err
	}
	e.seqLen = staticDim(ids, 1)
	e.hidden = staticDim(e.text.outs[0], 2)
	cfg := path(spec, "tokenizer_config")
	if cfg == "" {
		cfg = filepath.Join(spec.Dir, "tokenizer/special_tokens_map.json")
	}
	e.tok, err = loadCLIP(path(spec, "vocab"), path(spec, "merges"), cfg, e.seqLen)
	if err != nil {
		return err
	}
	e.seqLen = e.tok.maxLen
	return nil
}

// unetStd are the UNet inputs every export has.
func unetStd() []string { return []string{"sample", "timestep", "encoder_hidden_states"} }

func (e *Engine) openUNet(rt *onnx.Runtime, spec engine.Spec) error {
	var err error
	if e.unet, err = openComponent(rt, "unet", path(spec, "unet"), "out_sample"); err != nil {
		return err
	}
	for _, n := range unetStd() {
		if _, err := e.unet.input(n); err != nil {
			return err
		}
	}
	sample, _ := e.unet.input("sample")
	if _, err := floatType(e.unet, sample); err != nil {
		return err
	}
	ehs, _ := e.unet.input("encoder_hidden_states")
	if h := staticDim(ehs, 2); h > 0 {
		if e.hidden > 0 && h != e.hidden {
			return fmt.Errorf("unet takes text embeddings of %d, the text encoder gives %d", h, e.hidden)
		}
		e.hidden = h
	}
	if e.hidden == 0 {
		return errors.New("the text embedding width is open in both text_encoder and unet graphs")
	}
	e.inChannels = staticDim(sample, 1)
	if e.inChannels == 0 {
		e.inChannels = 4
	}
	switch e.inChannels {
	case 4, 8, 9:
	default:
		return fmt.Errorf("unet sample has %d channels, want 4, 8 (InstructPix2Pix) or 9 (inpainting)", e.inChannels)
	}
	e.latentCh = staticDim(e.unet.outs[0], 1)
	if e.latentCh == 0 {
		e.latentCh = 4
	}
	e.unetBatch1 = staticDim(sample, 0) == 1
	for _, in := range e.unet.ins {
		if !contains(unetStd(), in.Name) {
			if _, err := floatType(e.unet, in); err != nil {
				return err
			}
			e.unetExtra = append(e.unetExtra, in.Name)
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// sdDivisors are the spatial divisors of the SD 1.x/2.x ControlNet's 12
// down-block residuals and its mid-block residual.
func sdDivisors() []int { return []int{1, 1, 1, 2, 2, 2, 4, 4, 4, 8, 8, 8, 8} }

func (e *Engine) openControls(rt *onnx.Runtime, spec engine.Spec) error {
	for _, kind := range []string{engine.ControlCanny, engine.ControlDepth} {
		p := path(spec, "controlnet_"+kind)
		if p == "" {
			continue
		}
		c, err := openComponent(rt, "controlnet_"+kind, p)
		if err != nil {
			return err
		}
		cn := &controlNet{c: c}
		e.controls[kind] = cn
		for _, n := range []string{"sample", "timestep", "encoder_hidden_states", "controlnet_cond"} {
			if _, err := c.input(n); err != nil {
				return err
			}
		}
		_, cn.scaleIn = findIO(c.ins, "conditioning_scale")
		if len(c.outs) != len(e.unetExtra) {
			return fmt.Errorf("%s has %d outputs but the unet takes %d residual inputs", c.name, len(c.outs), len(e.unetExtra))
		}
		cn.divisors = sdDivisors()
		if s := spec.Options["controlnet_divisors"]; s != "" {
			cn.divisors = nil
			for _, f := range strings.Split(s, ",") {
				d, err := strconv.Atoi(strings.TrimSpace(f))
				if err != nil || d < 1 || d > 64 {
					return fmt.Errorf("option controlnet_divisors %q: %q is not a divisor 1..64", s, f)
				}
				cn.divisors = append(cn.divisors, d)
			}
		}
		if len(cn.divisors) != len(c.outs) {
			return fmt.Errorf("%s has %d outputs; set option controlnet_divisors (one per output)", c.name, len(c.outs))
		}
		for i, o := range c.outs {
			in, _ := e.unet.input(e.unetExtra[i])
			ch := staticDim(o, 1)
			if ch == 0 {
				ch = staticDim(in, 1)
			}
			if ch == 0 {
				return fmt.Errorf("%s output %s has an open channel count", c.name, o.Name)
			}
			cn.channels = append(cn.channels, ch)
		}
	}
	if len(e.unetExtra) > 0 && len(e.controls) == 0 {
		return fmt.Errorf("unet takes %v but the folder has no ControlNet", e.unetExtra)
	}
	if e.controls[engine.ControlDepth] != nil {
		p := path(spec, "depth_estimator")
		if p == "" {
			return errors.New("controlnet_depth needs a depth_estimator")
		}
		var err error
		if e.depth, err = openComponent(rt, "depth_estimator", p); err != nil {
			return err
		}
		if len(e.depth.ins) != 1 || len(e.depth.outs) < 1 {
			return errors.New("depth_estimator: want one image input and a depth output")
		}
		if s := staticDim(e.depth.ins[0], 2); s > 0 {
			e.depthSize = s
		}
	}
	return nil
}

// ID returns the canonical model id.
func (e *Engine) ID() string { return e.id }

// SizeMultiple is the multiple image sides are rounded to.
func (e *Engine) SizeMultiple() int { return e.multiple }

// DefaultSteps is the number of denoising steps a job without Steps runs
// (the manifest's steps option, else the scheduler's default); the API
// estimates a request's work with it.
func (e *Engine) DefaultSteps() int { return e.steps }

// Close waits for jobs in flight and releases every session.
func (e *Engine) Close() error {
	e.life.Lock()
	defer e.life.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	var errs []error
	for _, c := range []*component{e.text, e.unet, e.vaeDec, e.vaeEnc, e.safety, e.depth} {
		errs = append(errs, c.close())
	}
	for _, cn := range e.controls {
		errs = append(errs, cn.c.close())
	}
	if e.seg != nil {
		errs = append(errs, e.seg.Close())
	}
	return errors.Join(errs...)
}

package diffusion

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"image"
	"image/png"
	"math/rand/v2"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
)

// Bounds of a job.
const (
	minSide = 64
	maxSide = 4096
	maxN    = 4
)

// inputErr is an engine.InputError.
func inputErr(param, format string, args ...any) error {
	return &engine.InputError{Param: param, Msg: fmt.Sprintf(format, args...)}
}

// Supports reports whether the pipeline can run operation with ControlNet
// controlType ("" for none) and, when asked, its safety checker. The
// refusal is an InputError naming the field and the reason.
func (e *Engine) Supports(operation, controlType string, safetyCheck bool) error {
	if safetyCheck && e.safety == nil {
		return inputErr("safety_check", "Model %s has no safety checker (safety_checker/model.onnx).", e.id)
	}
	if controlType != "" && e.controls[controlType] == nil {
		return inputErr("control_type", "Model %s has no %s ControlNet.", e.id, controlType)
	}
	switch operation {
	case engine.OpGenerate:
		if e.inChannels == 8 {
			return inputErr("operation", "Model %s is an InstructPix2Pix editing model: send an image with operation 'edit'.", e.id)
		}
		return nil
	case engine.OpImg2Img, engine.OpVariations:
		if e.inChannels == 8 {
			return inputErr("operation", "Model %s is an InstructPix2Pix editing model: use operation 'edit'.", e.id)
		}
	case engine.OpInpaint, engine.OpOutpaint:
		if e.inChannels == 8 {
			return inputErr("operation", "Model %s is an InstructPix2Pix editing model and cannot %s.", e.id, operation)
		}
	case engine.OpEdit:
		if e.inChannels == 9 {
			return inputErr("operation", "Model %s is an inpainting model; it cannot follow edit instructions.", e.id)
		}
	case engine.OpRemoveBackground, engine.OpLayers:
		if controlType != "" {
			return inputErr("control_type", "Operation %s takes no ControlNet guidance.", operation)
		}
		return nil
	case engine.OpUpscale:
		return inputErr("operation", "Model %s is a diffusion model; operation 'upscale' needs an image-upscale model.", e.id)
	default:
		return inputErr("operation", "Unknown operation %q.", operation)
	}
	if e.vaeEnc == nil {
		return inputErr("operation", "Model %s has no VAE encoder (vae_encoder/model.onnx), so it cannot take an image.", e.id)
	}
	return nil
}

// roundSide rounds a side to the engine's multiple within [multiple, 4096].
func (e *Engine) roundSide(v int) int {
	m := e.multiple
	r := (v + m/2) / m * m
	return min(max(r, m), maxSide/m*m)
}

// checkJob validates the fields of job the engine has to trust.
func (e *Engine) checkJob(job *engine.ImageJob) error {
	if job.N == 0 {
		job.N = 1
	}
	if job.N < 1 || job.N > maxN {
		return inputErr("n", "'n' must be between 1 and %d.", maxN)
	}
	for _, s := range []int{job.Width, job.Height} {
		if s != 0 && (s < minSide || s > maxSide) {
			return inputErr("size", "Each side must be %d to %d pixels.", minSide, maxSide)
		}
	}
	if (job.Width == 0) != (job.Height == 0) {
		return inputErr("size", "Give both sides or neither.")
	}
	if job.Strength != nil && (*job.Strength < 0 || *job.Strength > 1) {
		return inputErr("strength", "'strength' must be between 0 and 1.")
	}
	if job.ControlScale != nil && (*job.ControlScale < 0 || *job.ControlScale > engine.MaxControlScale) {
		return inputErr("control_scale", "'control_scale' must be between 0 and %d.", engine.MaxControlScale)
	}
	if job.OutpaintPercent < 0 || job.OutpaintPercent > engine.MaxOutpaintPercent {
		return inputErr("outpaint_percent", "'outpaint_percent' must be above 0 and at most %d.", engine.MaxOutpaintPercent)
	}
	if job.LayerCount < 0 || job.LayerCount > engine.MaxLayerCount {
		return inputErr("layer_count", "'layer_count' must be between 1 and %d.", engine.MaxLayerCount)
	}
	if job.Steps < 0 || job.Steps > maxSteps {
		return inputErr("num_inference_steps", "'num_inference_steps' must be between 1 and %d.", maxSteps)
	}
	if job.GuidanceScale != nil && (*job.GuidanceScale < 0 || *job.GuidanceScale > 50) {
		return inputErr("guidance_scale", "'guidance_scale' must be between 0 and 50.")
	}
	if job.ImageGuidanceScale != nil && (*job.ImageGuidanceScale < 0 || *job.ImageGuidanceScale > 50) {
		return inputErr("image_guidance_scale", "'image_guidance_scale' must be between 0 and 50.")
	}
	if job.Operation != engine.OpGenerate && job.Image == nil {
		return inputErr("image", "Operation '%s' needs an image.", job.Operation)
	}
	if job.Image != nil {
		b := job.Image.Bounds()
		if b.Dx() < 8 || b.Dy() < 8 || b.Dx() > maxSide || b.Dy() > maxSide {
			return inputErr("image", "The image is %dx%d pixels; each side must be 8 to %d.", b.Dx(), b.Dy(), maxSide)
		}
	}
	if job.Operation == engine.OpInpaint {
		if job.Mask == nil {
			return inputErr("mask", "Operation 'inpaint' needs a mask (white is repainted).")
		}
		if job.Mask.Bounds().Size() != job.Image.Bounds().Size() {
			mb, ib := job.Mask.Bounds(), job.Image.Bounds()
			return inputErr("mask", "The mask is %dx%d pixels but the image is %dx%d; they must match.", mb.Dx(), mb.Dy(), ib.Dx(), ib.Dy())
		}
	} else if job.Mask != nil {
		return inputErr("mask", "'mask' applies to operation 'inpaint' only.")
	}
	if job.ControlType == "" && job.ControlImage != nil {
		return inputErr("control_type", "'control_image' needs 'control_type' (canny or depth).")
	}
	if job.ControlType != "" && job.ControlImage == nil && job.Image == nil {
		return inputErr("control_image", "ControlNet guidance needs a control_image.")
	}
	if job.ControlImage != nil {
		b := job.ControlImage.Bounds()
		if b.Dx() < 8 || b.Dy() < 8 || b.Dx() > maxSide || b.Dy() > maxSide {
			return inputErr("control_image", "The control image is %dx%d pixels; each side must be 8 to %d.", b.Dx(), b.Dy(), maxSide)
		}
	}
	if len(job.ReferenceImages) > 0 {
		return inputErr("reference_images", "Model %s takes no reference images.", e.id)
	}
	return nil
}

// RunImages runs one job (see engine.ImageOperator).
func (e *Engine) RunImages(ctx context.Context, job engine.ImageJob) (engine.ImageJobResult, error) {
	e.life.RLock()
	defer e.life.RUnlock()
	if e.closed {
		return engine.ImageJobResult{}, errClosed
	}
	if err := e.Supports(job.Operation, job.ControlType, job.SafetyCheck); err != nil {
		return engine.ImageJobResult{}, err
	}
	if err := e.checkJob(&job); err != nil {
		return engine.ImageJobResult{}, err
	}
	res := engine.ImageJobResult{}
	if job.Seed != nil {
		res.Seed = *job.Seed
	} else {
		res.Seed = rand.Int64N(1 << 53)
	}
	// Every run of the job but the denoising steps before the last gives
	// the arena regions it no longer uses back at its end (when the
	// model's arena setting lets it: ShrinkingRunOptions), so the job's
	// activations are not kept once it is done.
	ro, err := e.rt.ShrinkingRunOptions()
	if err != nil {
		return res, err
	}
	defer ro.Destroy()
	var imgs []*image.NRGBA
	switch job.Operation {
	case engine.OpRemoveBackground:
		imgs, err = e.removeBackground(ctx, &job)
	case engine.OpLayers:
		imgs, err = e.layers(ctx, ro, &job, res.Seed)
	default:
		imgs, err = e.diffuse(ctx, ro, &job, res.Seed)
	}
	if err != nil {
		return res, err
	}
	if job.SafetyCheck {
		for _, im := range imgs {
			flagged, err := e.flagged(ctx, ro, im)
			if err != nil {
				return res, err
			}
			if flagged {
				res.Filtered++
				continue
			}
			res.Images = append(res.Images, im)
		}
		return res, nil
	}
	res.Images = imgs
	return res, nil
}

// GenerateImages makes req.N images from the prompt as PNGs (text to
// image through RunImages; Size "" takes the model's default size).
func (e *Engine) GenerateImages(ctx context.Context, req engine.ImageRequest) (engine.ImageResult, error) {
	job := engine.ImageJob{Prompt: req.Prompt, N: req.N, Seed: req.Seed}
	if req.Size != "" {
		if k, err := fmt.Sscanf(req.Size, "%dx%d", &job.Width, &job.Height); err != nil || k != 2 {
			return engine.ImageResult{}, inputErr("size", "'size' must be WIDTHxHEIGHT.")
		}
	}
	res, err := e.RunImages(ctx, job)
	if err != nil {
		return engine.ImageResult{}, err
	}
	out := engine.ImageResult{}
	for _, im := range res.Images {
		s, err := EncodePNG(im)
		if err != nil {
			return engine.ImageResult{}, err
		}
		out.Images = append(out.Images, engine.GeneratedImage{B64JSON: s})
	}
	return out, nil
}

// EncodePNG returns img as base64 PNG (fast compression).
func EncodePNG(img image.Image) (string, error) {
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(&buf, img); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes()), nil
}

// flagged runs the safety checker on one image.
func (e *Engine) flagged(ctx context.Context, ro *ort.RunOptions, img *image.NRGBA) (bool, error) {
	w, h := img.Rect.Dx(), img.Rect.Dy()
	ci, _ := e.safety.input("clip_input")
	im, _ := e.safety.input("images")
	var ins []ort.Value
	for _, in := range e.safety.ins {
		var t *ftensor
		var err error
		switch in.Name {
		case "clip_input":
			if t, err = newFTensor(ci.DataType, ort.NewShape(1, 3, 224, 224)); err == nil {
				t.set(clipInput(img))
			}
		case "images":
			if t, err = newFTensor(im.DataType, ort.NewShape(1, int64(h), int64(w), 3)); err == nil {
				t.set(hwc01(img))
			}
		default:
			err = fmt.Errorf("safety_checker: unexpected input %q", in.Name)
		}
		if err != nil {
			return false, err
		}
		defer t.destroy()
		ins = append(ins, t.value())
	}
	out, err := ort.NewEmptyTensor[bool](ort.NewShape(1))
	if err != nil {
		return false, err
	}
	defer out.Destroy()
	if err := e.safety.run(ctx, ro, ins, []ort.Value{out}); err != nil {
		return false, err
	}
	return out.GetData()[0], nil
}

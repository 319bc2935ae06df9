package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/jpeg"
	"image/png"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
)

// Limits of an image generation request (spec: Image generation).
const (
	// MaxImagePrompt is the longest prompt in characters.
	MaxImagePrompt = 32000
	// MaxImagesPerRequest is the largest n.
	MaxImagesPerRequest = 4
	// minImageSide and maxImageSide bound each side of size.
	minImageSide, maxImageSide = 64, 4096
	// defaultImageSize is the size when none is given.
	defaultImageSize = "1024x1024"
	// maxImageOption bounds the free-form string options (quality...).
	maxImageOption = 64
)

// imageOperations are the spec's image operations; none of them is plain
// text-to-image, which is what a request without one asks for.
var imageOperations = []string{"img2img", "inpaint", "outpaint", "variations", "upscale", "remove-background", "edit", "layers"}

// imageRequest is the body of POST /v1/images/generations: the spec's
// fields, and OpenAI's quality, style, background, output_format and user,
// which are passed on.
type imageRequest struct {
	Model           string          `json:"model"`
	Prompt          *string         `json:"prompt"`
	Size            string          `json:"size"`
	N               *int            `json:"n"`
	Seed            *int64          `json:"seed"`
	ResponseFormat  string          `json:"response_format"`
	SafetyCheck     *bool           `json:"safety_check"`
	Image           *string         `json:"image"`
	Strength        *float64        `json:"strength"`
	Mask            *string         `json:"mask"`
	Operation       string          `json:"operation"`
	UpscaleFactor   *int            `json:"upscale_factor"`
	OutpaintPercent *float64        `json:"outpaint_percent"`
	ControlType     string          `json:"control_type"`
	ControlImage    *string         `json:"control_image"`
	ControlScale    *float64        `json:"control_scale"`
	ReferenceImages json.RawMessage `json:"reference_images"`
	LayerCount      *int            `json:"layer_count"`
	Quality         string          `json:"quality"`
	Style           string          `json:"style"`
	Background      string          `json:"background"`
	OutputFormat    string          `json:"output_format"`
	// OutputCompression is the JPEG quality (0-100) of output_format
	// jpeg.
	OutputCompression *int   `json:"output_compression"`
	User              string `json:"user"`
	// Local pipeline extensions: the negative prompt, the number of
	// denoising steps and the two guidance scales.
	NegativePrompt     *string  `json:"negative_prompt"`
	Steps              *int     `json:"num_inference_steps"`
	GuidanceScale      *float64 `json:"guidance_scale"`
	ImageGuidanceScale *float64 `json:"image_guidance_scale"`
}

// parsedImages is a validated image generation request.
type parsedImages struct {
	Model string
	Req   engine.ImageRequest
	// Operation is the requested operation ("" = text to image) and
	// OperationParam the field that asked for it, for the refusal when
	// the model cannot do it.
	Operation, OperationParam string
	// Upscale is set for operation "upscale", which takes an image and
	// no prompt and is served by an image-upscale model (upscale.go).
	Upscale *upscaleRequest
	// Local is the request as a local pipeline runs it.
	Local localImages
}

// promptOptional are the operations that may come without a prompt when
// parseImageBody allows it.
func promptOptional(op string) bool {
	return op == engine.OpVariations || op == engine.OpRemoveBackground || op == engine.OpLayers
}

// parseImageBody is parseImages; with optionalPrompt, operations
// variations, remove-background and layers may leave the prompt out.
func parseImageBody(body []byte, optionalPrompt bool) (*parsedImages, error) {
	var in imageRequest
	if err := decodeStrict(body, &in); err != nil {
		return nil, err
	}
	return validateImageRequest(&in, optionalPrompt)
}

// validateImageRequest validates a decoded image request (the JSON body of
// /v1/images/generations or a form of /v1/images/edits or variations),
// naming each bad field, and gathers what the engines take.
func validateImageRequest(in *imageRequest, optionalPrompt bool) (*parsedImages, error) {
	if in.Model == "" {
		return nil, apierr.BadRequest(apierr.CodeMissingParam, "model", "You must provide a model parameter.")
	}
	if in.Prompt == nil && optionalPrompt && promptOptional(in.Operation) {
		in.Prompt = new(string)
	}
	if in.Prompt == nil || (*in.Prompt == "" && !(optionalPrompt && promptOptional(in.Operation))) {
		return nil, apierr.BadRequest(apierr.CodeMissingParam, "prompt", "You must provide a prompt.")
	}
	if utf8.RuneCountInString(*in.Prompt) > MaxImagePrompt {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "prompt", fmt.Sprintf("The prompt is longer than %d characters.", MaxImagePrompt))
	}
	n := 1
	if in.N != nil {
		n = *in.N
	}
	if n < 1 || n > MaxImagesPerRequest {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "n", fmt.Sprintf("'n' must be between 1 and %d.", MaxImagesPerRequest))
	}
	size := in.Size
	if size == "" {
		size = defaultImageSize
	}
	var w, h int
	if k, err := fmt.Sscanf(size, "%dx%d", &w, &h); err != nil || k != 2 || fmt.Sprintf("%dx%d", w, h) != size ||
		w < minImageSide || h < minImageSide || w > maxImageSide || h > maxImageSide {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "size", fmt.Sprintf("'size' must be WIDTHxHEIGHT with %d to %d pixels per side.", minImageSide, maxImageSide))
	}
	switch in.ResponseFormat {
	case "", "b64_json":
	case "url":
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "response_format", "URLs are not supported; images are returned as b64_json.")
	default:
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "response_format", fmt.Sprintf("'%s' is not one of ['b64_json'].", in.ResponseFormat))
	}
	if in.Strength != nil && (*in.Strength < 0 || *in.Strength > 1) {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "strength", "'strength' must be between 0 and 1.")
	}
	if in.UpscaleFactor != nil && *in.UpscaleFactor != 2 && *in.UpscaleFactor != 4 {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "upscale_factor", "'upscale_factor' must be 2 or 4.")
	}
	if in.ControlType != "" && in.ControlType != "canny" && in.ControlType != "depth" {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "control_type", fmt.Sprintf("'%s' is not one of ['canny', 'depth'].", in.ControlType))
	}
	if in.LayerCount != nil && *in.LayerCount < 1 {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "layer_count", "'layer_count' must be at least 1.")
	}
	for _, o := range []struct{ name, v string }{
		{"quality", in.Quality}, {"style", in.Style}, {"background", in.Background}, {"output_format", in.OutputFormat}, {"user", in.User},
	} {
		if len(o.v) > maxImageOption {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, o.name, fmt.Sprintf("'%s' is longer than %d characters.", o.name, maxImageOption))
		}
	}
	local, err := parseLocalImages(in, w, h)
	if err != nil {
		return nil, err
	}
	p := &parsedImages{Model: in.Model, Local: local, Req: engine.ImageRequest{
		Prompt: *in.Prompt, N: n, Size: size, Seed: in.Seed, ResponseFormat: "b64_json",
		Quality: in.Quality, Style: in.Style, Background: in.Background, OutputFormat: in.OutputFormat, User: in.User,
	}}
	// What the request asks beyond text to image, named by the field that
	// asks for it.
	switch {
	case in.Operation != "":
		if !slices.Contains(imageOperations, in.Operation) {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "operation", fmt.Sprintf("'%s' is not one of %q.", in.Operation, imageOperations))
		}
		p.Operation, p.OperationParam = in.Operation, "operation"
	case in.Mask != nil:
		p.Operation, p.OperationParam = "inpaint", "mask"
	case in.Image != nil:
		p.Operation, p.OperationParam = "img2img", "image"
	case in.ControlImage != nil || in.ControlType != "" || in.ControlScale != nil:
		p.Operation, p.OperationParam = "controlnet guidance", "control_image"
	case len(in.ReferenceImages) > 0 && string(in.ReferenceImages) != "null":
		p.Operation, p.OperationParam = "edit", "reference_images"
	case in.SafetyCheck != nil && *in.SafetyCheck:
		p.Operation, p.OperationParam = "the safety filter", "safety_check"
	}
	return p, nil
}

// imageObject is one entry of the response's data.
type imageObject struct {
	B64JSON       string `json:"b64_json"`
	RevisedPrompt string `json:"revised_prompt,omitempty"`
}

// imagesGenerations serves POST /v1/images/generations with the model's
// image generation engine: a local pipeline (engine.ImageOperator) runs
// every operation under the node's image gate; an
// upstream provider's image model makes images from text only. A model of
// another task is a 400 model_not_supported, but operation
// "remove-background" may name a background-removal model.
func (s *Server) imagesGenerations(w http.ResponseWriter, r *http.Request) {
	// The body may carry an image to upscale, hence the image body limit.
	p, ok := decodeRequest(w, r, MaxImageBody, parseImagesOrUpscale)
	if !ok {
		return
	}
	if p.Upscale != nil {
		s.imagesUpscale(w, r, p.Upscale)
		return
	}
	if p.Local.Op == engine.OpRemoveBackground && s.removeBackgroundModel(w, r, p) {
		return
	}
	m, gen, ok := modelEngine(s, w, r, p.Model, s.opt.Backend.ImageGenerator)
	if !ok {
		return
	}
	if op, local := gen.(engine.ImageOperator); local {
		s.imagesLocal(w, r, p, op)
		return
	}
	if p.Operation != "" {
		// Provider image models make images from text only.
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, p.OperationParam, fmt.Sprintf("Model %s does not support %s; it makes images from a text prompt only.", m.ID, p.Operation)))
		return
	}
	res, err := gen.GenerateImages(r.Context(), p.Req)
	if err != nil {
		writeErr(w, err)
		return
	}
	created := res.Created
	if created == 0 {
		created = s.opt.Clock().Unix()
	}
	data := make([]imageObject, len(res.Images))
	for i, im := range res.Images {
		data[i] = imageObject{B64JSON: im.B64JSON, RevisedPrompt: im.RevisedPrompt}
	}
	reportUsage(w, 0, int64(len(data))) // output images
	writeJSON(w, http.StatusOK, map[string]any{"created": created, "data": data})
}

// Local pipeline limits beyond the spec's (the spec leaves these open).
const (
	maxImageSteps    = 200
	maxImageGuidance = 50
)

// localImages is an image request as a local pipeline (ImageOperator)
// runs it; the pictures are still base64.
type localImages struct {
	// Op is the engine operation: the explicit one, else inpaint for a
	// mask, img2img for an image, else text to image.
	Op string
	// Width and Height are the asked size; 0 when size was not given
	// (operations on a picture then keep its size).
	Width, Height                     int
	Image, Mask, ControlImage         *string
	Strength, ControlScale            *float64
	GuidanceScale, ImageGuidanceScale *float64
	OutpaintPercent                   float64
	ControlType                       string
	LayerCount                        int
	SafetyCheck                       bool
	Steps                             int
	NegativePrompt                    string
	// References counts reference_images (no local model takes them).
	References int
	// MaskAlpha reads the mask as OpenAI's edits do: where it is fully
	// transparent is repainted (openAIMask).
	MaskAlpha bool
	// OutputFormat is png (default) or jpeg, Quality the JPEG quality
	// (output_compression, default 100); Background is OpenAI's
	// background option (the pipelines make opaque pictures).
	OutputFormat, Background string
	Quality                  int
}

// needsImage are the operations that work on a picture.
func needsImage(op string) bool {
	switch op {
	case engine.OpImg2Img, engine.OpInpaint, engine.OpOutpaint, engine.OpVariations, engine.OpEdit, engine.OpLayers, engine.OpRemoveBackground:
		return true
	}
	return false
}

// parseLocalImages checks the fields only local pipelines read, naming
// each bad one, and gathers them; w x h is the parsed size.
func parseLocalImages(in *imageRequest, w, h int) (localImages, error) {
	l := localImages{Image: in.Image, Mask: in.Mask, ControlImage: in.ControlImage, Strength: in.Strength,
		ControlScale: in.ControlScale, GuidanceScale: in.GuidanceScale, ImageGuidanceScale: in.ImageGuidanceScale,
		ControlType: in.ControlType}
	if in.Size != "" {
		l.Width, l.Height = w, h
	}
	switch {
	case in.Operation != "":
		l.Op = in.Operation
	case in.Mask != nil:
		l.Op = engine.OpInpaint
	case in.Image != nil:
		l.Op = engine.OpImg2Img
	}
	if needsImage(in.Operation) && (in.Image == nil || *in.Image == "") {
		return l, apierr.BadRequest(apierr.CodeMissingParam, "image", fmt.Sprintf("Operation '%s' needs an image (base64 or a data: URL).", in.Operation))
	}
	if l.Op == engine.OpInpaint && (in.Mask == nil || *in.Mask == "") {
		return l, apierr.BadRequest(apierr.CodeMissingParam, "mask", "Operation 'inpaint' needs a mask (white areas are repainted).")
	}
	if in.Mask != nil && in.Image == nil {
		return l, apierr.BadRequest(apierr.CodeMissingParam, "image", "A mask is used with an image; you must provide the image.")
	}
	if in.OutpaintPercent != nil {
		if p := *in.OutpaintPercent; !(p > 0 && p <= engine.MaxOutpaintPercent) {
			return l, apierr.BadRequest(apierr.CodeInvalidValue, "outpaint_percent", fmt.Sprintf("'outpaint_percent' must be above 0 and at most %d (percent of each side).", engine.MaxOutpaintPercent))
		}
		l.OutpaintPercent = *in.OutpaintPercent
	}
	if in.ControlScale != nil && (*in.ControlScale < 0 || *in.ControlScale > engine.MaxControlScale) {
		return l, apierr.BadRequest(apierr.CodeInvalidValue, "control_scale", fmt.Sprintf("'control_scale' must be between 0 and %d.", engine.MaxControlScale))
	}
	if in.LayerCount != nil {
		if *in.LayerCount > engine.MaxLayerCount {
			return l, apierr.BadRequest(apierr.CodeInvalidValue, "layer_count", fmt.Sprintf("'layer_count' must be between 1 and %d.", engine.MaxLayerCount))
		}
		l.LayerCount = *in.LayerCount
	}
	if in.Steps != nil {
		if *in.Steps < 1 || *in.Steps > maxImageSteps {
			return l, apierr.BadRequest(apierr.CodeInvalidValue, "num_inference_steps", fmt.Sprintf("'num_inference_steps' must be between 1 and %d.", maxImageSteps))
		}
		l.Steps = *in.Steps
	}
	for _, g := range []struct {
		name string
		v    *float64
	}{{"guidance_scale", in.GuidanceScale}, {"image_guidance_scale", in.ImageGuidanceScale}} {
		if g.v != nil && (*g.v < 0 || *g.v > maxImageGuidance) {
			return l, apierr.BadRequest(apierr.CodeInvalidValue, g.name, fmt.Sprintf("'%s' must be between 0 and %d.", g.name, maxImageGuidance))
		}
	}
	if in.NegativePrompt != nil {
		if utf8.RuneCountInString(*in.NegativePrompt) > MaxImagePrompt {
			return l, apierr.BadRequest(apierr.CodeInvalidValue, "negative_prompt", fmt.Sprintf("The negative prompt is longer than %d characters.", MaxImagePrompt))
		}
		l.NegativePrompt = *in.NegativePrompt
	}
	if len(in.ReferenceImages) > 0 && string(in.ReferenceImages) != "null" {
		var refs []json.RawMessage
		if err := json.Unmarshal(in.ReferenceImages, &refs); err != nil {
			return l, apierr.BadRequest(apierr.CodeInvalidType, "reference_images", "'reference_images' must be an array of base64 images.")
		}
		l.References = len(refs)
	}
	l.SafetyCheck = in.SafetyCheck != nil && *in.SafetyCheck
	l.OutputFormat, l.Background, l.Quality = in.OutputFormat, in.Background, 100
	if in.OutputCompression != nil {
		if q := *in.OutputCompression; q < 0 || q > 100 {
			return l, apierr.BadRequest(apierr.CodeInvalidValue, "output_compression", "'output_compression' must be between 0 and 100.")
		}
		l.Quality = max(*in.OutputCompression, 1)
	}
	return l, nil
}

// ImageGater is implemented by a Backend that bounds the image work its
// node runs (spec Limits rule 4); without it image jobs are not gated.
type ImageGater interface {
	// ImageGate returns the node's gate (the same one on every call).
	ImageGate() *ImageGate
}

// ImageGate bounds the image jobs a node runs at once and how many may
// wait for a turn; a job beyond both is refused with 503 and Retry-After.
type ImageGate struct {
	slots    chan struct{}
	maxQueue int
	mu       sync.Mutex
	queued   int
	// avg is a moving average of job durations, for Retry-After.
	avg time.Duration
	// onChange, when set, hears every change of running+queued jobs (the
	// node gossips it so image work goes to the least-queued holder).
	onChange func(depth int)
}

// OnChange sets the function told the gate's depth (jobs running plus
// waiting) after every change; set it before the gate is used.
func (g *ImageGate) OnChange(f func(depth int)) { g.onChange = f }

// changed reports the current depth to onChange.
func (g *ImageGate) changed() {
	if g.onChange != nil {
		r, q := g.Depth()
		g.onChange(r + q)
	}
}

// NewImageGate makes a gate for concurrency jobs at once (at least 1) and
// queue waiting ones (0: none wait).
func NewImageGate(concurrency, queue int) *ImageGate {
	return &ImageGate{slots: make(chan struct{}, max(concurrency, 1)), maxQueue: max(queue, 0)}
}

// Depth returns the jobs running and waiting now (the waiting count is what
// the node gossips so the mesh sends image work to the least-queued
// holder).
func (g *ImageGate) Depth() (running, queued int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.slots), g.queued
}

// Acquire takes a turn, waiting in the queue while ctx allows; it returns
// the release function, or a 503 server_overloaded with Retry-After when
// the queue is full (or ctx's error when the caller left while waiting).
func (g *ImageGate) Acquire(ctx context.Context) (func(), error) {
	g.mu.Lock()
	select {
	case g.slots <- struct{}{}:
		g.mu.Unlock()
		g.changed()
		return g.releaser(), nil
	default:
	}
	if g.queued >= g.maxQueue {
		retry := g.retryAfterLocked()
		g.mu.Unlock()
		e := apierr.New(http.StatusServiceUnavailable, apierr.TypeServer, apierr.CodeOverloaded, "", "Image generation is busy on this server; retry later.")
		e.RetryAfter = retry
		return nil, e
	}
	g.queued++
	g.mu.Unlock()
	g.changed()
	defer func() {
		g.mu.Lock()
		g.queued--
		g.mu.Unlock()
		g.changed()
	}()
	select {
	case g.slots <- struct{}{}:
		return g.releaser(), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// releaser frees the slot and folds the job's duration into the average.
func (g *ImageGate) releaser() func() {
	start := time.Now()
	var once sync.Once
	return func() {
		once.Do(func() {
			d := time.Since(start)
			g.mu.Lock()
			if g.avg == 0 {
				g.avg = d
			} else {
				g.avg = (3*g.avg + d) / 4
			}
			g.mu.Unlock()
			<-g.slots
			g.changed()
		})
	}
}

// retryAfterLocked estimates the seconds until a queue place frees: the
// jobs ahead times the average job, per slot, at least 1.
func (g *ImageGate) retryAfterLocked() int {
	ahead := time.Duration(g.queued + 1)
	s := int(math.Ceil((g.avg * ahead / time.Duration(cap(g.slots))).Seconds()))
	return max(s, 1)
}

// imagesLocal runs a request on a local pipeline: the engine says whether
// it can (400 naming the field with the reason), the node's gate admits
// it (503 with Retry-After beyond the queue), the pictures are decoded
// under the image budget, and the results come back as b64_json PNGs, with
// safety_filtered counting the images the safety checker dropped when it
// ran.
func (s *Server) imagesLocal(w http.ResponseWriter, r *http.Request, p *parsedImages, op engine.ImageOperator) {
	l := p.Local
	if err := op.Supports(l.Op, l.ControlType, l.SafetyCheck); err != nil {
		var ie *engine.InputError
		if errors.As(err, &ie) && ie.Param == "operation" && p.OperationParam != "" && p.OperationParam != "control_image" && p.OperationParam != "safety_check" {
			err = &engine.InputError{Param: p.OperationParam, Msg: ie.Msg}
		}
		writeErr(w, err)
		return
	}
	if l.References > 0 {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "reference_images", fmt.Sprintf("Model %s takes no reference images.", op.ID())))
		return
	}
	if err := checkLocalOutput(l, op.ID()); err != nil {
		writeErr(w, err)
		return
	}
	// The work the request asks is checked before it waits for a turn;
	// an operation that keeps its picture's size is checked once the
	// picture's header is read (imageJobWork below).
	var asked imageAsk
	if l.Width > 0 {
		asked.w, asked.h = l.Width, l.Height
	} else if l.Op == engine.OpGenerate {
		fmt.Sscanf(p.Req.Size, "%dx%d", &asked.w, &asked.h)
	}
	steps := l.Steps
	if steps == 0 {
		steps = op.DefaultSteps()
	}
	if l.Op == engine.OpRemoveBackground || l.Op == engine.OpLayers {
		steps = 1 // no denoising: a segmentation (and fills) per picture
	}
	if asked.w > 0 {
		release, ok := s.admitImageWork(w, r, "size", asked.w, asked.h, steps, p.Req.N)
		if !ok {
			return
		}
		defer release()
	}
	if g, ok := s.opt.Backend.(ImageGater); ok && g.ImageGate() != nil {
		release, err := g.ImageGate().Acquire(r.Context())
		if err != nil {
			writeErr(w, err)
			return
		}
		defer release()
	}
	job := engine.ImageJob{Operation: l.Op, Prompt: p.Req.Prompt, NegativePrompt: l.NegativePrompt, N: p.Req.N,
		Width: l.Width, Height: l.Height, Seed: p.Req.Seed, Strength: l.Strength, OutpaintPercent: l.OutpaintPercent,
		ControlType: l.ControlType, ControlScale: l.ControlScale, LayerCount: l.LayerCount, SafetyCheck: l.SafetyCheck,
		Steps: l.Steps, GuidanceScale: l.GuidanceScale, ImageGuidanceScale: l.ImageGuidanceScale}
	if job.Width == 0 && l.Op == engine.OpGenerate {
		fmt.Sscanf(p.Req.Size, "%dx%d", &job.Width, &job.Height)
	}
	for _, f := range []struct {
		name string
		b64  *string
		dst  *image.Image
	}{{"image", l.Image, &job.Image}, {"mask", l.Mask, &job.Mask}, {"control_image", l.ControlImage, &job.ControlImage}} {
		if f.b64 == nil {
			continue
		}
		img, release, err := s.decodeImagePicture(r, f.name, *f.b64, 1)
		if err != nil {
			var ie *engine.InputError
			if errors.As(err, &ie) {
				err = &engine.InputError{Param: f.name, Msg: ie.Msg}
			}
			writeErr(w, err)
			return
		}
		defer release()
		if f.name == "mask" && l.MaskAlpha {
			img = openAIMask(img)
		}
		*f.dst = img
	}
	if asked.w == 0 && job.Image != nil {
		// The result keeps the picture's size (outpainting adds its
		// margins).
		b := job.Image.Bounds()
		ow, oh := b.Dx(), b.Dy()
		if l.Op == engine.OpOutpaint {
			pct := l.OutpaintPercent
			if pct == 0 {
				pct = engine.DefaultOutpaintPercent
			}
			ow += 2 * int(math.Round(float64(ow)*pct/100))
			oh += 2 * int(math.Round(float64(oh)*pct/100))
		}
		release, ok := s.admitImageWork(w, r, "image", ow, oh, steps, p.Req.N)
		if !ok {
			return
		}
		defer release()
	}
	if l.Op == engine.OpLayers || l.Op == engine.OpRemoveBackground {
		// The node's background remover, for pipelines without their own.
		if eng, _, err := s.opt.Backend.TaskEngine(r.Context(), engine.TaskBackgroundRemoval, ""); err == nil {
			job.Segmenter, _ = eng.(engine.BackgroundRemover)
		}
	}
	res, err := op.RunImages(r.Context(), job)
	if err != nil {
		writeErr(w, err)
		return
	}
	data := make([]imageObject, 0, len(res.Images))
	for _, im := range res.Images {
		var buf bytes.Buffer
		var err error
		if l.OutputFormat == "jpeg" {
			err = jpeg.Encode(&buf, im, &jpeg.Options{Quality: l.Quality})
		} else {
			err = (&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(&buf, im)
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		data = append(data, imageObject{B64JSON: base64.StdEncoding.EncodeToString(buf.Bytes())})
	}
	reportUsage(w, 0, int64(len(data))) // output images
	body := map[string]any{"created": s.opt.Clock().Unix(), "data": data}
	if l.SafetyCheck {
		body["safety_filtered"] = res.Filtered
	}
	writeJSON(w, http.StatusOK, body)
}

// checkLocalOutput refuses the output options a local pipeline cannot
// honour, naming the field: it writes png or jpeg, and its pictures are
// opaque but for the remove-background and layers operations.
func checkLocalOutput(l localImages, model string) error {
	switch l.OutputFormat {
	case "", "png", "jpeg":
	default:
		return apierr.BadRequest(apierr.CodeInvalidValue, "output_format", fmt.Sprintf("Model %s writes png or jpeg, not '%s'.", model, l.OutputFormat))
	}
	switch l.Background {
	case "", "auto", "opaque":
	case "transparent":
		if l.Op != engine.OpRemoveBackground && l.Op != engine.OpLayers {
			return apierr.BadRequest(apierr.CodeInvalidValue, "background", fmt.Sprintf("Model %s makes opaque pictures; operation remove-background cuts one out.", model))
		}
	default:
		return apierr.BadRequest(apierr.CodeInvalidValue, "background", fmt.Sprintf("'%s' is not one of ['transparent', 'opaque', 'auto'].", l.Background))
	}
	if l.OutputFormat == "jpeg" && (l.Background == "transparent" || l.Op == engine.OpRemoveBackground || l.Op == engine.OpLayers) {
		return apierr.BadRequest(apierr.CodeInvalidValue, "output_format", "Pictures with transparency need output_format png.")
	}
	return nil
}

// removeBackgroundModel serves operation "remove-background" when the
// request names a background-removal model (ISNet) rather than a
// diffusion pipeline; it reports whether it answered.
func (s *Server) removeBackgroundModel(w http.ResponseWriter, r *http.Request, p *parsedImages) bool {
	eng, _, err := s.opt.Backend.TaskEngine(r.Context(), engine.TaskBackgroundRemoval, p.Model)
	if err != nil {
		return false
	}
	rm, ok := eng.(engine.BackgroundRemover)
	if !ok {
		return false
	}
	img, release, err := s.decodeImagePicture(r, "image", *p.Local.Image, 1)
	if err != nil {
		writeErr(w, err)
		return true
	}
	defer release()
	b := img.Bounds()
	done, ok := s.admitImageWork(w, r, "image", b.Dx(), b.Dy(), 1, 1)
	if !ok {
		return true
	}
	defer done()
	out, err := rm.RemoveBackground(r.Context(), img)
	if err != nil {
		writeErr(w, err)
		return true
	}
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(&buf, out); err != nil {
		writeErr(w, err)
		return true
	}
	reportUsage(w, 0, 1)
	writeJSON(w, http.StatusOK, map[string]any{"created": s.opt.Clock().Unix(), "data": []imageObject{{B64JSON: base64.StdEncoding.EncodeToString(buf.Bytes())}}})
	return true
}

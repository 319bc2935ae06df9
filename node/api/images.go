package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"unicode/utf8"

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
	User            string          `json:"user"`
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
}

// parseImages validates an image generation body against the spec's
// ranges. Which operations a model supports is checked in the handler.
func parseImages(body []byte) (*parsedImages, error) {
	var in imageRequest
	if err := decodeStrict(body, &in); err != nil {
		return nil, err
	}
	if in.Model == "" {
		return nil, BadRequest(CodeMissingParam, "model", "You must provide a model parameter.")
	}
	if in.Prompt == nil || *in.Prompt == "" {
		return nil, BadRequest(CodeMissingParam, "prompt", "You must provide a prompt.")
	}
	if utf8.RuneCountInString(*in.Prompt) > MaxImagePrompt {
		return nil, BadRequest(CodeInvalidValue, "prompt", fmt.Sprintf("The prompt is longer than %d characters.", MaxImagePrompt))
	}
	n := 1
	if in.N != nil {
		n = *in.N
	}
	if n < 1 || n > MaxImagesPerRequest {
		return nil, BadRequest(CodeInvalidValue, "n", fmt.Sprintf("'n' must be between 1 and %d.", MaxImagesPerRequest))
	}
	size := in.Size
	if size == "" {
		size = defaultImageSize
	}
	var w, h int
	if k, err := fmt.Sscanf(size, "%dx%d", &w, &h); err != nil || k != 2 || fmt.Sprintf("%dx%d", w, h) != size ||
		w < minImageSide || h < minImageSide || w > maxImageSide || h > maxImageSide {
		return nil, BadRequest(CodeInvalidValue, "size", fmt.Sprintf("'size' must be WIDTHxHEIGHT with %d to %d pixels per side.", minImageSide, maxImageSide))
	}
	switch in.ResponseFormat {
	case "", "b64_json":
	case "url":
		return nil, BadRequest(CodeInvalidValue, "response_format", "URLs are not supported; images are returned as b64_json.")
	default:
		return nil, BadRequest(CodeInvalidValue, "response_format", fmt.Sprintf("'%s' is not one of ['b64_json'].", in.ResponseFormat))
	}
	if in.Strength != nil && (*in.Strength < 0 || *in.Strength > 1) {
		return nil, BadRequest(CodeInvalidValue, "strength", "'strength' must be between 0 and 1.")
	}
	if in.UpscaleFactor != nil && *in.UpscaleFactor != 2 && *in.UpscaleFactor != 4 {
		return nil, BadRequest(CodeInvalidValue, "upscale_factor", "'upscale_factor' must be 2 or 4.")
	}
	if in.ControlType != "" && in.ControlType != "canny" && in.ControlType != "depth" {
		return nil, BadRequest(CodeInvalidValue, "control_type", fmt.Sprintf("'%s' is not one of ['canny', 'depth'].", in.ControlType))
	}
	if in.LayerCount != nil && *in.LayerCount < 1 {
		return nil, BadRequest(CodeInvalidValue, "layer_count", "'layer_count' must be at least 1.")
	}
	for _, o := range []struct{ name, v string }{
		{"quality", in.Quality}, {"style", in.Style}, {"background", in.Background}, {"output_format", in.OutputFormat}, {"user", in.User},
	} {
		if len(o.v) > maxImageOption {
			return nil, BadRequest(CodeInvalidValue, o.name, fmt.Sprintf("'%s' is longer than %d characters.", o.name, maxImageOption))
		}
	}
	p := &parsedImages{Model: in.Model, Req: engine.ImageRequest{
		Prompt: *in.Prompt, N: n, Size: size, Seed: in.Seed, ResponseFormat: "b64_json",
		Quality: in.Quality, Style: in.Style, Background: in.Background, OutputFormat: in.OutputFormat, User: in.User,
	}}
	// What the request asks beyond text to image, named by the field that
	// asks for it.
	switch {
	case in.Operation != "":
		if !slices.Contains(imageOperations, in.Operation) {
			return nil, BadRequest(CodeInvalidValue, "operation", fmt.Sprintf("'%s' is not one of %q.", in.Operation, imageOperations))
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
// image generation engine (an upstream provider's image model; no local
// runtime generates images). A model of another task is a 400
// model_not_supported.
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
	m, gen, ok := modelEngine(s, w, r, p.Model, s.opt.Backend.ImageGenerator)
	if !ok {
		return
	}
	if p.Operation != "" {
		// Provider image models make images from text only.
		WriteError(w, BadRequest(CodeInvalidValue, p.OperationParam, fmt.Sprintf("Model %s does not support %s; it makes images from a text prompt only.", m.ID, p.Operation)))
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

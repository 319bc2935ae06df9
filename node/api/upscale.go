package api

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image/png"
	"net/http"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
)

// defaultUpscaleFactor is the factor of an upscale request without
// upscale_factor.
const defaultUpscaleFactor = 2

// upscaleRequest is a validated POST /v1/images/generations body with
// operation "upscale": {"model", "operation": "upscale", "image",
// "upscale_factor"}.
type upscaleRequest struct {
	Model  string
	Image  string
	Factor int
}

// parseImagesOrUpscale parses an image generation body: operation
// "upscale" with parseUpscale (no prompt; parsedImages.Upscale set), any
// other with parseImageBody, where variations, remove-background and
// layers may come without a prompt.
func parseImagesOrUpscale(body []byte) (*parsedImages, error) {
	var in imageRequest
	if err := decodeStrict(body, &in); err != nil {
		return nil, err
	}
	if in.Operation != "upscale" {
		return parseImageBody(body, true)
	}
	if in.Model == "" {
		return nil, apierr.BadRequest(apierr.CodeMissingParam, "model", "You must provide a model parameter.")
	}
	u, err := parseUpscale(&in)
	if err != nil {
		return nil, err
	}
	return &parsedImages{Model: in.Model, Operation: in.Operation, OperationParam: "operation", Upscale: u}, nil
}

// parseUpscale checks the fields an upscale needs: image (base64 or a data:
// URL) and upscale_factor 2 or 4 (default 2). It takes no prompt; the
// text-to-image options are refused naming their field.
func parseUpscale(in *imageRequest) (*upscaleRequest, error) {
	if in.Image == nil || *in.Image == "" {
		return nil, apierr.BadRequest(apierr.CodeMissingParam, "image", "You must provide an image to upscale (base64 or a data: URL).")
	}
	f := defaultUpscaleFactor
	if in.UpscaleFactor != nil {
		f = *in.UpscaleFactor
	}
	if f != 2 && f != 4 {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "upscale_factor", "'upscale_factor' must be 2 or 4.")
	}
	switch in.ResponseFormat {
	case "", "b64_json":
	default:
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "response_format", fmt.Sprintf("'%s' is not one of ['b64_json'].", in.ResponseFormat))
	}
	for _, o := range []struct {
		name string
		set  bool
	}{
		{"mask", in.Mask != nil}, {"strength", in.Strength != nil}, {"control_image", in.ControlImage != nil},
		{"n", in.N != nil && *in.N != 1}, {"layer_count", in.LayerCount != nil}, {"outpaint_percent", in.OutpaintPercent != nil},
	} {
		if o.set {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, o.name, fmt.Sprintf("'%s' does not apply to operation 'upscale'.", o.name))
		}
	}
	return &upscaleRequest{Model: in.Model, Image: *in.Image, Factor: f}, nil
}

// imagesUpscale answers an upscale request like an image generation: one
// b64_json PNG in data. The model must serve engine.TaskImageUpscale (a
// model of another task is a 400 model_not_supported on "model"); the
// engine's InputErrors (factor it lacks, image too large) are 400s naming
// their field.
func (s *Server) imagesUpscale(w http.ResponseWriter, r *http.Request, req *upscaleRequest) {
	eng, _, ok := s.visionEngine(w, r, engine.TaskImageUpscale, req.Model)
	if !ok {
		return
	}
	up, isUp := eng.(engine.Upscaler)
	if !isUp {
		apierr.Write(w, apierr.BadRequest(apierr.CodeModelNotSupported, "model", fmt.Sprintf("Model %s does not upscale images.", req.Model)))
		return
	}
	// Upscaling is image work like generation: it takes a turn of the
	// node's image gate (and counts in the gossiped queue depth).
	if g, ok := s.opt.Backend.(ImageGater); ok && g.ImageGate() != nil {
		done, err := g.ImageGate().Acquire(r.Context())
		if err != nil {
			writeErr(w, err)
			return
		}
		defer done()
	}
	// The picture's header is checked before it is decoded: at most
	// --image-max-pixels in, at most 4096 pixels per side out.
	img, release, err := s.decodeImagePicture(r, "image", req.Image, req.Factor)
	if err != nil {
		writeErr(w, err)
		return
	}
	defer release()
	// Its work: the output pixels, at one step.
	b := img.Bounds()
	work, ok := s.admitWork(w, r, workImage, "image", imageWork(b.Dx()*req.Factor, b.Dy()*req.Factor, 1, 1),
		fmt.Sprintf("%dx%d upscaled %dx", b.Dx(), b.Dy(), req.Factor))
	if !ok {
		return
	}
	defer work()
	out, err := up.Upscale(r.Context(), img, req.Factor)
	if err != nil {
		writeErr(w, err)
		return
	}
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(&buf, out); err != nil {
		writeErr(w, err)
		return
	}
	data := []imageObject{{B64JSON: base64.StdEncoding.EncodeToString(buf.Bytes())}}
	reportUsage(w, 0, int64(len(data))) // output images
	writeJSON(w, http.StatusOK, map[string]any{"created": s.opt.Clock().Unix(), "data": data})
}

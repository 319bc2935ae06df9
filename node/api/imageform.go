package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"io"
	"math"
	"mime/multipart"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
)

// OpenAI's image edit and variation calls, POST /v1/images/edits and
// /v1/images/variations, are multipart forms with the pictures as file
// parts. They are served by the same operations as the JSON body of
// /v1/images/generations: the form is read into an imageRequest (the
// pictures base64, as that body carries them) and validated by
// validateImageRequest, so both shapes refuse the same bad values.

// maxFormImages is the most pictures one edit form may carry (OpenAI's 16).
const maxFormImages = 16

// formFile is one file part of a form.
type formFile struct {
	data        []byte
	name, ctype string
}

// imageForm is a parsed multipart image form: its text fields, the
// pictures (OpenAI's SDKs send one as "image", several as "image[]") and
// the mask.
type imageForm struct {
	fields map[string][]string
	images []formFile
	mask   *formFile
}

// parseImageForm reads an image form from body: text fields of at most
// 8 KiB each, up to maxFormImages pictures and one mask of at most
// MaxImageBytes each. A file part under any other name is refused.
func parseImageForm(body []byte, contentType string) (*imageForm, error) {
	boundary, err := multipartBoundary(contentType)
	if err != nil {
		return nil, err
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	f := &imageForm{fields: map[string][]string{}}
	for n := 0; ; n++ {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "", "Could not parse the multipart form: "+err.Error())
		}
		if n >= maxFormParts {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "", "The form has too many parts.")
		}
		name := p.FormName()
		switch {
		case name == "":
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "", "A form part has no name.")
		case name == "image" || name == "image[]" || name == "mask":
			param := strings.TrimSuffix(name, "[]")
			data, err := io.ReadAll(io.LimitReader(p, MaxImageBytes+1))
			if err != nil {
				return nil, apierr.BadRequest(apierr.CodeInvalidValue, param, "Could not read the "+param+" part.")
			}
			if len(data) > MaxImageBytes {
				return nil, apierr.New(http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, apierr.CodeTooLarge, param,
					fmt.Sprintf("The %s file is larger than %d MiB.", param, MaxImageBytes>>20))
			}
			if len(data) == 0 {
				return nil, apierr.BadRequest(apierr.CodeInvalidValue, param, "The "+param+" file is empty.")
			}
			file := formFile{data: data, name: p.FileName(), ctype: p.Header.Get("Content-Type")}
			if name == "mask" {
				if f.mask != nil {
					return nil, apierr.BadRequest(apierr.CodeInvalidValue, "mask", "Send one mask.")
				}
				f.mask = &file
				continue
			}
			if len(f.images) == maxFormImages {
				return nil, apierr.BadRequest(apierr.CodeInvalidValue, "image", fmt.Sprintf("Send at most %d images.", maxFormImages))
			}
			f.images = append(f.images, file)
		case p.FileName() != "":
			return nil, apierr.BadRequest(apierr.CodeUnknownParam, name, fmt.Sprintf("Unrecognized file part supplied: %s", name))
		default:
			v, err := io.ReadAll(io.LimitReader(p, maxFormField+1))
			if err != nil || len(v) > maxFormField {
				return nil, apierr.BadRequest(apierr.CodeInvalidValue, name, "The "+name+" field is longer than 8 KiB.")
			}
			f.fields[name] = append(f.fields[name], string(v))
		}
	}
	return f, nil
}

// Form fields of the two routes. OpenAI's are followed by the local
// pipelines' own (as on /v1/images/generations).
var (
	editFields = []string{"model", "prompt", "n", "size", "response_format", "background", "output_format",
		"output_compression", "quality", "input_fidelity", "user", "safety_identifier", "stream",
		"seed", "strength", "negative_prompt", "num_inference_steps", "guidance_scale", "image_guidance_scale"}
	variationFields = []string{"model", "n", "size", "response_format", "user",
		"prompt", "seed", "strength", "negative_prompt", "num_inference_steps", "guidance_scale"}
)

// parseImageEdit validates a POST /v1/images/edits form: the pictures and
// the mask with OpenAI's fields. With a mask it is an inpaint (imagesForm
// reads the mask OpenAI's way: transparent is repainted); without one an
// img2img, which imagesForm makes an instruction edit on a model that
// does those.
func parseImageEdit(body []byte, contentType string) (*parsedImages, error) {
	return parseImageFormRequest(body, contentType, false)
}

// parseImageVariation validates a POST /v1/images/variations form: one
// picture, no prompt needed; operation variations.
func parseImageVariation(body []byte, contentType string) (*parsedImages, error) {
	return parseImageFormRequest(body, contentType, true)
}

func parseImageFormRequest(body []byte, contentType string, variation bool) (*parsedImages, error) {
	f, err := parseImageForm(body, contentType)
	if err != nil {
		return nil, err
	}
	allowed := editFields
	if variation {
		allowed = variationFields
	}
	for name, v := range f.fields {
		if !slices.Contains(allowed, name) {
			return nil, apierr.BadRequest(apierr.CodeUnknownParam, name, fmt.Sprintf("Unrecognized request argument supplied: %s", name))
		}
		if len(v) > 1 {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, name, fmt.Sprintf("%s is given more than once.", name))
		}
	}
	switch {
	case len(f.images) == 0:
		return nil, apierr.BadRequest(apierr.CodeMissingParam, "image", "You must provide an image (a multipart file part named image or image[]).")
	case variation && len(f.images) > 1:
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "image", "A variation is made of one image.")
	case variation && f.mask != nil:
		return nil, apierr.BadRequest(apierr.CodeUnknownParam, "mask", "Unrecognized request argument supplied: mask")
	}
	for i, img := range append(slices.Clone(f.images), derefFile(f.mask)...) {
		param := "image"
		if i == len(f.images) {
			param = "mask"
		}
		if ct := img.ctype; ct != "" && ct != "application/octet-stream" && !strings.HasPrefix(ct, "image/") {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, param, fmt.Sprintf("The %s file's content type %s is not an image.", param, ct))
		}
	}
	val := func(name string) string {
		if v := f.fields[name]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	in := imageRequest{Model: strings.TrimSpace(val("model")), Size: strings.TrimSpace(val("size")),
		ResponseFormat: strings.TrimSpace(val("response_format")), Background: strings.TrimSpace(val("background")),
		OutputFormat: strings.TrimSpace(val("output_format")), Quality: strings.TrimSpace(val("quality")), User: val("user")}
	if in.Size == "auto" {
		in.Size = "" // the picture's own size
	}
	if v, ok := f.fields["prompt"]; ok {
		in.Prompt = &v[0]
	}
	if v, ok := f.fields["negative_prompt"]; ok {
		in.NegativePrompt = &v[0]
	}
	for _, n := range []struct {
		name string
		dst  **int
	}{{"n", &in.N}, {"num_inference_steps", &in.Steps}, {"output_compression", &in.OutputCompression}} {
		if v, ok := f.fields[n.name]; ok {
			k, err := strconv.Atoi(strings.TrimSpace(v[0]))
			if err != nil {
				return nil, apierr.BadRequest(apierr.CodeInvalidType, n.name, fmt.Sprintf("Invalid type for '%s': expected an integer.", n.name))
			}
			*n.dst = &k
		}
	}
	if v, ok := f.fields["seed"]; ok {
		k, err := strconv.ParseInt(strings.TrimSpace(v[0]), 10, 64)
		if err != nil {
			return nil, apierr.BadRequest(apierr.CodeInvalidType, "seed", "Invalid type for 'seed': expected an integer.")
		}
		in.Seed = &k
	}
	for _, x := range []struct {
		name string
		dst  **float64
	}{{"strength", &in.Strength}, {"guidance_scale", &in.GuidanceScale}, {"image_guidance_scale", &in.ImageGuidanceScale}} {
		if v, ok := f.fields[x.name]; ok {
			k, err := strconv.ParseFloat(strings.TrimSpace(v[0]), 64)
			if err != nil || math.IsNaN(k) || math.IsInf(k, 0) {
				return nil, apierr.BadRequest(apierr.CodeInvalidType, x.name, fmt.Sprintf("Invalid type for '%s': expected a number.", x.name))
			}
			*x.dst = &k
		}
	}
	if v := strings.TrimSpace(val("stream")); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, apierr.BadRequest(apierr.CodeInvalidType, "stream", "Invalid type for 'stream': expected a boolean.")
		}
		if b {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "stream", "Streamed partial images are not supported; leave stream out or false.")
		}
	}
	for _, o := range []struct{ name, v string }{
		{"input_fidelity", val("input_fidelity")}, {"safety_identifier", val("safety_identifier")},
	} {
		if len(o.v) > maxImageOption {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, o.name, fmt.Sprintf("'%s' is longer than %d characters.", o.name, maxImageOption))
		}
	}
	if v := val("input_fidelity"); v != "" && v != "high" && v != "low" {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "input_fidelity", fmt.Sprintf("'%s' is not one of ['high', 'low'].", v))
	}
	in.Image = base64Of(f.images[0].data)
	if len(f.images) > 1 {
		refs := make([]string, 0, len(f.images)-1)
		for _, im := range f.images[1:] {
			refs = append(refs, *base64Of(im.data))
		}
		in.ReferenceImages, _ = json.Marshal(refs)
	}
	if f.mask != nil {
		in.Mask = base64Of(f.mask.data)
	}
	if variation {
		in.Operation = engine.OpVariations
	}
	p, err := validateImageRequest(&in, true)
	if err != nil {
		return nil, err
	}
	p.Local.MaskAlpha = f.mask != nil
	return p, nil
}

func derefFile(f *formFile) []formFile {
	if f == nil {
		return nil
	}
	return []formFile{*f}
}

func base64Of(b []byte) *string {
	s := base64.StdEncoding.EncodeToString(b)
	return &s
}

// imagesEdits serves POST /v1/images/edits (OpenAI's multipart shape).
func (s *Server) imagesEdits(w http.ResponseWriter, r *http.Request) {
	s.imagesForm(w, r, parseImageEdit)
}

// imagesVariations serves POST /v1/images/variations (OpenAI's multipart
// shape).
func (s *Server) imagesVariations(w http.ResponseWriter, r *http.Request) {
	s.imagesForm(w, r, parseImageVariation)
}

// imagesForm serves an image form on the model's local pipeline, as
// imagesGenerations serves the JSON body. An edit without a mask runs as
// an instruction edit on a model that does those (InstructPix2Pix), as
// img2img on the others. Provider image models make images from text
// only, so they refuse both forms.
func (s *Server) imagesForm(w http.ResponseWriter, r *http.Request, parse func([]byte, string) (*parsedImages, error)) {
	body, err := readBody(r, MaxImageBody)
	if err != nil {
		writeErr(w, err)
		return
	}
	p, err := parse(body, r.Header.Get("Content-Type"))
	if err != nil {
		writeErr(w, err)
		return
	}
	m, gen, ok := modelEngine(s, w, r, p.Model, s.opt.Backend.ImageGenerator)
	if !ok {
		return
	}
	op, local := gen.(engine.ImageOperator)
	if !local {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "image", fmt.Sprintf("Model %s does not support %s; it makes images from a text prompt only.", m.ID, p.Operation)))
		return
	}
	if p.Local.References > 0 {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "image", fmt.Sprintf("Model %s edits one image; send one.", m.ID)))
		return
	}
	if p.Local.Op == engine.OpImg2Img && op.Supports(engine.OpEdit, "", p.Local.SafetyCheck) == nil {
		p.Local.Op, p.Operation = engine.OpEdit, engine.OpEdit
	}
	s.imagesLocal(w, r, p, op)
}

// openAIMask reads a mask the way OpenAI's edits do when it has
// transparency: fully transparent pixels are the area to repaint. The
// engines take white as the area to repaint, so the result is white
// there and black elsewhere. A mask without any transparent pixel is
// returned as it is (white repainted, as on /v1/images/generations).
func openAIMask(m image.Image) image.Image {
	b := m.Bounds()
	transparent := false
	for y := b.Min.Y; y < b.Max.Y && !transparent; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if _, _, _, a := m.At(x, y).RGBA(); a == 0 {
				transparent = true
				break
			}
		}
	}
	if !transparent {
		return m
	}
	out := image.NewGray(image.Rect(0, 0, b.Dx(), b.Dy()))
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if _, _, _, a := m.At(x, y).RGBA(); a == 0 {
				out.SetGray(x-b.Min.X, y-b.Min.Y, color.Gray{Y: 0xff})
			}
		}
	}
	return out
}

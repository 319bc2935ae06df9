package upstream

import (
	"context"
	"errors"
	"net/http"

	"github.com/infermesh/infermesh/node/engine"
)

// imageEngine serves one provider image generation model.
type imageEngine struct{ providerModel }

var _ engine.ImageGenerator = (*imageEngine)(nil)

type wireImages struct {
	Created int64 `json:"created"`
	Data    []struct {
		B64JSON       string `json:"b64_json"`
		URL           string `json:"url"`
		RevisedPrompt string `json:"revised_prompt"`
	} `json:"data"`
}

// GenerateImages sends the request to the provider's /images/generations
// and returns its images. Options left empty are not sent, so the
// provider's defaults apply.
func (e *imageEngine) GenerateImages(ctx context.Context, req engine.ImageRequest) (engine.ImageResult, error) {
	body := map[string]any{"model": e.m.Model, "prompt": req.Prompt}
	if req.N > 0 {
		body["n"] = req.N
	}
	if req.Seed != nil {
		body["seed"] = *req.Seed
	}
	for k, v := range map[string]string{
		"size": req.Size, "quality": req.Quality, "style": req.Style, "response_format": req.ResponseFormat,
		"background": req.Background, "output_format": req.OutputFormat, "user": req.User,
	} {
		if v != "" {
			body[k] = v
		}
	}
	var out wireImages
	err := e.c.postJSON(ctx, "/images/generations", body, &out)
	var pe *engine.ProviderError
	if errors.As(err, &pe) && pe.Status == http.StatusBadRequest && pe.Param == "response_format" && body["response_format"] != nil {
		// Some image models return base64 only and refuse the parameter
		// (OpenAI's gpt-image-1 does); ask again without it.
		delete(body, "response_format")
		err = e.c.postJSON(ctx, "/images/generations", body, &out)
	}
	if err != nil {
		return engine.ImageResult{}, err
	}
	if len(out.Data) == 0 {
		return engine.ImageResult{}, e.c.badResponse("no images in the answer")
	}
	if req.N > 0 && len(out.Data) > req.N {
		return engine.ImageResult{}, e.c.badResponse("%d images for n=%d", len(out.Data), req.N)
	}
	res := engine.ImageResult{Created: out.Created}
	for i, d := range out.Data {
		if d.B64JSON == "" && d.URL == "" {
			return engine.ImageResult{}, e.c.badResponse("image %d has neither b64_json nor url", i)
		}
		if req.ResponseFormat == "b64_json" && d.B64JSON == "" {
			return engine.ImageResult{}, e.c.badResponse("image %d has no b64_json although it was asked for", i)
		}
		res.Images = append(res.Images, engine.GeneratedImage{B64JSON: d.B64JSON, URL: d.URL, RevisedPrompt: d.RevisedPrompt})
	}
	return res, nil
}

package upstream

import (
	"context"
	"math"

	"github.com/infermesh/infermesh/node/engine"
)

// embedEngine serves one provider embeddings model.
type embedEngine struct{ providerModel }

var _ engine.Embedder = (*embedEngine)(nil)

// MaxDimensions is the configured vector length, or the largest int32 when
// none is configured (the provider then checks "dimensions" itself).
func (e *embedEngine) MaxDimensions() int {
	if e.m.Dimensions > 0 {
		return e.m.Dimensions
	}
	return math.MaxInt32
}

// TruncatableDimensions reports whether "dimensions" may shorten vectors:
// as configured, or always when no length is configured.
func (e *embedEngine) TruncatableDimensions() bool {
	return e.m.Dimensions == 0 || e.m.TruncatableDimensions
}

type wireEmbeddings struct {
	Data []struct {
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	} `json:"data"`
	Usage *struct {
		PromptTokens int `json:"prompt_tokens"`
	} `json:"usage"`
}

// Embed sends the inputs to the provider's /embeddings and returns the
// vectors in input order.
func (e *embedEngine) Embed(ctx context.Context, req engine.EmbedRequest) (engine.EmbedResult, error) {
	body := map[string]any{"model": e.m.Model, "encoding_format": "float"}
	n := len(req.Texts)
	if req.Tokens != nil {
		body["input"], n = req.Tokens, len(req.Tokens)
	} else {
		body["input"] = req.Texts
	}
	if req.Dimensions > 0 {
		body["dimensions"] = req.Dimensions
	}
	var out wireEmbeddings
	if err := e.c.postJSON(ctx, "/embeddings", body, &out); err != nil {
		return engine.EmbedResult{}, err
	}
	if len(out.Data) != n {
		return engine.EmbedResult{}, e.c.badResponse("%d vectors for %d inputs", len(out.Data), n)
	}
	res := engine.EmbedResult{Vectors: make([][]float32, n)}
	for _, d := range out.Data {
		if d.Index < 0 || d.Index >= n || res.Vectors[d.Index] != nil {
			return engine.EmbedResult{}, e.c.badResponse("vector index %d is out of range or repeated", d.Index)
		}
		if len(d.Embedding) == 0 {
			return engine.EmbedResult{}, e.c.badResponse("vector %d is empty", d.Index)
		}
		res.Vectors[d.Index] = d.Embedding
	}
	if out.Usage != nil {
		res.PromptTokens = out.Usage.PromptTokens
	}
	return res, nil
}

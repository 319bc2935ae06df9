package api

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
)

// Embeddings request limits.
const (
	MaxEmbeddingInputs   = 2048
	MaxEmbeddingInputLen = 256 << 10 // bytes per string input
	MaxEmbeddingTokens   = 8192      // ids per token-array input
)

// embeddingsRequest is the OpenAI embeddings request.
type embeddingsRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format,omitempty"`
	Dimensions     *int            `json:"dimensions,omitempty"`
	User           string          `json:"user,omitempty"`
}

// parsedEmbeddings is a validated embeddings request.
type parsedEmbeddings struct {
	Model      string
	Texts      []string
	Tokens     [][]int64
	Base64     bool
	Dimensions int
}

// parseEmbeddings validates an embeddings body; every failure is a 400 that
// names its parameter.
func parseEmbeddings(body []byte) (*parsedEmbeddings, error) {
	var req embeddingsRequest
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	if req.Model == "" {
		return nil, apierr.BadRequest(apierr.CodeMissingParam, "model", "You must provide a model parameter.")
	}
	if len(req.Model) > 256 {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "model", "The model id is longer than 256 characters.")
	}
	if len(req.User) > 256 {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "user", "'user' is longer than 256 characters.")
	}
	p := &parsedEmbeddings{Model: req.Model}
	switch req.EncodingFormat {
	case "", "float":
	case "base64":
		p.Base64 = true
	default:
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "encoding_format", fmt.Sprintf("'%s' is not one of ['float', 'base64'] - 'encoding_format'", req.EncodingFormat))
	}
	if req.Dimensions != nil {
		if *req.Dimensions < 1 {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "dimensions", "'dimensions' must be at least 1.")
		}
		p.Dimensions = *req.Dimensions
	}
	if err := parseInput(req.Input, p); err != nil {
		return nil, err
	}
	return p, nil
}

// parseInput accepts a string, an array of strings, an array of token ids or
// an array of token-id arrays.
func parseInput(raw json.RawMessage, p *parsedEmbeddings) error {
	if len(raw) == 0 || string(raw) == "null" {
		return apierr.BadRequest(apierr.CodeMissingParam, "input", "You must provide an input parameter.")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		p.Texts = []string{one}
		return checkTexts(p.Texts)
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		if len(many) == 0 {
			return apierr.BadRequest(apierr.CodeInvalidValue, "input", "'input' must not be an empty array.")
		}
		p.Texts = many
		return checkTexts(p.Texts)
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		p.Tokens = [][]int64{ids}
		return checkTokens(p.Tokens)
	}
	var idss [][]int64
	if json.Unmarshal(raw, &idss) == nil {
		if len(idss) == 0 {
			return apierr.BadRequest(apierr.CodeInvalidValue, "input", "'input' must not be an empty array.")
		}
		p.Tokens = idss
		return checkTokens(p.Tokens)
	}
	return apierr.BadRequest(apierr.CodeInvalidType, "input", "'input' must be a string, an array of strings, an array of integers, or an array of integer arrays.")
}

func checkTexts(ts []string) error {
	if len(ts) > MaxEmbeddingInputs {
		return apierr.BadRequest(apierr.CodeInvalidValue, "input", fmt.Sprintf("'input' has %d items; at most %d are allowed.", len(ts), MaxEmbeddingInputs))
	}
	for i, t := range ts {
		if t == "" {
			return apierr.BadRequest(apierr.CodeInvalidValue, "input", fmt.Sprintf("'input[%d]' is an empty string.", i))
		}
		if len(t) > MaxEmbeddingInputLen {
			return apierr.BadRequest(apierr.CodeInvalidValue, "input", fmt.Sprintf("'input[%d]' is longer than %d bytes.", i, MaxEmbeddingInputLen))
		}
	}
	return nil
}

func checkTokens(tss [][]int64) error {
	if len(tss) > MaxEmbeddingInputs {
		return apierr.BadRequest(apierr.CodeInvalidValue, "input", fmt.Sprintf("'input' has %d items; at most %d are allowed.", len(tss), MaxEmbeddingInputs))
	}
	for i, ts := range tss {
		if len(ts) == 0 {
			return apierr.BadRequest(apierr.CodeInvalidValue, "input", fmt.Sprintf("'input[%d]' is an empty token array.", i))
		}
		if len(ts) > MaxEmbeddingTokens {
			return apierr.BadRequest(apierr.CodeInvalidValue, "input", fmt.Sprintf("'input[%d]' has more than %d tokens.", i, MaxEmbeddingTokens))
		}
		for _, id := range ts {
			if id < 0 || id > math.MaxInt32 {
				return apierr.BadRequest(apierr.CodeInvalidValue, "input", fmt.Sprintf("'input[%d]' has token id %d out of range.", i, id))
			}
		}
	}
	return nil
}

type embeddingObject struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"`
}

func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	p, ok := decodeRequest(w, r, MaxJSONBody, parseEmbeddings)
	if !ok {
		return
	}
	m, emb, ok := modelEngine(s, w, r, p.Model, s.opt.Backend.Embedder)
	if !ok {
		return
	}
	if p.Dimensions > 0 {
		if p.Dimensions > emb.MaxDimensions() {
			apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "dimensions", fmt.Sprintf("'dimensions' is %d; model %s has %d.", p.Dimensions, m.ID, emb.MaxDimensions())))
			return
		}
		if p.Dimensions < emb.MaxDimensions() && !emb.TruncatableDimensions() {
			apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "dimensions", fmt.Sprintf("Model %s does not support 'dimensions'.", m.ID)))
			return
		}
	}
	res, err := emb.Embed(r.Context(), engine.EmbedRequest{Texts: p.Texts, Tokens: p.Tokens, Dimensions: p.Dimensions})
	if err != nil {
		writeErr(w, err)
		return
	}
	reportUsage(w, int64(res.PromptTokens), 0)
	data := make([]embeddingObject, len(res.Vectors))
	for i, v := range res.Vectors {
		data[i] = embeddingObject{Object: "embedding", Index: i}
		if p.Base64 {
			data[i].Embedding = encodeFloats(v)
		} else {
			data[i].Embedding = v
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data":   data,
		"model":  m.ID,
		"usage":  map[string]int{"prompt_tokens": res.PromptTokens, "total_tokens": res.PromptTokens},
	})
}

// encodeFloats is OpenAI's base64 format: little-endian float32s.
func encodeFloats(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return base64.StdEncoding.EncodeToString(b)
}

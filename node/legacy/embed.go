package legacy

import (
	"encoding/json"
	"net/http"
)

// v1Embeddings is the answer of POST /v1/embeddings.
type v1Embeddings struct {
	Data []struct {
		Index     int       `json:"index"`
		Embedding []float64 `json:"embedding"`
	} `json:"data"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
	} `json:"usage"`
}

// embedV1 runs POST /v1/embeddings and returns the vectors in input order.
func (s *Server) embedV1(r *http.Request, body map[string]any) (*v1Embeddings, error) {
	res, err := s.call(r, http.MethodPost, "/v1/embeddings", body)
	if err != nil {
		return nil, err
	}
	defer res.Close()
	var out v1Embeddings
	if err := json.NewDecoder(res.body).Decode(&out); err != nil {
		return nil, err
	}
	ordered := out.Data[:0:0]
	ordered = append(ordered, out.Data...)
	for _, d := range out.Data {
		if d.Index >= 0 && d.Index < len(ordered) {
			ordered[d.Index] = d
		}
	}
	out.Data = ordered
	return &out, nil
}

// embed serves /api/embed: {model, input (string or strings), dimensions}
// onto POST /v1/embeddings. truncate, keep_alive and options are accepted
// and ignored (inputs are truncated to the model's limit as /v1 does).
func (s *Server) embed(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model      string          `json:"model"`
		Input      json.RawMessage `json:"input"`
		Dimensions int             `json:"dimensions"`
		Truncate   *bool           `json:"truncate"`
		Options    map[string]any  `json:"options"`
		KeepAlive  any             `json:"keep_alive"`
	}
	if !decode(w, r, &req) {
		return
	}
	if req.Model == "" {
		writeError(w, http.StatusBadRequest, "model is required")
		return
	}
	model := modelName(req.Model)
	start := s.opt.Clock()
	body := map[string]any{"model": model, "input": req.Input}
	if req.Dimensions > 0 {
		body["dimensions"] = req.Dimensions
	}
	out, err := s.embedV1(r, body)
	if err != nil {
		s.fail(w, err)
		return
	}
	vecs := make([][]float64, len(out.Data))
	for i, d := range out.Data {
		vecs[i] = d.Embedding
	}
	writeJSON(w, http.StatusOK, map[string]any{"model": model, "embeddings": vecs,
		"total_duration": s.opt.Clock().Sub(start).Nanoseconds(), "prompt_eval_count": out.Usage.PromptTokens})
}

// embeddings serves the older /api/embeddings: {model, prompt} onto POST
// /v1/embeddings with one input. An empty prompt gives an empty vector, as
// in Ollama, once the model is known.
func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model     string         `json:"model"`
		Prompt    string         `json:"prompt"`
		Options   map[string]any `json:"options"`
		KeepAlive any            `json:"keep_alive"`
	}
	if !decode(w, r, &req) {
		return
	}
	if req.Model == "" {
		writeError(w, http.StatusBadRequest, "model is required")
		return
	}
	model := modelName(req.Model)
	if req.Prompt == "" {
		var m struct{}
		if err := s.getJSON(r, "/v1/models/"+escapeID(model), &m); err != nil {
			s.fail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"embedding": []float64{}})
		return
	}
	out, err := s.embedV1(r, map[string]any{"model": model, "input": req.Prompt})
	if err != nil {
		s.fail(w, err)
		return
	}
	if len(out.Data) != 1 {
		writeError(w, http.StatusBadGateway, "the /v1 answer has no vector")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"embedding": out.Data[0].Embedding})
}

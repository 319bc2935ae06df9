package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/go-chi/chi/v5"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/batch"
)

// MaxBatchInputs bounds one batch embeddings job.
const MaxBatchInputs = 50000

// BatchJobs is the node's background embedding job manager.
type BatchJobs interface {
	// Submit queues a job embedding texts with model (a canonical id);
	// dims > 0 truncates the vectors. It returns batch.ErrFull when too
	// many jobs are queued.
	Submit(model string, texts []string, dims int) (batch.Job, error)
	// Snapshot returns a copy of a job, with vectors once it completed; an
	// unknown or expired id is an error.
	Snapshot(id string) (batch.Job, error)
	// Cancel stops a queued or running job and returns it; an unknown id
	// is an error.
	Cancel(id string) (batch.Job, error)
	// List returns every job still held, newest first, without vectors.
	List() []batch.Job
}

type batchRequest struct {
	Model          string   `json:"model"`
	Input          []string `json:"input"`
	EncodingFormat string   `json:"encoding_format,omitempty"`
	Dimensions     *int     `json:"dimensions,omitempty"`
}

func (s *Server) submitBatch(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(r, MaxImageBody)
	if err != nil {
		writeErr(w, err)
		return
	}
	var req batchRequest
	if err := decodeStrict(body, &req); err != nil {
		writeErr(w, err)
		return
	}
	if req.Model == "" {
		apierr.Write(w, apierr.BadRequest(apierr.CodeMissingParam, "model", "You must provide a model parameter."))
		return
	}
	if len(req.Input) == 0 {
		apierr.Write(w, apierr.BadRequest(apierr.CodeMissingParam, "input", "You must provide a non-empty input array of strings."))
		return
	}
	if len(req.Input) > MaxBatchInputs {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "input", fmt.Sprintf("'input' has %d items; at most %d are allowed.", len(req.Input), MaxBatchInputs)))
		return
	}
	for i, t := range req.Input {
		if t == "" || len(t) > MaxEmbeddingInputLen {
			apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "input", fmt.Sprintf("'input[%d]' is empty or longer than %d bytes.", i, MaxEmbeddingInputLen)))
			return
		}
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "encoding_format", "'encoding_format' must be 'float' or 'base64'."))
		return
	}
	dims := 0
	if req.Dimensions != nil {
		dims = *req.Dimensions
	}
	m, ok := s.opt.Backend.Model(req.Model)
	if !ok {
		apierr.Write(w, ModelNotFound(req.Model))
		return
	}
	markDeprecated(w, m)
	emb, err := s.opt.Backend.Embedder(r.Context(), m.ID)
	if err != nil {
		writeErr(w, err)
		return
	}
	if dims < 0 || dims > emb.MaxDimensions() || (dims > 0 && dims < emb.MaxDimensions() && !emb.TruncatableDimensions()) {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "dimensions", fmt.Sprintf("'dimensions' %d is not available for model %s.", dims, m.ID)))
		return
	}
	// A batch submission counts once toward limits; polling never does.
	if done, e := s.admit(r, m.ID, nil); e != nil {
		apierr.Write(w, e)
		return
	} else if done != nil {
		defer done(Served{Status: http.StatusOK})
	}
	job, err := s.opt.Batches.Submit(m.ID, req.Input, dims)
	if errors.Is(err, batch.ErrFull) {
		e := apierr.New(http.StatusServiceUnavailable, apierr.TypeServer, apierr.CodeOverloaded, "", "Too many batch jobs are queued on this node; retry later.")
		e.RetryAfter = 30
		apierr.Write(w, e)
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, batchObject(job, false))
}

func (s *Server) getBatch(w http.ResponseWriter, r *http.Request) {
	id, _ := url.PathUnescape(chi.URLParam(r, "id"))
	job, err := s.opt.Batches.Snapshot(id)
	if err != nil {
		apierr.Write(w, apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, apierr.CodeBatchNotFound, "id", fmt.Sprintf("No batch job %q (finished jobs expire).", id)))
		return
	}
	writeJSON(w, http.StatusOK, batchObject(job, r.URL.Query().Get("encoding_format") == "base64"))
}

func (s *Server) cancelBatch(w http.ResponseWriter, r *http.Request) {
	id, _ := url.PathUnescape(chi.URLParam(r, "id"))
	job, err := s.opt.Batches.Cancel(id)
	if err != nil {
		apierr.Write(w, apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, apierr.CodeBatchNotFound, "id", fmt.Sprintf("No batch job %q.", id)))
		return
	}
	writeJSON(w, http.StatusOK, batchObject(job, false))
}

func (s *Server) listBatches(w http.ResponseWriter, r *http.Request) {
	jobs := s.opt.Batches.List()
	data := make([]map[string]any, 0, len(jobs))
	for _, j := range jobs {
		data = append(data, batchObject(j, false))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// batchObject is the JSON form of a job; vectors appear once completed.
func batchObject(j batch.Job, b64 bool) map[string]any {
	o := map[string]any{
		"id":             j.ID,
		"object":         "batch.embeddings",
		"model":          j.Model,
		"status":         j.Status,
		"created_at":     j.CreatedAt.Unix(),
		"completed_at":   nil,
		"request_counts": map[string]int{"total": j.Total, "completed": j.Done},
		"error":          nil,
	}
	if !j.CompletedAt.IsZero() {
		o["completed_at"] = j.CompletedAt.Unix()
	}
	if j.Error != "" {
		o["error"] = map[string]string{"message": j.Error}
	}
	if j.Status == batch.Completed {
		data := make([]embeddingObject, len(j.Vectors))
		for i, v := range j.Vectors {
			data[i] = embeddingObject{Object: "embedding", Index: i, Embedding: v}
			if b64 {
				data[i].Embedding = encodeFloats(v)
			}
		}
		o["data"] = data
		o["usage"] = map[string]int{"prompt_tokens": j.Tokens, "total_tokens": j.Tokens}
	}
	return o
}

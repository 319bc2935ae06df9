package api

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/infermesh/infermesh/node/apierr"
)

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// ResidentBytes is an extension OpenAI clients ignore: the memory the
	// model holds while loaded on the answering node.
	ResidentBytes int64 `json:"resident_bytes,omitempty"`
}

func toObject(m Model) modelObject {
	return modelObject{ID: m.ID, Object: "model", Created: m.Created, OwnedBy: m.Runtime, ResidentBytes: m.ResidentBytes}
}

func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	ms := s.opt.Backend.Models()
	data := make([]modelObject, 0, len(ms))
	for _, m := range ms {
		data = append(data, toObject(m))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (s *Server) getModel(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	if u, err := url.PathUnescape(id); err == nil {
		id = u // the OpenAI SDKs escape the slashes of canonical ids
	}
	if id == "" {
		id = strings.Join([]string{chi.URLParam(r, "runtime"), chi.URLParam(r, "family"), chi.URLParam(r, "variant")}, "/")
	}
	m, ok := s.opt.Backend.Model(id)
	if !ok {
		apierr.Write(w, ModelNotFound(id))
		return
	}
	markDeprecated(w, m)
	writeJSON(w, http.StatusOK, toObject(m))
}

// markDeprecated sets X-AI-Model-Deprecated on a response about a model
// the policy deprecated: the replacement's id, or "true".
func markDeprecated(w http.ResponseWriter, m Model) {
	if m.Deprecation != "" {
		w.Header().Set("X-AI-Model-Deprecated", m.Deprecation)
	}
}

// installedEntry is one row of GET /v1/models/installed (shape not fixed by
// the spec; documented in docs/api.md).
type installedEntry struct {
	Key        string   `json:"key"`
	WireID     string   `json:"wire_id"`
	Task       string   `json:"task"`
	Modalities []string `json:"modalities"`
	SizeBytes  int64    `json:"size_bytes"`
	Warm       bool     `json:"warm"`
	// ResidentBytes estimates the memory the model holds while loaded on
	// this node (0: not loaded here).
	ResidentBytes int64 `json:"resident_bytes"`
}

func (s *Server) installedModels(w http.ResponseWriter, r *http.Request) {
	ms := s.opt.Backend.Models()
	data := make([]installedEntry, 0, len(ms))
	for _, m := range ms {
		data = append(data, installedEntry{Key: m.ID, WireID: m.WireID, Task: m.Task, Modalities: m.Modalities, SizeBytes: m.SizeBytes, Warm: m.Warm, ResidentBytes: m.ResidentBytes})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

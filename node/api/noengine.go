package api

import (
	"fmt"
	"net/http"
)

// resolveForTask answers for routes whose engine this node does not have:
// an unknown model is 404 model_not_found (the spec's "no engine" answer); a
// model installed for another task is 400 model_not_supported.
func (s *Server) resolveForTask(w http.ResponseWriter, model, what string) {
	m, ok := s.opt.Backend.Model(model)
	if !ok {
		WriteError(w, ModelNotFound(model))
		return
	}
	WriteError(w, BadRequest(CodeModelNotSupported, "model",
		fmt.Sprintf("Model %s (%s) does not serve %s.", m.ID, m.Task, what)))
}

// queryModelRoute is for the WebSocket route, whose model is a query parameter.
func (s *Server) queryModelRoute(what string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		model := r.URL.Query().Get("model")
		if model == "" {
			WriteError(w, BadRequest(CodeMissingParam, "model", "You must provide a model query parameter."))
			return
		}
		s.resolveForTask(w, model, what)
	}
}

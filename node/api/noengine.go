package api

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// peekObject checks that body is one JSON object.
func peekObject(body []byte) (map[string]json.RawMessage, error) {
	var v map[string]json.RawMessage
	if err := decodeStrict(body, &v); err != nil {
		return nil, err
	}
	return v, nil
}

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

// jsonModelRoute serves a JSON route whose engine is not available on this
// node: it validates the body and the model field, then resolves the model.
func (s *Server) jsonModelRoute(what string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := readBody(r, MaxImageBody)
		if err != nil {
			writeErr(w, err)
			return
		}
		if _, err := peekObject(body); err != nil {
			writeErr(w, err)
			return
		}
		model, err := peekModel(body)
		if err != nil {
			writeErr(w, err)
			return
		}
		s.resolveForTask(w, model, what)
	}
}

// formModelRoute is jsonModelRoute for multipart/form-data uploads; the
// form is parsed in memory (nothing is written to disk).
func (s *Server) formModelRoute(what, fileField string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := readBody(r, MaxAudioFileBytes+1<<20)
		if err != nil {
			writeErr(w, err)
			return
		}
		f, err := parseAudioForm(body, r.Header.Get("Content-Type"), fileField)
		if err != nil {
			writeErr(w, err)
			return
		}
		model := f.value("model")
		if model == "" {
			WriteError(w, BadRequest(CodeMissingParam, "model", "You must provide a model parameter."))
			return
		}
		s.resolveForTask(w, model, what)
	}
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

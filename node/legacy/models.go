package legacy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// v1Model is an entry of GET /v1/models.
type v1Model struct {
	ID      string `json:"id"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// v1Installed is an entry of GET /v1/models/installed.
type v1Installed struct {
	Key       string `json:"key"`
	WireID    string `json:"wire_id"`
	Task      string `json:"task"`
	SizeBytes int64  `json:"size_bytes"`
}

// escapeID escapes a model id for a /v1/models/{id} path.
func escapeID(id string) string { return url.PathEscape(id) }

// family is the middle part of a canonical id <runtime>/<family>/<variant>.
func family(id string) string {
	parts := strings.SplitN(id, "/", 3)
	if len(parts) == 3 {
		return parts[1]
	}
	return id
}

// details is Ollama's model details for a canonical id.
func details(m v1Model) map[string]any {
	f := family(m.ID)
	return map[string]any{"parent_model": "", "format": m.OwnedBy, "family": f, "families": []string{f},
		"parameter_size": "", "quantization_level": ""}
}

// digest identifies a model in Ollama's lists: the SHA-256 of its
// canonical id.
func digest(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:])
}

// installed indexes GET /v1/models/installed by canonical id.
func (s *Server) installed(r *http.Request) (map[string]v1Installed, error) {
	var inst struct {
		Data []v1Installed `json:"data"`
	}
	if err := s.getJSON(r, "/v1/models/installed", &inst); err != nil {
		return nil, err
	}
	out := make(map[string]v1Installed, len(inst.Data))
	for _, m := range inst.Data {
		out[m.Key] = m
	}
	return out, nil
}

// tags serves /api/tags and /api/models from GET /v1/models (the models
// the mesh serves), with wire ids and sizes from /v1/models/installed.
func (s *Server) tags(w http.ResponseWriter, r *http.Request) {
	var list struct {
		Data []v1Model `json:"data"`
	}
	if err := s.getJSON(r, "/v1/models", &list); err != nil {
		s.fail(w, err)
		return
	}
	inst, err := s.installed(r)
	if err != nil {
		s.fail(w, err)
		return
	}
	models := make([]map[string]any, 0, len(list.Data))
	for _, m := range list.Data {
		name := m.ID
		if i, ok := inst[m.ID]; ok && i.WireID != "" {
			name = i.WireID
		}
		models = append(models, map[string]any{"name": name, "model": name, "modified_at": time.Unix(m.Created, 0).UTC(),
			"size": inst[m.ID].SizeBytes, "digest": digest(m.ID), "details": details(m)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": models})
}

// capabilities maps a task onto Ollama's capability names.
func capabilities(task string) []string {
	switch task {
	case "chat":
		return []string{"completion", "tools"}
	case "embeddings":
		return []string{"embedding"}
	}
	return []string{}
}

// show serves /api/show from GET /v1/models/{id}.
func (s *Server) show(w http.ResponseWriter, r *http.Request) {
	var req modelRequest
	name, ok := req.decode(w, r)
	if !ok {
		return
	}
	var m v1Model
	if err := s.getJSON(r, "/v1/models/"+escapeID(name), &m); err != nil {
		s.fail(w, err)
		return
	}
	inst, err := s.installed(r)
	if err != nil {
		s.fail(w, err)
		return
	}
	i := inst[m.ID]
	info := map[string]any{"general.architecture": family(m.ID), "general.basename": family(m.ID),
		"infermesh.id": m.ID, "infermesh.runtime": m.OwnedBy, "infermesh.task": i.Task}
	if i.WireID != "" {
		info["infermesh.wire_id"] = i.WireID
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"modelfile":    fmt.Sprintf("# served by infermesh as %s\nFROM %s\n", m.ID, name),
		"details":      details(m),
		"model_info":   info,
		"capabilities": capabilities(i.Task),
		"modified_at":  time.Unix(m.Created, 0).UTC(),
	})
}

// pull maps Ollama's POST /api/pull onto POST /v1/models/pull: the /v1
// events become Ollama's status lines ({"status":"pulling <key>"}, then
// {"status":<phase>,"digest","total","completed"} per progress event, then
// {"status":"success"}), or one final object when stream is false. Ollama's
// model name is resolved like the other legacy calls (name:latest when
// untagged); canonical ids are passed as they are.
func (s *Server) pull(w http.ResponseWriter, r *http.Request) {
	var req modelRequest
	name, ok := req.decode(w, r)
	if !ok {
		return
	}
	res, err := s.call(r, http.MethodPost, "/v1/models/pull", map[string]string{"model_key": name})
	if err != nil {
		s.fail(w, err)
		return
	}
	defer res.Close()
	out := &ndjson{w: w, rc: http.NewResponseController(w), stream: req.Stream == nil || *req.Stream}
	events := newSSEReader(res.body)
	for {
		data, err := events.next()
		if err != nil {
			out.fail(http.StatusBadGateway, "the pull stream ended before the pull finished")
			return
		}
		var ev struct {
			ModelKey  string `json:"model_key"`
			Phase     string `json:"phase"`
			Completed int64  `json:"completed"`
			Total     int64  `json:"total"`
			Duration  *int64 `json:"duration_ms"`
			Error     *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			out.fail(http.StatusBadGateway, "unreadable pull event")
			return
		}
		switch {
		case ev.Error != nil:
			out.fail(http.StatusInternalServerError, ev.Error.Message)
			return
		case ev.Duration != nil:
			if out.stream {
				out.line(map[string]string{"status": "success"})
			} else {
				writeJSON(w, http.StatusOK, map[string]string{"status": "success"})
			}
			return
		case ev.Phase != "" && out.stream:
			out.line(map[string]any{"status": ev.Phase, "digest": "sha256:" + digest(name), "total": ev.Total, "completed": ev.Completed})
		case ev.ModelKey != "" && out.stream:
			out.line(map[string]string{"status": "pulling " + ev.ModelKey})
		}
	}
}

// modelRequest is the body of /api/show and /api/pull: the model under
// "model" (or the older "name"), and for pull whether to stream.
type modelRequest struct {
	Model  string `json:"model"`
	Name   string `json:"name"`
	Stream *bool  `json:"stream"`
}

// decode reads the body and returns the model name after Ollama's naming
// rule; it has answered 400 when it returns false.
func (m *modelRequest) decode(w http.ResponseWriter, r *http.Request) (string, bool) {
	if !decode(w, r, m) {
		return "", false
	}
	name := m.Model
	if name == "" {
		name = m.Name
	}
	if name == "" {
		writeError(w, http.StatusBadRequest, "model is required")
		return "", false
	}
	return modelName(name), true
}

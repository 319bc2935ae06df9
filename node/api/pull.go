package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/models"
)

// ModelHub is the node behind the catalogue, pull, provenance and model
// removal routes.
type ModelHub interface {
	// Catalog returns the catalogue entries with this node's state.
	Catalog() []CatalogEntry
	// RefreshCatalog reloads the catalogue sources and reports the change.
	RefreshCatalog(ctx context.Context) (CatalogRefresh, error)
	// Provenance returns the registered model card of a model.
	Provenance(id string) (ModelCard, bool)
	// PullAllowed checks governance and lifecycle policy for a pull of key;
	// nil means allowed.
	PullAllowed(key string) *apierr.Error
	// Pull starts (or joins) a pull of key on this node. An unknown key
	// wraps ErrModelNotFound.
	Pull(key string) (PullJob, error)
	// RemoveModel uninstalls a model from this node.
	RemoveModel(id string) error
}

// PullJob is a running pull a client can follow.
type PullJob interface {
	// Subscribe returns the job's events, ending with done or error, and a
	// cancel func for a client that leaves early.
	Subscribe() (<-chan PullEvent, func())
}

// PullEvent is one Server-Sent Event of a pull: Name is started, progress,
// done or error, and Data its JSON data.
type PullEvent struct {
	// Name is the SSE event name: started, progress, done or error.
	Name string
	// Data is the event's payload, sent JSON-encoded as its data line.
	Data any
}

// Pinned is implemented by a Dispatcher that can serve a request on one
// named node of the mesh (pulls to a chosen node).
type Pinned interface {
	// ServeOn serves the request on node id (forwarding it there).
	ServeOn(w http.ResponseWriter, r *http.Request, node string, body []byte)
}

// pullRequest is the body of POST /v1/models/pull. Node is an infermesh
// extension: the node that should install the model (default: this one).
type pullRequest struct {
	ModelKey string `json:"model_key"`
	Node     string `json:"node,omitempty"`
}

func parsePull(body []byte) (pullRequest, error) {
	var p pullRequest
	if err := decodeStrict(body, &p); err != nil {
		return p, err
	}
	if p.ModelKey == "" {
		return p, apierr.BadRequest(apierr.CodeMissingParam, "model_key", "You must provide a model_key parameter.")
	}
	if len(p.ModelKey) > 256 {
		return p, apierr.BadRequest(apierr.CodeInvalidValue, "model_key", "The model_key is longer than 256 characters.")
	}
	if len(p.Node) > 63 {
		return p, apierr.BadRequest(apierr.CodeInvalidValue, "node", "The node id is longer than 63 characters.")
	}
	return p, nil
}

func (s *Server) hubRoutes(r chi.Router) {
	r.Get("/models/catalog", s.catalog)
	r.Post("/models/catalog/refresh", s.refreshCatalog)
	r.Post("/models/pull", s.pull)
	r.Delete("/models/{id}", s.refuseDelete)
	r.Delete("/models/{runtime}/{family}/{variant}", s.refuseDelete)
	r.Get("/server/models/{id}/provenance", s.provenance)
	r.Get("/server/models/{runtime}/{family}/{variant}/provenance", s.provenance)
	r.Delete("/server/models/{id}", s.removeModel)
	r.Delete("/server/models/{runtime}/{family}/{variant}", s.removeModel)
}

func (s *Server) hub(w http.ResponseWriter) (ModelHub, bool) {
	if s.opt.Hub == nil {
		apierr.Write(w, apierr.New(http.StatusNotImplemented, apierr.TypeNotImplemented, apierr.CodeCatalogNotEnabled, "", "This server has no model catalogue."))
		return nil, false
	}
	return s.opt.Hub, true
}

// modelIDParam reads a model id from {id} or {runtime}/{family}/{variant}.
func modelIDParam(r *http.Request) string {
	id := chi.URLParam(r, "id")
	if u, err := url.PathUnescape(id); err == nil {
		id = u
	}
	if id == "" {
		id = strings.Join([]string{chi.URLParam(r, "runtime"), chi.URLParam(r, "family"), chi.URLParam(r, "variant")}, "/")
	}
	return id
}

func (s *Server) catalog(w http.ResponseWriter, r *http.Request) {
	h, ok := s.hub(w)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": h.Catalog()})
}

func (s *Server) refreshCatalog(w http.ResponseWriter, r *http.Request) {
	h, ok := s.hub(w)
	if !ok {
		return
	}
	// The body, if any, carries nothing; it is read (bounded) and ignored.
	if _, err := readBody(r, MaxJSONBody); err != nil {
		writeErr(w, err)
		return
	}
	ch, err := h.RefreshCatalog(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, ch)
}

func (s *Server) provenance(w http.ResponseWriter, r *http.Request) {
	h, ok := s.hub(w)
	if !ok {
		return
	}
	id := modelIDParam(r)
	card, found := h.Provenance(id)
	if !found {
		apierr.Write(w, apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, apierr.CodeCardNotFound, "id",
			fmt.Sprintf("No model card is registered for '%s'.", id)))
		return
	}
	writeJSON(w, http.StatusOK, card)
}

// refuseDelete answers the client delete route: models are removed by
// operators on the node itself (`infermesh models rm`).
func (s *Server) refuseDelete(w http.ResponseWriter, r *http.Request) {
	apierr.Write(w, apierr.New(http.StatusForbidden, apierr.TypePermission, apierr.CodeDeleteRefused, "",
		"Models cannot be deleted through the API; an operator removes them with `infermesh models rm` on the node itself."))
}

// removeModel is the operator route behind `infermesh models rm`: it takes
// an admin caller (auth's admin class) whose connection comes from this
// computer, and never a request forwarded by a peer or a proxy.
func (s *Server) removeModel(w http.ResponseWriter, r *http.Request) {
	h, ok := s.hub(w)
	if !ok {
		return
	}
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() || r.Header.Get("X-Forwarded-For") != "" {
		apierr.Write(w, apierr.New(http.StatusForbidden, apierr.TypePermission, apierr.CodePermissionDenied, "",
			"Models are removed only from the node's own computer (`infermesh models rm`)."))
		return
	}
	id := modelIDParam(r)
	if err := h.RemoveModel(id); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "model", "deleted": true})
}

// pull is POST /v1/models/pull on the public router: validate, check
// policy, count it, then run it here or on the node the caller named.
func (s *Server) pull(w http.ResponseWriter, r *http.Request) {
	h, ok := s.hub(w)
	if !ok {
		return
	}
	body, err := readBody(r, MaxJSONBody)
	if err != nil {
		writeErr(w, err)
		return
	}
	req, err := parsePull(body)
	if err != nil {
		writeErr(w, err)
		return
	}
	if e := h.PullAllowed(req.ModelKey); e != nil {
		apierr.Write(w, e)
		return
	}
	remote := req.Node != "" && req.Node != s.opt.NodeID
	pinned, canPin := s.opt.Dispatcher.(Pinned)
	if remote {
		known := false
		for _, m := range s.opt.Backend.Members() {
			known = known || m.ID == req.Node
		}
		if !known || !canPin {
			apierr.Write(w, apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, apierr.CodeNodeNotFound, "node",
				fmt.Sprintf("No node '%s' is a member of this mesh.", req.Node)))
			return
		}
	}
	sw := &statusWriter{ResponseWriter: w}
	if done, e := s.admit(r, req.ModelKey, nil); e != nil {
		apierr.Write(w, e)
		return
	} else if done != nil {
		defer func() { done(Served{Status: sw.code()}) }()
	}
	if remote {
		pinned.ServeOn(sw, r, req.Node, body)
		return
	}
	s.streamPull(sw, r, h, req.ModelKey)
}

// pullLocal is the route on the local-only router: a pull forwarded by the
// peer that admitted it, run on this node.
func (s *Server) pullLocal(w http.ResponseWriter, r *http.Request) {
	h, ok := s.hub(w)
	if !ok {
		return
	}
	req, ok := decodeRequest(w, r, MaxJSONBody, parsePull)
	if !ok {
		return
	}
	s.streamPull(w, r, h, req.ModelKey)
}

// streamPull follows a pull job and writes its events as SSE. A client
// that leaves stops following; the pull goes on.
func (s *Server) streamPull(w http.ResponseWriter, r *http.Request, h ModelHub, key string) {
	job, err := h.Pull(key)
	if err != nil {
		if errors.Is(err, ErrModelNotFound) {
			apierr.Write(w, apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, apierr.CodeModelNotFound, "model_key", err.Error()))
			return
		}
		writeErr(w, err)
		return
	}
	events, cancel := job.Subscribe()
	defer cancel()
	out := newSSE(w)
	for {
		select {
		case e, open := <-events:
			if !open {
				return
			}
			if err := out.event(e.Name, e.Data); err != nil {
				return
			}
		case <-r.Context().Done():
			return
		}
	}
}

// event writes one named SSE event.
func (s *sse) event(name string, v any) error {
	s.head()
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", name, b); err != nil {
		return err
	}
	return s.rc.Flush()
}

// CatalogEntry is one entry of GET /v1/models/catalog: the catalogue's
// descriptive fields (the spec's), this node's state, and (an infermesh
// extension) the nodes that have the model installed.
type CatalogEntry struct {
	models.Listing
	// IsInstalled reports whether this node has the model installed.
	IsInstalled bool `json:"is_installed"`
	// IsActive reports whether the model is loaded (warm) on this node.
	IsActive bool `json:"is_active"`
	// LastUsedUTC is when this node last ran the model (RFC 3339), null
	// when never.
	LastUsedUTC *string `json:"last_used_utc"`
	// InstalledOn lists the routable nodes that have the model, sorted;
	// never nil.
	InstalledOn []string `json:"installed_on"`
}

// CatalogRefresh is the body of POST /v1/models/catalog/refresh: what the
// reload changed. Its fields are in the order the keys are sent.
type CatalogRefresh struct {
	// Added, Changed and Removed list catalogue keys, sorted; never nil.
	Added   []string `json:"added"`
	Changed []string `json:"changed"`
	// Entries is the number of entries now, over all sources.
	Entries int `json:"entries"`
	// Object is always "catalog.refresh".
	Object  string   `json:"object"`
	Removed []string `json:"removed"`
	// Sources reports how each source loaded, the built-in one first.
	Sources []models.SourceStatus `json:"sources"`
}

// ModelCard is the body of GET /v1/server/models/{id}/provenance: the
// registered model card of a model.
type ModelCard struct {
	// Model is the canonical id the card is registered for.
	Model string `json:"model"`
	// Object is always "model.card".
	Object           string `json:"object"`
	Publisher        string `json:"publisher"`
	Source           string `json:"source"`
	License          string `json:"license"`
	IntendedUse      string `json:"intended_use"`
	KnownLimitations string `json:"known_limitations"`
}

// Package legacy serves the previous generation's local-AI API (Ollama's
// /api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags,
// /api/models, /api/show and /api/pull) on a second listener, until its end
// date (spec: Versioning 4).
//
// Every call is mapped onto the node's /v1 implementation: the legacy
// handler builds the /v1 request, runs it through the node's public /v1
// http.Handler in-process (so routing, limits and the mesh apply as for any
// /v1 call), and translates the OpenAI response or SSE stream into Ollama's
// shapes, streaming as NDJSON. Requests it makes carry a context mark
// (FromLegacy) so the node can admit them without a key. It serves loopback
// callers only unless AllowRemote is set.
package legacy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// DefaultListen is the legacy API's address when enabled without one.
const DefaultListen = "127.0.0.1:11434"

// DefaultEndDate is the last day the legacy API answers (spec: it ends on
// 2026-12-31).
func DefaultEndDate() time.Time { return time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC) }

// Options configures the legacy API.
type Options struct {
	// V1 is the node's public HTTP handler (the one serving /v1).
	V1 http.Handler
	// EndDate is the last day (UTC) the API serves; from the next day on
	// every call answers 410 naming its replacement. Zero means
	// DefaultEndDate().
	EndDate time.Time
	// AllowRemote serves callers that are not on this computer.
	AllowRemote bool
	// V1Base, when set (e.g. "http://127.0.0.1:11436"), is named in the
	// end-of-life messages.
	V1Base string
	// Version is reported by /api/version.
	Version string
	// Logger and Clock are the node's.
	Logger *slog.Logger
	// Clock tells the time for the end date, timestamps and durations; nil
	// means time.Now.
	Clock func() time.Time
}

// Server is the legacy API handler.
type Server struct {
	opt Options
	log *slog.Logger
	mux *http.ServeMux
	end time.Time // the first instant the API no longer serves
}

// New builds the legacy API.
func New(opt Options) *Server {
	if opt.Clock == nil {
		opt.Clock = time.Now
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.EndDate.IsZero() {
		opt.EndDate = DefaultEndDate()
	}
	y, m, d := opt.EndDate.Date()
	s := &Server{opt: opt, log: opt.Logger, mux: http.NewServeMux(), end: time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)}
	s.mux.HandleFunc("POST /api/chat", s.chat)
	s.mux.HandleFunc("POST /api/generate", s.generate)
	s.mux.HandleFunc("POST /api/embed", s.embed)
	s.mux.HandleFunc("POST /api/embeddings", s.embeddings)
	s.mux.HandleFunc("GET /api/tags", s.tags)
	s.mux.HandleFunc("GET /api/models", s.tags)
	s.mux.HandleFunc("POST /api/show", s.show)
	s.mux.HandleFunc("POST /api/pull", s.pull)
	s.mux.HandleFunc("GET /api/version", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": s.opt.Version})
	})
	s.mux.HandleFunc("/", s.root)
	return s
}

// Handler returns the legacy API's HTTP handler.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serve) }

// EndDate is the last day the API serves.
func (s *Server) EndDate() time.Time { return s.opt.EndDate }

// Ended reports whether the API has passed its end date at t.
func (s *Server) Ended(t time.Time) bool { return !t.Before(s.end) }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if !s.opt.AllowRemote && !loopback(r.RemoteAddr) {
		writeError(w, http.StatusForbidden, "The legacy API serves this computer only; call the /v1 API (with an API key) instead.")
		return
	}
	if s.Ended(s.opt.Clock()) {
		writeError(w, http.StatusGone, fmt.Sprintf("The legacy API ended on %s. Use %s%s instead.",
			s.opt.EndDate.Format(time.DateOnly), replacement(r.Method, r.URL.Path), s.where()))
		return
	}
	s.mux.ServeHTTP(w, r)
}

// where names the /v1 API's address when known.
func (s *Server) where() string {
	if s.opt.V1Base == "" {
		return " on this node's /v1 API"
	}
	return " at " + strings.TrimRight(s.opt.V1Base, "/")
}

// replacement names the /v1 call that replaces a legacy call (the spec's
// table).
func replacement(method, path string) string {
	switch path {
	case "/api/chat":
		return "POST /v1/chat/completions"
	case "/api/generate":
		return "POST /v1/chat/completions with one user message"
	case "/api/embed", "/api/embeddings":
		return "POST /v1/embeddings"
	case "/api/tags", "/api/models":
		return "GET /v1/models"
	case "/api/show":
		return "GET /v1/models/{id}"
	case "/api/pull":
		return "POST /v1/models/pull"
	}
	return "the /v1 API"
}

// root answers the liveness probe Ollama clients send (HEAD or GET /) and
// 404 for paths the legacy API does not have.
func (s *Server) root(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			fmt.Fprintln(w, "infermesh legacy API is running")
		}
		return
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("%s %s is not part of the legacy API; use the /v1 API.", r.Method, r.URL.Path))
}

// loopback reports whether a remote address ("ip:port") is on this computer.
func loopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// writeError writes Ollama's error shape {"error": "..."}.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// decode reads a JSON request body (at most 32 MiB, images included).
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 32<<20))
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid request body: "+err.Error())
		return false
	}
	return true
}

// modelName applies Ollama's naming rule: a name without a tag means
// name:latest. Canonical ids (with '/') are used as they are.
func modelName(name string) string {
	if name == "" || strings.ContainsAny(name, ":/") {
		return name
	}
	return name + ":latest"
}

type legacyKey struct{}

// FromLegacy reports whether a request was made by the legacy API on its
// caller's behalf; the node admits such requests without a key.
func FromLegacy(ctx context.Context) bool {
	v, _ := ctx.Value(legacyKey{}).(bool)
	return v
}

package api

import (
	"net/http"
)

// readyz answers 200 {"status":"ready"} only when the node can serve every
// request, keyed ones included; otherwise 503 with Retry-After and the
// reason: {"status":"draining"} or {"status":"not_ready","reason":...}.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.opt.Backend.Draining() {
		w.Header().Set("Retry-After", "5")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "draining", "reason": "the node is shutting down"})
		return
	}
	if reason := s.opt.Backend.NotReady(); reason != "" {
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not_ready", "reason": reason})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

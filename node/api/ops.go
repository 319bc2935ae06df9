package api

import (
	_ "embed"
	"net/http"
)

//go:embed dashboard.html
var dashboardHTML []byte

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

// dashboard serves the anonymous live page; its data comes from /dashboard/data.
func (s *Server) dashboard(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'")
	w.WriteHeader(http.StatusOK)
	w.Write(dashboardHTML)
}

func (s *Server) dashboardData(w http.ResponseWriter, r *http.Request) {
	st := s.opt.Backend.Status()
	st["requests_total"], st["latency"] = s.metrics.recent.snapshot()
	st["inflight"] = s.metrics.recent.inflight()
	writeJSON(w, http.StatusOK, st)
}

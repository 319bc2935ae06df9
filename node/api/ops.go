package api

import (
	_ "embed"
	"net/http"
)

//go:embed dashboard.html
var dashboardHTML []byte

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.opt.Backend.Draining() {
		w.Header().Set("Retry-After", "5")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "draining"})
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

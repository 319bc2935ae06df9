package api

import (
	"net/http"
)

// readyz answers 200 {"status":"ready"} when the node can authenticate
// and serve requests (its replica of the keys is usable), otherwise 503
// with Retry-After and the reason: {"status":"draining"} or
// {"status":"not_ready","reason":...}. Its "governance" field is "ok", or
// "no_quorum" with "governance_reason" while writes to keys, policy and
// quotas cannot commit; a node without quorum stays ready for inference.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	body := map[string]string{"governance": "ok"}
	if why := s.opt.Backend.WritesBlocked(); why != "" {
		body["governance"], body["governance_reason"] = "no_quorum", why
	}
	if s.opt.Backend.Draining() {
		w.Header().Set("Retry-After", "5")
		body["status"], body["reason"] = "draining", "the node is shutting down"
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	if reason := s.opt.Backend.NotReady(); reason != "" {
		w.Header().Set("Retry-After", "1")
		body["status"], body["reason"] = "not_ready", reason
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	body["status"] = "ready"
	writeJSON(w, http.StatusOK, body)
}

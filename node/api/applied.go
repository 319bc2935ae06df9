package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/infermesh/infermesh/node/apierr"
)

// AppliedPath is a peer-only route of the local router (reached through
// signed forwarding, never mounted on the public router): it waits until
// this node's raft replica has applied ?index=N, for at most ?wait_ms
// (default 1000, at most 5000), and answers {"applied_index":N}, or 504
// when the bound passed first. A node that changed replicated state uses
// it as a barrier read on its peers (see Governance.WaitApplied).
const AppliedPath = "/v1/server/applied"

// maxAppliedWait bounds one AppliedPath call.
const maxAppliedWait = 5 * time.Second

// appliedRoutes mounts AppliedPath on the local router (r is the /v1
// subrouter).
func (s *Server) appliedRoutes(r chi.Router) {
	if s.opt.Governance == nil {
		return
	}
	r.Get("/server/applied", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		index, err := strconv.ParseUint(q.Get("index"), 10, 64)
		if err != nil {
			apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "index", "index must be a raft log index."))
			return
		}
		wait := time.Second
		if ms, err := strconv.Atoi(q.Get("wait_ms")); err == nil && ms > 0 {
			wait = min(time.Duration(ms)*time.Millisecond, maxAppliedWait)
		}
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		defer cancel()
		applied, err := s.opt.Governance.WaitApplied(ctx, index)
		if err != nil {
			apierr.Write(w, apierr.New(http.StatusGatewayTimeout, apierr.TypeServer, apierr.CodeTimeout, "index", err.Error()))
			return
		}
		writeJSON(w, http.StatusOK, map[string]uint64{"applied_index": applied})
	})
}

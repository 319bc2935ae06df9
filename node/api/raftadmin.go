package api

import (
	"context"
	"errors"
	"net/http"
	"net/url"

	"github.com/go-chi/chi/v5"
	"github.com/infermesh/infermesh/node/apierr"
)

// RaftAdmin is the raft configuration as an operator sees and repairs it
// (`infermesh raft peers`, `infermesh raft remove-peer`). The node's
// Governance implements it; the routes are mounted only then, under the
// admin routes (an admin key is needed).
type RaftAdmin interface {
	// RaftPeers lists the raft configuration as this node knows it, with
	// the leader it follows.
	RaftPeers() (RaftStatus, error)
	// RemoveRaftPeer removes a server from the raft configuration through
	// the leader. Unknown ids wrap ErrNotFound, removing the leader wraps
	// ErrInvalid, and no reachable leader wraps ErrNoLeader.
	RemoveRaftPeer(ctx context.Context, id string) error
}

// RaftStatus is the answer of GET /v1/server/raft/peers.
type RaftStatus struct {
	// Object is always "raft_configuration".
	Object string `json:"object"`
	// Node is the id of the node that answered.
	Node string `json:"node"`
	// Leader is the leader that node follows; empty when it knows none
	// (no majority reachable).
	Leader string `json:"leader"`
	// Peers are the servers, sorted by id.
	Peers []RaftPeer `json:"data"`
}

// RaftPeer is one server of the raft configuration.
type RaftPeer struct {
	// ID is the node id.
	ID string `json:"id"`
	// Address is where the server is dialled (its RPC address).
	Address string `json:"address"`
	// Suffrage is "voter" or "nonvoter".
	Suffrage string `json:"suffrage"`
	// Leader marks the leader.
	Leader bool `json:"leader"`
}

// raftAdminRoutes mounts GET /v1/server/raft/peers and
// DELETE /v1/server/raft/peers/{id}.
func (s *Server) raftAdminRoutes(r chi.Router) {
	ra, ok := s.opt.Governance.(RaftAdmin)
	if !ok {
		return
	}
	r.Get("/server/raft/peers", func(w http.ResponseWriter, r *http.Request) {
		st, err := ra.RaftPeers()
		if err != nil {
			writeErr(w, err)
			return
		}
		st.Object = "raft_configuration"
		if st.Peers == nil {
			st.Peers = []RaftPeer{}
		}
		writeJSON(w, http.StatusOK, st)
	})
	r.Delete("/server/raft/peers/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, _ := url.PathUnescape(chi.URLParam(r, "id"))
		err := ra.RemoveRaftPeer(r.Context(), id)
		switch {
		case err == nil:
			writeJSON(w, http.StatusOK, map[string]any{"object": "raft_peer", "id": id, "removed": true})
		case errors.Is(err, ErrNotFound):
			apierr.Write(w, apierr.New(http.StatusNotFound, apierr.TypeInvalidRequest, apierr.CodeRaftPeerNotFound, "id", err.Error()))
		case errors.Is(err, ErrInvalid):
			apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "id", err.Error()))
		default:
			governanceError(w, err)
		}
	})
}

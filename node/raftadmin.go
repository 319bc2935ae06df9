package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/node/api"
)

// This file serves api.RaftAdmin and `infermesh raft recover`.

// RaftPeers lists the raft configuration as this node knows it (the admin
// route behind `infermesh raft peers`); it answers even without a leader,
// which is when an operator needs it most.
func (n *governance) RaftPeers() (api.RaftStatus, error) {
	c := n.cluster
	if c.raft == nil {
		return api.RaftStatus{}, errors.New("raft is not running on this node")
	}
	servers, err := c.raft.Servers()
	if err != nil {
		return api.RaftStatus{}, err
	}
	st := api.RaftStatus{Node: n.nodeID, Leader: c.raft.Leader()}
	for _, s := range servers {
		suffrage := "nonvoter"
		if s.Voter {
			suffrage = "voter"
		}
		st.Peers = append(st.Peers, api.RaftPeer{ID: s.ID, Address: s.Address, Suffrage: suffrage, Leader: s.Leader})
	}
	return st, nil
}

// RemoveRaftPeer removes server id from the raft configuration through the
// leader (`infermesh raft remove-peer`).
func (n *governance) RemoveRaftPeer(ctx context.Context, id string) error {
	c := n.cluster
	if c.raft == nil {
		return errors.New("raft is not running on this node")
	}
	err := c.raft.RemovePeer(ctx, id)
	switch {
	case errors.Is(err, consensus.ErrNoSuchServer):
		return fmt.Errorf("%w: %w", api.ErrNotFound, err)
	case errors.Is(err, consensus.ErrRemoveLeader):
		return fmt.Errorf("%w: %w", api.ErrInvalid, err)
	case errors.Is(err, consensus.ErrNoLeader):
		return fmt.Errorf("%w: %w", api.ErrNoLeader, err)
	}
	return err
}

// RecoverRaft rewrites the raft state of a stopped node's data directory so
// that the node restarts as the single voter of its cluster (`infermesh
// raft recover`; see consensus.Recover for what this gives up). It takes
// the data directory's lock, so it fails while the node runs.
func RecoverRaft(dataDir, nodeID string, logger *slog.Logger) (consensus.RecoverResult, error) {
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return consensus.RecoverResult{}, err
	}
	defer lock.release()
	return consensus.Recover(dataDir, nodeID, logger)
}

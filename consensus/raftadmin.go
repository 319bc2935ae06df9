package consensus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Operator actions on the raft configuration: removing a server by hand
// (on any node; the call goes to the leader) and the offline recovery of a
// node whose cluster lost its majority for good.

// Errors of RemovePeer.
var (
	// ErrNoSuchServer: the id is not in the raft configuration.
	ErrNoSuchServer = errors.New("consensus: no such server in the raft configuration")
	// ErrRemoveLeader: the leader cannot remove itself this way; stop it
	// (leadership passes on and the new leader removes it) instead.
	ErrRemoveLeader = errors.New("consensus: the leader cannot remove itself; stop that node instead")
)

// removeServerProcedure is the peer-authenticated Connect procedure that
// carries RemovePeer from a follower to the leader (request: the server id
// as a StringValue; response: Empty).
const removeServerProcedure = "/infermesh.consensus.v1.RaftAdmin/RemoveServer"

// RemovePeer removes server id from the raft configuration. It works on any
// node: the leader removes it; a follower forwards the request to the
// leader (signed like forwarded applies), retrying while no leader is
// reachable for Config.LeaderWait, then ErrNoLeader. A node that is still
// alive in the mesh is added back as a non-voter by the next reconcile, so
// stop a node before removing it. After the removal the leader restores an
// odd voter count (see reconcile).
func (n *Node) RemovePeer(ctx context.Context, id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty id", ErrNoSuchServer)
	}
	deadline := time.Now().Add(n.cfg.LeaderWait)
	backoff := 5 * time.Millisecond
	for {
		var err error
		if n.IsLeader() {
			err = n.removeLocal(id)
		} else if leader := n.Leader(); leader != "" && leader != n.cfg.NodeID {
			err = n.forwardRemove(ctx, leader, id)
		} else {
			err = fmt.Errorf("%w: no leader known", errNotApplied)
		}
		if err == nil || !errors.Is(err, errNotApplied) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %w", ErrNoLeader, err)
		}
		if !sleepCtx(ctx, backoff) {
			return fmt.Errorf("%w: %w", ErrNoLeader, ctx.Err())
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// removeLocal removes id on the leader.
func (n *Node) removeLocal(id string) error {
	if id == n.cfg.NodeID {
		return ErrRemoveLeader
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return fmt.Errorf("%w: %w", errNotApplied, err)
	}
	if !slices.ContainsFunc(f.Configuration().Servers, func(s raft.Server) bool { return string(s.ID) == id }) {
		return fmt.Errorf("%w: %s", ErrNoSuchServer, id)
	}
	err := n.changeConfig("remove_by_operator", id, "", func() raft.IndexFuture {
		return n.raft.RemoveServer(raft.ServerID(id), 0, n.cfg.ApplyTimeout)
	})
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
		return fmt.Errorf("%w: %w", errNotApplied, err)
	}
	if err != nil {
		return err
	}
	n.triggerReconcile()
	return nil
}

func (n *Node) forwardRemove(ctx context.Context, leaderID, id string) error {
	e, ok := n.members.get(leaderID)
	if !ok || e.addr == "" {
		return fmt.Errorf("%w: no address for leader %s", errNotApplied, leaderID)
	}
	ctx, cancel := context.WithTimeout(ctx, n.fwd.timeout)
	defer cancel()
	c := connect.NewClient[wrapperspb.StringValue, emptypb.Empty](n.fwd.httpClient, "http://"+e.addr+removeServerProcedure, n.fwd.opts...)
	_, err := c.CallUnary(ctx, connect.NewRequest(wrapperspb.String(id)))
	if err == nil {
		return nil
	}
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		return fmt.Errorf("%w: %s", ErrNoSuchServer, id)
	case connect.CodeInvalidArgument:
		return ErrRemoveLeader
	case connect.CodeFailedPrecondition, connect.CodeUnavailable:
		return fmt.Errorf("%w: %s: %w", errNotApplied, leaderID, err)
	case connect.CodeUnauthenticated:
		return fmt.Errorf("%w: leader %s refused this node's authentication: %w", ErrNoLeader, leaderID, err)
	}
	return fmt.Errorf("consensus: remove %s through leader %s: %w", id, leaderID, err)
}

// AdminHandler returns the path and handler of the raft admin procedure,
// to be mounted next to Handler on the internal RPC port. Calls go through
// Config.PeerAuth.Handler like ConsensusService's.
func (n *Node) AdminHandler() (string, http.Handler) {
	auth := n.cfg.PeerAuth.Handler
	if auth == nil {
		auth = connect.UnaryInterceptorFunc(refuseAll)
	}
	h := connect.NewUnaryHandler(removeServerProcedure, func(ctx context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[emptypb.Empty], error) {
		if !n.IsLeader() {
			return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("not the leader"))
		}
		err := n.removeLocal(req.Msg.GetValue())
		switch {
		case err == nil:
			return connect.NewResponse(&emptypb.Empty{}), nil
		case errors.Is(err, ErrNoSuchServer):
			return nil, connect.NewError(connect.CodeNotFound, err)
		case errors.Is(err, ErrRemoveLeader):
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		case errors.Is(err, errNotApplied):
			return nil, connect.NewError(connect.CodeFailedPrecondition, err)
		}
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}, connect.WithInterceptors(auth), connect.WithReadMaxBytes(1<<10))
	return removeServerProcedure, h
}

// RecoverResult describes what Recover did.
type RecoverResult struct {
	// Before is the raft configuration found in the data directory.
	Before []Server
	// AppliedIndex is the last log index the recovered state includes.
	AppliedIndex uint64
}

// Recover rewrites the raft state under dataDir so that node nodeID
// restarts as the single voter of its cluster: hashicorp/raft's
// RecoverCluster, the peers.json recovery. It is for a cluster that lost
// its majority for good (in a two-server cluster, the voter died); the
// node must be stopped. Every entry in this node's log counts as
// committed, including any that never reached a majority, and entries
// only the lost servers had are gone. The lost servers must never come
// back with their old data (each would still believe in the old
// configuration): wipe their data directories' raft folder first, then
// they join as new servers. A nil logger discards raft's messages.
func Recover(dataDir, nodeID string, logger *slog.Logger) (RecoverResult, error) {
	var res RecoverResult
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	dir := filepath.Join(dataDir, "raft")
	if _, err := os.Stat(filepath.Join(dir, "raft.db")); err != nil {
		return res, fmt.Errorf("consensus: no raft state in %s: %w", dataDir, err)
	}
	store, err := raftboltdb.New(raftboltdb.Options{
		Path:        filepath.Join(dir, "raft.db"),
		BoltOptions: &bbolt.Options{Timeout: 2 * time.Second},
	})
	if err != nil {
		return res, fmt.Errorf("consensus: open raft store (is the node still running?): %w", err)
	}
	defer store.Close()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, DefaultSnapshotRetain, newHCLog(logger, "raft"))
	if err != nil {
		return res, fmt.Errorf("consensus: snapshot store: %w", err)
	}
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(nodeID)
	rc.Logger = newHCLog(logger, "raft")
	_, trans := raft.NewInmemTransport("")
	conf, err := raft.GetConfiguration(rc, newFSM(logger, nil), store, store, snaps, trans)
	if err != nil {
		return res, fmt.Errorf("consensus: read the raft configuration: %w", err)
	}
	var self *raft.Server
	for _, s := range conf.Servers {
		res.Before = append(res.Before, Server{ID: string(s.ID), Address: string(s.Address), Voter: s.Suffrage == raft.Voter})
		if string(s.ID) == nodeID {
			self = &s
		}
	}
	sortServers(res.Before)
	if self == nil {
		ids := make([]string, 0, len(res.Before))
		for _, s := range res.Before {
			ids = append(ids, s.ID)
		}
		return res, fmt.Errorf("consensus: node %q is not in the raft configuration of %s (servers: %v); pass the node id this data directory belongs to", nodeID, dataDir, ids)
	}
	recovered := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: self.ID, Address: self.Address}}}
	rc2 := raft.DefaultConfig()
	rc2.LocalID = self.ID
	rc2.Logger = newHCLog(logger, "raft")
	fsm := newFSM(logger, nil)
	if err := raft.RecoverCluster(rc2, fsm, store, store, snaps, trans, recovered); err != nil {
		return res, fmt.Errorf("consensus: recover: %w", err)
	}
	fsm.mu.RLock()
	res.AppliedIndex = fsm.applied
	fsm.mu.RUnlock()
	return res, nil
}

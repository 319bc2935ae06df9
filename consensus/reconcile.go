package consensus

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/hashicorp/raft"
)

// watchLeadership runs the reconcile loop while this node leads.
func (n *Node) watchLeadership() {
	defer n.wg.Done()
	var stop func()
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	for {
		select {
		case leader := <-n.raft.LeaderCh():
			n.metrics.setLeader(leader)
			switch {
			case leader && stop == nil:
				n.logger.Info("became raft leader")
				stop = n.startLeaderLoop()
			case !leader && stop != nil:
				n.logger.Info("lost raft leadership")
				stop()
				stop = nil
			}
		case <-n.shutdownCh:
			return
		}
	}
}

// startLeaderLoop runs leaderLoop until the returned stop is called; stop
// waits for it to return.
func (n *Node) startLeaderLoop() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.leaderLoop(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// leaderLoop waits for a barrier (so the state machine has applied
// everything the previous leader committed), then reconciles membership on
// every event and every ReconcileInterval until leadership ends.
func (n *Node) leaderLoop(ctx context.Context) {
	for {
		err := n.raft.Barrier(n.cfg.ApplyTimeout).Error()
		if err == nil {
			break
		}
		n.logger.Warn("leader barrier failed", "err", err)
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrRaftShutdown) {
			return
		}
		if !sleepCtx(ctx, time.Second) {
			return
		}
	}
	ticker := time.NewTicker(n.cfg.ReconcileInterval)
	defer ticker.Stop()
	for {
		if err := n.reconcile(); err != nil {
			n.logger.Warn("reconcile", "err", err)
		} else {
			n.metrics.reconcilePasses.Inc()
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-n.reconcileCh:
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// reconcile makes raft's configuration follow membership, in this order:
// remove servers that left, or failed longer than ReapTimeout ago (never
// this node); promote alive non-voters while there are fewer than Voters
// voters; add alive members not in the configuration, as voters while
// there are fewer than Voters, else as non-voters. Ids are visited in
// sorted order.
//
// A member that comes back on another address keeps its old address in the
// configuration: raft dials peers through the member table by id
// (memberTable.ServerAddr), so the configured address is only a fallback.
// Rewriting it in place would also hit a data race inside hashicorp/raft
// v1.7.3 (startStopReplication replaces followerReplication.peer while the
// replication goroutine reads it without the lock).
func (n *Node) reconcile() error {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	servers := f.Configuration().Servers
	if n.cfg.Members != nil {
		n.members.merge(n.cfg.Members.Members(), servers)
	}
	members := n.members.all()
	now := n.cfg.Clock.Now()
	slices.SortFunc(servers, func(a, b raft.Server) int { return cmp.Compare(a.ID, b.ID) })

	current := map[string]raft.Server{}
	for _, s := range servers {
		current[string(s.ID)] = s
	}
	for _, s := range servers {
		id := string(s.ID)
		e, known := members[id]
		if id == n.cfg.NodeID || !known {
			continue
		}
		if e.status == MemberLeft || e.status == MemberFailed && now.Sub(e.since) >= n.cfg.ReapTimeout {
			if err := n.changeConfig("remove", id, "", func() raft.IndexFuture {
				return n.raft.RemoveServer(s.ID, 0, n.cfg.ApplyTimeout)
			}); err != nil {
				return err
			}
			delete(current, id)
		}
	}

	voters := 0
	for _, s := range current {
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	alive := func(id string) (memberEntry, bool) {
		e, ok := members[id]
		return e, ok && e.status == MemberAlive && e.addr != ""
	}
	for _, s := range servers {
		cur, in := current[string(s.ID)]
		if !in || cur.Suffrage == raft.Voter || voters >= n.cfg.Voters {
			continue
		}
		e, ok := alive(string(s.ID))
		if !ok {
			continue
		}
		if err := n.changeConfig("promote", string(s.ID), e.addr, func() raft.IndexFuture {
			return n.raft.AddVoter(s.ID, raft.ServerAddress(e.addr), 0, n.cfg.ApplyTimeout)
		}); err != nil {
			return err
		}
		cur.Suffrage, cur.Address = raft.Voter, raft.ServerAddress(e.addr)
		current[string(s.ID)] = cur
		voters++
	}

	ids := make([]string, 0, len(members))
	for id := range members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		e, ok := alive(id)
		if !ok {
			continue
		}
		sid, addr := raft.ServerID(id), raft.ServerAddress(e.addr)
		if _, in := current[id]; in {
			continue
		}
		switch {
		case voters < n.cfg.Voters:
			if err := n.changeConfig("add_voter", id, e.addr, func() raft.IndexFuture {
				return n.raft.AddVoter(sid, addr, 0, n.cfg.ApplyTimeout)
			}); err != nil {
				return err
			}
			voters++
		default:
			if err := n.changeConfig("add_nonvoter", id, e.addr, func() raft.IndexFuture {
				return n.raft.AddNonvoter(sid, addr, 0, n.cfg.ApplyTimeout)
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (n *Node) changeConfig(action, id, addr string, change func() raft.IndexFuture) error {
	if err := change().Error(); err != nil {
		n.logger.Warn("raft configuration change failed", "action", action, "server", id, "addr", addr, "err", err)
		return err
	}
	n.logger.Info("raft configuration changed", "action", action, "server", id, "addr", addr)
	n.metrics.reconcileChanges.WithLabelValues(action).Inc()
	return nil
}

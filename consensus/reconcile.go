package consensus

import (
	"cmp"
	"context"
	"errors"
	"maps"
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
		err := n.awaitBarrier(ctx)
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

// reconcile makes raft's configuration follow membership, in this order
// (ids visited in sorted order):
//
//  1. remove servers that left, or failed longer than ReapTimeout ago
//     (never this node);
//  2. add alive members that are not servers, always as non-voters;
//  3. keep the voter count odd: the target is the largest odd number not
//     above Voters nor above voters + alive non-voters; promote alive
//     non-voters up to it (two at a time: 1 → 3 → 5), and when the count
//     is even with nobody to promote (a voter was removed), demote one
//     voter other than this node, a failed one first.
//
// So a cluster never sits with two voters, where losing either one stops
// every write for good: two servers are one voter and one non-voter, and
// losing the non-voter changes nothing. The price is that a two-node mesh
// depends on its one voter (losing it stops writes until it returns, or
// until `infermesh raft recover` on the survivor). A failed voter awaiting
// its reap still counts, so a flapping node causes no promotions or
// demotions; more voters than Voters (after lowering it) are not demoted
// beyond restoring an odd count.
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
	// raft hands out its own configuration slice: sort a copy (sorting it
	// in place raced with every other reader, found by -race).
	servers := slices.Clone(f.Configuration().Servers)
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

	alive := func(id string) (memberEntry, bool) {
		e, ok := members[id]
		return e, ok && e.status == MemberAlive && e.addr != ""
	}
	for _, id := range slices.Sorted(maps.Keys(members)) {
		e, ok := alive(id)
		if _, in := current[id]; in || !ok {
			continue
		}
		sid, addr := raft.ServerID(id), raft.ServerAddress(e.addr)
		if err := n.changeConfig("add_nonvoter", id, e.addr, func() raft.IndexFuture {
			return n.raft.AddNonvoter(sid, addr, 0, n.cfg.ApplyTimeout)
		}); err != nil {
			return err
		}
		current[id] = raft.Server{Suffrage: raft.Nonvoter, ID: sid, Address: addr}
	}
	return n.balanceVoters(current, alive)
}

// balanceVoters is step 3 of reconcile: promote alive non-voters up to the
// odd target, or demote one voter when the count is even and nobody can be
// promoted.
func (n *Node) balanceVoters(current map[string]raft.Server, alive func(string) (memberEntry, bool)) error {
	voters := 0
	var candidates, demotable, failedVoters []string
	for _, id := range slices.Sorted(maps.Keys(current)) {
		s := current[id]
		_, ok := alive(id)
		switch {
		case s.Suffrage == raft.Voter:
			voters++
			if id == n.cfg.NodeID {
				continue
			}
			if ok {
				demotable = append(demotable, id)
			} else {
				failedVoters = append(failedVoters, id)
			}
		case ok:
			candidates = append(candidates, id)
		}
	}
	target := VoterTarget(n.cfg.Voters, voters+len(candidates))
	switch {
	case target > voters:
		for _, id := range candidates[:target-voters] {
			e, _ := alive(id)
			sid, addr := raft.ServerID(id), raft.ServerAddress(e.addr)
			if err := n.changeConfig("promote", id, e.addr, func() raft.IndexFuture {
				return n.raft.AddVoter(sid, addr, 0, n.cfg.ApplyTimeout)
			}); err != nil {
				return err
			}
		}
	case voters%2 == 0 && target < voters:
		// Prefer a voter that is down (it cannot vote anyway), else the
		// alive one with the highest id.
		victim := ""
		if len(failedVoters) > 0 {
			victim = failedVoters[0]
		} else if len(demotable) > 0 {
			victim = demotable[len(demotable)-1]
		}
		if victim == "" {
			return nil
		}
		return n.changeConfig("demote", victim, "", func() raft.IndexFuture {
			return n.raft.DemoteVoter(raft.ServerID(victim), 0, n.cfg.ApplyTimeout)
		})
	}
	return nil
}

// VoterTarget is the number of voters the leader aims for with at most
// maxVoters voters and eligible servers (current voters plus alive
// non-voters): the largest odd number not above either, and at least 1.
func VoterTarget(maxVoters, eligible int) int {
	t := min(maxVoters, eligible)
	if t < 1 {
		return 1
	}
	if t%2 == 0 {
		t--
	}
	return t
}

func (n *Node) changeConfig(action, id, addr string, change func() raft.IndexFuture) error {
	if err := n.await(context.Background(), change()); err != nil {
		n.logger.Warn("raft configuration change failed", "action", action, "server", id, "addr", addr, "err", err)
		return err
	}
	n.logger.Info("raft configuration changed", "action", action, "server", id, "addr", addr)
	n.metrics.reconcileChanges.WithLabelValues(action).Inc()
	return nil
}

// awaitBarrier issues a raft barrier and waits for it, or for ctx or the
// node's shutdown: a barrier queued just as raft shuts down is never
// answered (hashicorp/raft drops what is left in its apply queue), and
// waiting on it alone hung Close, which waits for this loop (seen once in
// a full test run).
func (n *Node) awaitBarrier(ctx context.Context) error {
	return n.await(ctx, n.raft.Barrier(n.cfg.ApplyTimeout))
}

// await waits for a raft future, or for ctx (ErrLeadershipLost: the
// leader loop is being stopped) or the node's shutdown (ErrRaftShutdown).
func (n *Node) await(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return raft.ErrLeadershipLost
	case <-n.shutdownCh:
		return raft.ErrRaftShutdown
	}
}

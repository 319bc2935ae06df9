package consensus

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// memberEntry is what consensus last heard about one node.
type memberEntry struct {
	addr   string
	status MemberStatus
	since  time.Time // when status last changed
}

// memberTable maps node ids to their advertised RPC address and status. It
// is the raft transport's address book (peers are looked up by id, so a node
// that comes back on a new address is found) and the reconcile loop's input.
type memberTable struct {
	mu    sync.Mutex
	m     map[string]*memberEntry
	clock Clock
}

func newMemberTable(clock Clock) *memberTable {
	return &memberTable{m: map[string]*memberEntry{}, clock: clock}
}

// set records a status (and address when non-empty); it reports whether
// anything changed.
func (t *memberTable) set(id, addr string, status MemberStatus) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.setLocked(id, addr, status, t.clock.Now())
}

func (t *memberTable) setLocked(id, addr string, status MemberStatus, now time.Time) bool {
	e := t.m[id]
	if e == nil {
		if addr == "" && status != MemberAlive {
			// A failure report about a node never seen alive still starts
			// its reap clock.
			t.m[id] = &memberEntry{status: status, since: now}
			return true
		}
		t.m[id] = &memberEntry{addr: addr, status: status, since: now}
		return true
	}
	changed := false
	if addr != "" && addr != e.addr {
		e.addr, changed = addr, true
	}
	if status != e.status {
		e.status, e.since, changed = status, now, true
	}
	return changed
}

// merge applies a full membership view: listed members take their reported
// status; known members missing from the view are failed from now on (the
// membership layer forgets dead nodes), as are servers in the raft
// configuration the table has never heard of.
func (t *memberTable) merge(list []Member, servers []raft.Server) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.Now()
	listed := map[string]bool{}
	for _, m := range list {
		listed[m.ID] = true
		t.setLocked(m.ID, m.RPCAddr, m.Status, now)
	}
	for _, id := range slices.Sorted(maps.Keys(t.m)) {
		if !listed[id] && t.m[id].status == MemberAlive {
			t.setLocked(id, "", MemberFailed, now)
		}
	}
	for _, s := range servers {
		if _, ok := t.m[string(s.ID)]; !ok {
			t.setLocked(string(s.ID), "", MemberFailed, now)
		}
	}
}

func (t *memberTable) get(id string) (memberEntry, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[id]
	if !ok {
		return memberEntry{}, false
	}
	return *e, true
}

func (t *memberTable) all() map[string]memberEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]memberEntry, len(t.m))
	for id, e := range t.m {
		out[id] = *e
	}
	return out
}

// ServerAddr implements raft.ServerAddressProvider: raft dials the address
// the membership layer reports for the id, falling back to the address in
// the raft configuration when none is known.
func (t *memberTable) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if e, ok := t.get(string(id)); ok && e.addr != "" {
		return raft.ServerAddress(e.addr), nil
	}
	return "", fmt.Errorf("consensus: no address known for %s", id)
}

// MemberJoined tells consensus that node id is alive at rpcAddr (a join, a
// rejoin, or an address change). On the leader it leads to the node being
// added to raft. Call it on every node for every mesh join event.
func (n *Node) MemberJoined(id, rpcAddr string) {
	if n.members.set(id, rpcAddr, MemberAlive) {
		n.logger.Info("member joined", "member", id, "addr", rpcAddr)
	}
	n.triggerReconcile()
}

// MemberFailed tells consensus that the mesh declared node id failed. The
// leader removes it from raft only after Config.ReapTimeout without it
// coming back.
func (n *Node) MemberFailed(id string) {
	if n.members.set(id, "", MemberFailed) {
		n.logger.Info("member failed", "member", id)
	}
	n.triggerReconcile()
}

// MemberLeft tells consensus that node id left gracefully. The leader
// removes it from raft at once (it handed off leadership before leaving).
func (n *Node) MemberLeft(id string) {
	if n.members.set(id, "", MemberLeft) {
		n.logger.Info("member left", "member", id)
	}
	n.triggerReconcile()
}

func (n *Node) triggerReconcile() {
	select {
	case n.reconcileCh <- struct{}{}:
	default:
	}
}

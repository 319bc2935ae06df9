package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// EventKind names a fault or a recovery action.
type EventKind string

// Event kinds. Faults start an impairment; recoveries end one.
const (
	EvKill       EventKind = "kill"        // SIGKILL
	EvKillLeader EventKind = "kill_leader" // SIGKILL of the raft leader
	EvTerminate  EventKind = "terminate"   // SIGTERM, drain, exit
	EvPause      EventKind = "pause"       // SIGSTOP
	EvIsolate    EventKind = "isolate"     // a group cut from the rest, both directions
	EvSplit      EventKind = "split"       // two groups cut from each other
	EvCut        EventKind = "cut"         // one direction only
	EvRestart    EventKind = "restart"     // start a down node with its data directory
	EvResume     EventKind = "resume"      // SIGCONT
	EvHeal       EventKind = "heal"        // remove every partition rule
	EvNewLeader  EventKind = "new_leader"  // a leader other than the killed one was seen
)

// isFault reports whether the kind starts an impairment.
func (k EventKind) isFault() bool {
	switch k {
	case EvKill, EvKillLeader, EvTerminate, EvPause, EvIsolate, EvSplit, EvCut:
		return true
	}
	return false
}

// isPartition reports whether the kind is an iptables partition.
func (k EventKind) isPartition() bool { return k == EvIsolate || k == EvSplit || k == EvCut }

// Event is one timed, logged fault or recovery.
type Event struct {
	// Seq is the event's position in the run's event log, from 0.
	Seq int `json:"seq"`
	// Kind is the fault or recovery action.
	Kind EventKind `json:"kind"`
	// Nodes are the targets; for a split, Groups are the sides (for a cut:
	// from, to).
	Nodes []string `json:"nodes,omitempty"`
	// Groups are the partition's sides: the isolated group and the rest, the
	// two halves of a split, or a cut's senders and receivers; nil for other
	// kinds.
	Groups [][]string `json:"groups,omitempty"`
	// At is when the action started, Done when it returned (a restart
	// returns when the node is ready, a terminate when it exited).
	At time.Duration `json:"at_ns"`
	// Done is when the action returned, as an offset from the scenario start.
	Done time.Duration `json:"done_ns"`
	// Detail is free text about the action (e.g. "after n2" for a new leader).
	Detail string `json:"detail,omitempty"`
	// Err is why the action failed ("" when it succeeded).
	Err string `json:"err,omitempty"`
}

func (r *Run) begin(kind EventKind, nodes []string, groups [][]string, detail string) *Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := &Event{Seq: len(r.events), Kind: kind, Nodes: slices.Clone(nodes), Groups: groups, At: r.rec.Since(), Detail: detail}
	r.events = append(r.events, ev)
	r.log.Info("fault", "kind", kind, "nodes", strings.Join(nodes, ","), "groups", fmt.Sprint(groups), "at", ev.At.Round(time.Millisecond), "detail", detail)
	return ev
}

func (r *Run) end(ev *Event, err error) error {
	r.mu.Lock()
	ev.Done = r.rec.Since()
	if err != nil {
		ev.Err = err.Error()
	}
	r.mu.Unlock()
	if err != nil {
		r.log.Error("fault failed", "kind", ev.Kind, "err", err)
		return fmt.Errorf("%s %v: %w", ev.Kind, ev.Nodes, err)
	}
	return nil
}

// Events returns a copy of the event log.
func (r *Run) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Event, len(r.events))
	for i, e := range r.events {
		out[i] = *e
	}
	return out
}

// Sleep waits d or until ctx ends.
func (r *Run) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SleepUntil waits until offset at from the scenario start.
func (r *Run) SleepUntil(ctx context.Context, at time.Duration) error {
	if d := at - r.rec.Since(); d > 0 {
		return r.Sleep(ctx, d)
	}
	return nil
}

// Up returns the ids of ready nodes.
func (r *Run) Up() []string { return r.cl.InState(StateUp) }

// Pick returns a random element of ids ("" for none).
func (r *Run) Pick(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return ids[r.rng.IntN(len(ids))]
}

// Kill sends SIGKILL to a node.
func (r *Run) Kill(ctx context.Context, id string) error {
	ev := r.begin(EvKill, []string{id}, nil, "")
	err := r.cl.Kill(id)
	r.load.ForgetConnections()
	return r.end(ev, err)
}

// KillRandom kills a random ready node and returns its id.
func (r *Run) KillRandom(ctx context.Context) (string, error) {
	id := r.Pick(r.Up())
	if id == "" {
		return "", errors.New("kill random: no node is up")
	}
	return id, r.Kill(ctx, id)
}

// Leader asks the up nodes who leads (majority of answers), retrying up
// to 15 s. It needs the state-digest endpoint.
func (r *Run) Leader(ctx context.Context) (string, error) {
	if !r.opt.Features.Digest {
		return "", errors.New("finding the leader needs GET /v1/server/state-digest")
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if l := leaderOf(r.mon.Poll(ctx)); l != "" && r.cl.State(l) == StateUp {
			return l, nil
		}
		if err := r.Sleep(ctx, 200*time.Millisecond); err != nil {
			return "", err
		}
	}
	return "", errors.New("no leader agreed by a majority of the up nodes within 15s")
}

// KillLeader kills the raft leader, then waits (up to 20 s) until a
// majority of the survivors name a new leader, logged as EvNewLeader.
func (r *Run) KillLeader(ctx context.Context) (string, error) {
	leader, err := r.Leader(ctx)
	if err != nil {
		ev := r.begin(EvKillLeader, nil, nil, "")
		return "", r.end(ev, err)
	}
	ev := r.begin(EvKillLeader, []string{leader}, nil, "")
	err = r.cl.Kill(leader)
	r.load.ForgetConnections()
	if err := r.end(ev, err); err != nil {
		return leader, err
	}
	return leader, r.waitNewLeader(ctx, leader, 20*time.Second)
}

func (r *Run) waitNewLeader(ctx context.Context, old string, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		if l := leaderOf(r.mon.Poll(ctx)); l != "" && l != old {
			ev := r.begin(EvNewLeader, []string{l}, nil, "after "+old)
			return r.end(ev, nil)
		}
		if err := r.Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("no new leader within %s of killing %s", bound, old)
}

// Terminate sends SIGTERM and waits for the drained node to exit.
func (r *Run) Terminate(ctx context.Context, id string) error {
	ev := r.begin(EvTerminate, []string{id}, nil, "")
	err := r.cl.Terminate(id)
	r.load.ForgetConnections()
	return r.end(ev, err)
}

// Restart starts a down node with its data directory and waits until ready.
func (r *Run) Restart(ctx context.Context, id string) error {
	ev := r.begin(EvRestart, []string{id}, nil, "")
	return r.end(ev, r.cl.StartNode(ctx, id))
}

// RestartDown restarts every down node.
func (r *Run) RestartDown(ctx context.Context) error {
	var errs []error
	for _, id := range r.cl.InState(StateDown) {
		errs = append(errs, r.Restart(ctx, id))
	}
	return errors.Join(errs...)
}

// RollingRestart terminates and restarts every node in turn, waiting
// settle after each node is ready again (and, when members is served,
// until every up node sees it healthy, up to 20 s).
func (r *Run) RollingRestart(ctx context.Context, settle time.Duration) error {
	for _, n := range r.cl.Nodes() {
		if err := r.Terminate(ctx, n.ID); err != nil {
			return err
		}
		if err := r.Restart(ctx, n.ID); err != nil {
			return err
		}
		if r.opt.Features.Members {
			r.waitSeenHealthy(ctx, n.ID, 20*time.Second)
		}
		if err := r.Sleep(ctx, settle); err != nil {
			return err
		}
	}
	return nil
}

// waitSeenHealthy waits until every up node lists id as healthy.
func (r *Run) waitSeenHealthy(ctx context.Context, id string, bound time.Duration) bool {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		obs := r.mon.Poll(ctx)
		all := len(obs) > 0
		for _, o := range obs {
			if o.Err != "" || !slices.Contains(o.Healthy, id) {
				all = false
			}
		}
		if all {
			return true
		}
		if r.Sleep(ctx, 200*time.Millisecond) != nil {
			return false
		}
	}
	return false
}

// Pause sends SIGSTOP (a gray failure: the node holds its connections).
func (r *Run) Pause(ctx context.Context, id string) error {
	ev := r.begin(EvPause, []string{id}, nil, "")
	return r.end(ev, r.cl.Pause(id))
}

// Resume sends SIGCONT.
func (r *Run) Resume(ctx context.Context, id string) error {
	ev := r.begin(EvResume, []string{id}, nil, "")
	return r.end(ev, r.cl.Resume(id))
}

func (r *Run) addrs(ids []string) ([]netip.Addr, error) {
	out := make([]netip.Addr, 0, len(ids))
	for _, id := range ids {
		n := r.cl.Node(id)
		if n == nil {
			return nil, fmt.Errorf("no node %q", id)
		}
		out = append(out, n.IP)
	}
	return out, nil
}

func (r *Run) block(ctx context.Context, from, to []string) error {
	if r.fw == nil {
		return errors.New("partitions need root and iptables in the namespace")
	}
	fa, err := r.addrs(from)
	if err != nil {
		return err
	}
	ta, err := r.addrs(to)
	if err != nil {
		return err
	}
	for _, a := range fa {
		for _, b := range ta {
			if err := r.fw.Block(ctx, a, b); err != nil {
				return err
			}
		}
	}
	return nil
}

// Others returns every node id not in ids.
func (r *Run) Others(ids []string) []string {
	var out []string
	for _, n := range r.cl.Nodes() {
		if !slices.Contains(ids, n.ID) {
			out = append(out, n.ID)
		}
	}
	return out
}

// Isolate cuts the group from every other node, both directions. Clients
// can still reach every node.
func (r *Run) Isolate(ctx context.Context, group []string) error {
	rest := r.Others(group)
	ev := r.begin(EvIsolate, group, [][]string{group, rest}, "")
	err := r.block(ctx, group, rest)
	if err == nil {
		err = r.block(ctx, rest, group)
	}
	return r.end(ev, err)
}

// Split cuts two groups from each other, both directions.
func (r *Run) Split(ctx context.Context, a, b []string) error {
	ev := r.begin(EvSplit, append(slices.Clone(a), b...), [][]string{a, b}, "")
	err := r.block(ctx, a, b)
	if err == nil {
		err = r.block(ctx, b, a)
	}
	return r.end(ev, err)
}

// Cut drops packets from the from group to the to group only.
func (r *Run) Cut(ctx context.Context, from, to []string) error {
	ev := r.begin(EvCut, append(slices.Clone(from), to...), [][]string{from, to}, "one direction: first group cannot send to the second")
	return r.end(ev, r.block(ctx, from, to))
}

// Heal removes every partition rule.
func (r *Run) Heal(ctx context.Context) error {
	if r.fw == nil || len(r.fw.Blocked()) == 0 {
		return nil
	}
	ev := r.begin(EvHeal, nil, nil, "")
	return r.end(ev, r.fw.Heal(ctx))
}

// Recover heals partitions, resumes paused nodes and restarts down ones.
func (r *Run) Recover(ctx context.Context) error {
	errs := []error{r.Heal(ctx)}
	for _, id := range r.cl.InState(StateStopped) {
		errs = append(errs, r.Resume(ctx, id))
	}
	errs = append(errs, r.RestartDown(ctx))
	return errors.Join(errs...)
}

package consensus

import (
	"strconv"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// hashicorp/raft reports its own metrics only through go-metrics' global
// sink, which every raft instance of a process shares (tests run several
// nodes in one process); this collector reads the instance's state at
// scrape time instead, so each node's registry shows its own raft.

// raftCollector exposes raft's state, read at scrape time.
type raftCollector struct {
	n *Node

	state, hasLeader, term, lastLog, commit, applied, fsmPending, snapshot,
	lastContact, voters *prometheus.Desc
}

// RaftCollector returns a Prometheus collector of this node's raft state,
// read at scrape time: infermesh_raft_state{state}, infermesh_raft_has_leader,
// infermesh_raft_term, infermesh_raft_last_log_index,
// infermesh_raft_commit_index, infermesh_raft_applied_index,
// infermesh_raft_fsm_pending, infermesh_raft_last_snapshot_index,
// infermesh_raft_last_contact_seconds and infermesh_raft_voters.
func (n *Node) RaftCollector() prometheus.Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("infermesh_raft_"+name, help, labels, nil)
	}
	return &raftCollector{
		n:           n,
		state:       d("state", "1 for the raft state this node is in (follower, candidate, leader, shutdown), 0 for the others.", "state"),
		hasLeader:   d("has_leader", "1 while this node knows a raft leader."),
		term:        d("term", "Current raft term."),
		lastLog:     d("last_log_index", "Index of the last entry in this node's raft log."),
		commit:      d("commit_index", "Index of the last raft entry known to be committed."),
		applied:     d("applied_index", "Index of the last raft entry applied to the state machine."),
		fsmPending:  d("fsm_pending", "Committed raft entries queued for the state machine."),
		snapshot:    d("last_snapshot_index", "Index of the last raft snapshot taken or installed."),
		lastContact: d("last_contact_seconds", "Seconds since this follower last heard from the leader (0 on the leader); absent before any contact."),
		voters:      d("voters", "Voting servers in the raft configuration as this node knows it."),
	}
}

// Describe sends every descriptor.
func (c *raftCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.state, c.hasLeader, c.term, c.lastLog, c.commit, c.applied, c.fsmPending, c.snapshot, c.lastContact, c.voters} {
		ch <- d
	}
}

// Collect reads raft now.
func (c *raftCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.n.raft
	if r == nil {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	cur := r.State()
	for _, s := range []raft.RaftState{raft.Follower, raft.Candidate, raft.Leader, raft.Shutdown} {
		gauge(c.state, boolFloat(cur == s), lowerState(s))
	}
	gauge(c.hasLeader, boolFloat(c.n.Leader() != ""))
	gauge(c.term, float64(r.CurrentTerm()))
	gauge(c.lastLog, float64(r.LastIndex()))
	gauge(c.commit, float64(r.CommitIndex()))
	gauge(c.applied, float64(r.AppliedIndex()))
	stats := r.Stats()
	if v, err := strconv.ParseUint(stats["fsm_pending"], 10, 64); err == nil {
		gauge(c.fsmPending, float64(v))
	}
	if v, err := strconv.ParseUint(stats["last_snapshot_index"], 10, 64); err == nil {
		gauge(c.snapshot, float64(v))
	}
	switch {
	case cur == raft.Leader:
		gauge(c.lastContact, 0)
	case !r.LastContact().IsZero():
		gauge(c.lastContact, time.Since(r.LastContact()).Seconds())
	}
	if f := r.GetConfiguration(); f.Error() == nil {
		voters := 0
		for _, s := range f.Configuration().Servers {
			if s.Suffrage == raft.Voter {
				voters++
			}
		}
		gauge(c.voters, float64(voters))
	}
}

func lowerState(s raft.RaftState) string {
	switch s {
	case raft.Follower:
		return "follower"
	case raft.Candidate:
		return "candidate"
	case raft.Leader:
		return "leader"
	}
	return "shutdown"
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// hasOtherVoter reports whether the raft configuration has a voter other
// than this node: a lone leader has nobody to hand leadership to at
// shutdown (raft would answer "cannot find peer").
func (n *Node) hasOtherVoter() bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return true // unknown: try the transfer
	}
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter && string(s.ID) != n.cfg.NodeID {
			return true
		}
	}
	return false
}

package consensus

import (
	"slices"
	"sort"
	"time"

	"github.com/hashicorp/raft"
)

// Bootstrap by expectation (Config.BootstrapExpect, Consul's
// bootstrap_expect): nodes started together, each joining the others, wait
// until gossip has shown them BootstrapExpect alive servers; then the one
// with the lowest node id among them bootstraps raft with all of them, and
// the others wait to hear from it.
//
// Why it is safe:
//   - raft bootstraps only a node with no raft state at all
//     (raft.BootstrapCluster refuses otherwise, and the loop stops as soon
//     as the node has any state, a configuration or a known leader), so a
//     node that ever belonged to a cluster never bootstraps again, and a
//     restart never bootstraps;
//   - the decision is a pure function of the view (ExpectBootstrap): every
//     node that sees the same set of members picks the same bootstrapper
//     with the same configuration, and nobody else bootstraps;
//   - the view must have stayed the same for ExpectSettle before the
//     bootstrapper acts, long enough for gossip to converge and for the
//     leader of an existing cluster (which adds every member it hears of)
//     to reach a node that joined it, which then stops;
//   - the bootstrap configuration obeys the odd-voter rule (VoterTarget):
//     the lowest ids are voters, the rest non-voters, so two nodes give one
//     voter that elects itself at once.
//
// The operator's part, as with Consul: start exactly BootstrapExpect nodes
// with the flag at the same time; nodes added later join the running
// cluster (with or without the flag: a joined node has state).

// ExpectSettle is how long the membership view must stay the same before
// the chosen node bootstraps.
const ExpectSettle = 2 * time.Second

// expectPoll is how often the expect loop reads the membership view.
const expectPoll = 100 * time.Millisecond

// ExpectBootstrap decides bootstrap-by-expectation for node self from the
// alive members it knows (self included; id → RPC address). It returns the
// configuration to bootstrap and true when self must bootstrap now: at
// least expect members are known and self has the lowest id among them.
// Every known member goes into the configuration, the first
// VoterTarget(maxVoters, n) ids (sorted) as voters, the others as
// non-voters.
func ExpectBootstrap(self string, alive map[string]string, expect, maxVoters int) (raft.Configuration, bool) {
	if expect <= 0 || len(alive) < expect {
		return raft.Configuration{}, false
	}
	if _, ok := alive[self]; !ok {
		return raft.Configuration{}, false
	}
	ids := make([]string, 0, len(alive))
	for id := range alive {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	if ids[0] != self {
		return raft.Configuration{}, false
	}
	voters := VoterTarget(maxVoters, len(ids))
	var cfg raft.Configuration
	for i, id := range ids {
		s := raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(alive[id])}
		if i >= voters {
			s.Suffrage = raft.Nonvoter
		}
		cfg.Servers = append(cfg.Servers, s)
	}
	return cfg, true
}

// aliveMembers is the member table's alive entries with an address.
func (n *Node) aliveMembers() map[string]string {
	out := map[string]string{}
	for id, e := range n.members.all() {
		if e.status == MemberAlive && e.addr != "" {
			out[id] = e.addr
		}
	}
	return out
}

// joinedCluster reports whether this node has raft state or knows a
// leader: then it is part of a cluster and must never bootstrap.
func (n *Node) joinedCluster() bool {
	if n.Leader() != "" || n.raft.LastIndex() > 0 {
		return true
	}
	f := n.raft.GetConfiguration()
	return f.Error() == nil && len(f.Configuration().Servers) > 0
}

// expectLoop waits for Config.BootstrapExpect members and bootstraps when
// this node is the chosen one (see ExpectBootstrap). It ends when the node
// belongs to a cluster or shuts down.
func (n *Node) expectLoop() {
	defer n.wg.Done()
	t := time.NewTicker(expectPoll)
	defer t.Stop()
	var last []string
	var since time.Time
	waiting := time.Now()
	warned := false
	for {
		select {
		case <-n.shutdownCh:
			return
		case <-t.C:
		}
		if n.joinedCluster() {
			n.logger.Info("bootstrap-expect: part of a raft cluster; not bootstrapping")
			return
		}
		alive := n.aliveMembers()
		ids := make([]string, 0, len(alive))
		for id := range alive {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		if !slices.Equal(ids, last) {
			last, since = ids, time.Now()
			n.logger.Info("bootstrap-expect: waiting for servers", "known", len(ids), "expect", n.cfg.BootstrapExpect)
			continue
		}
		if !warned && time.Since(waiting) > time.Minute {
			warned = true
			n.logger.Warn("bootstrap-expect: still no raft cluster", "known", len(ids), "expect", n.cfg.BootstrapExpect)
		}
		if time.Since(since) < ExpectSettle {
			continue
		}
		boot, ok := ExpectBootstrap(n.cfg.NodeID, alive, n.cfg.BootstrapExpect, n.cfg.Voters)
		if !ok {
			continue
		}
		n.logger.Info("bootstrap-expect: bootstrapping raft", "servers", ids)
		if err := n.raft.BootstrapCluster(boot).Error(); err != nil {
			n.logger.Warn("bootstrap-expect: bootstrap refused", "err", err)
			return
		}
		if n.cfg.OnBootstrap != nil {
			go n.cfg.OnBootstrap()
		}
		return
	}
}

// noLeaderWarning is how long a joining node without BootstrapExpect waits
// for a leader before it says why it may never get one.
const noLeaderWarning = 30 * time.Second

// warnNoLeader logs once when a joining node without BootstrapExpect has
// heard from no leader for noLeaderWarning: joining nodes never bootstrap,
// so nodes that all joined each other wait forever.
func (n *Node) warnNoLeader() {
	defer n.wg.Done()
	select {
	case <-n.shutdownCh:
		return
	case <-time.After(noLeaderWarning):
	}
	if !n.joinedCluster() {
		n.logger.Warn("no raft leader yet: a node started with --join never bootstraps; " +
			"if every node of a new mesh was started with --join, start them with --bootstrap-expect N (the number of nodes)")
	}
}

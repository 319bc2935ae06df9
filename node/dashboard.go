package node

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/mesh/route"
	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/auth"
)

// staleRecord is how old a worker's last gossip record may be before the
// dashboard says so. An idle node republishes every 10 s to a few random
// members (heartbeats are not relayed) and push-pull brings every record
// to every node within one push-pull interval (30 s on a LAN, more past
// 32 members), so an idle peer's record is often tens of seconds old.
const staleRecord = 2 * time.Minute

// meshViewDeps are what the dashboard's mesh view reads.
type meshViewDeps struct {
	listen     string // the client listener (the loopback rule)
	trustProxy bool
	clock      func() time.Time
	cluster    *cluster // the peer table and raft, once Start built them
	backend    *backend // this node's readiness
	governance *governance
}

// meshView is the api.DashboardSource: the mesh with each worker's state
// explained, the raft group and the usage ledger by worker.
type meshView struct{ meshViewDeps }

var _ api.DashboardSource = (*meshView)(nil)

// Dashboard describes the mesh for the dashboard.
func (n *meshView) Dashboard() api.MeshView {
	var v api.MeshView
	c := n.cluster
	now := n.clock()
	if c.mesh != nil {
		rv := routingOf(c)
		for _, p := range c.mesh.Peers() {
			v.Workers = append(v.Workers, n.workerView(p, rv, now))
		}
		sort.Slice(v.Workers, func(i, j int) bool { return v.Workers[i].ID < v.Workers[j].ID })
	}
	if c.raft != nil {
		st, err := n.governance.RaftPeers()
		v.Raft = api.RaftView{Leader: c.raft.Leader(), IsLeader: c.raft.IsLeader(), AppliedIndex: c.raft.State().AppliedIndex(), Servers: st.Peers}
		if err != nil {
			v.Raft.Error = err.Error()
		}
		for _, r := range c.raft.State().Usage(consensus.ByNode) {
			v.Usage = append(v.Usage, api.WorkerUsage{Worker: r.Group, Requests: r.Requests, Errors: r.Errors})
		}
		if v.Usage == nil {
			v.Usage = []api.WorkerUsage{}
		}
	}
	return v
}

// workerView is one peer on the dashboard, with its state explained: its
// own settings, the policy's and the effective ones (rv).
func (n *meshView) workerView(p route.Peer, rv routingView, now time.Time) api.WorkerView {
	eff := rv.effective(p)
	w := api.WorkerView{
		ID: p.ID, HTTPAddr: p.HTTPAddr, Version: p.Version, State: p.Health.String(), Self: p.Self,
		Canary: p.Canary, CanaryPercent: p.CanaryPercent, InFlight: p.InFlight, Cap: p.MaxInFlight,
		Outbound: eff.Outbound, QueueDepth: p.QueueDepth, Weight: p.Weight, Models: []api.WorkerModel{},
		Policy: rv.policy(p.ID), Effective: routingOfPeer(eff),
	}
	if !p.Updated.IsZero() {
		w.LastSeenSeconds = max(0, now.Sub(p.Updated).Seconds())
	}
	warm := 0
	for id, m := range p.Models {
		w.Models = append(w.Models, api.WorkerModel{ID: id, WireID: m.WireID, Task: m.Task, Warm: m.Warm,
			LatencyMS: float64(m.Latency.Microseconds()) / 1000, SizeBytes: m.SizeBytes})
		if m.Warm {
			warm++
		}
	}
	sort.Slice(w.Models, func(i, j int) bool { return w.Models[i].ID < w.Models[j].ID })
	// The reason speaks of the cap routing applies.
	p.MaxInFlight = eff.MaxInFlight
	w.State, w.Reason = workerReason(p, warm, now)
	if p.Self && w.State == "ready" {
		if r := n.backend.NotReady(); r != "" {
			w.State, w.Reason = "not_ready", r
		}
	}
	return w
}

// workerReason says in words why a peer is in its state.
func workerReason(p route.Peer, warm int, now time.Time) (string, string) {
	if p.Ejected {
		return "ejected", "a connection to it was refused; no work is sent until gossip reports it ready again"
	}
	state := p.Health.String()
	switch p.Health {
	case route.HealthUnknown:
		return state, "no gossip record received from it yet"
	case route.HealthAlive:
		return state, "running but not ready to serve yet"
	case route.HealthDraining:
		return state, "shutting down: finishing in-flight work, taking no new requests"
	case route.HealthSaturated:
		return state, fmt.Sprintf("reports itself full (%d in flight, cap %s)", p.InFlight, capText(p.MaxInFlight))
	}
	if !p.Self && !p.Updated.IsZero() && now.Sub(p.Updated) > staleRecord {
		return state, fmt.Sprintf("last gossip record %.0f s old", now.Sub(p.Updated).Seconds())
	}
	if p.MaxInFlight > 0 && p.InFlight >= p.MaxInFlight {
		return state, fmt.Sprintf("at its in-flight cap (%d of %d): peers route elsewhere", p.InFlight, p.MaxInFlight)
	}
	switch {
	case len(p.Models) == 0:
		return state, "serving; no models installed"
	case warm == 0:
		return state, fmt.Sprintf("serving; none of its %d models is loaded yet (cold start)", len(p.Models))
	}
	return state, fmt.Sprintf("serving; %d of %d models warm", warm, len(p.Models))
}

func capText(c int) string {
	if c <= 0 {
		return "none"
	}
	return fmt.Sprint(c)
}

// DashboardKeyRequired reports whether the dashboard's data needs a key
// from a caller like r: the loopback rule of node/auth (a loopback-only
// listener, no trusted proxy, and the connection and client address on
// loopback) makes the caller the local operator; everyone else needs a key.
func (n *meshView) DashboardKeyRequired(r *http.Request) bool {
	if !auth.LoopbackOnly(n.listen) || n.trustProxy {
		return true
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return !loopbackIP(host) || !loopbackIP(api.ClientAddr(r.Context()))
}

func loopbackIP(s string) bool {
	ip, err := netip.ParseAddr(s)
	return err == nil && ip.Unmap().IsLoopback()
}

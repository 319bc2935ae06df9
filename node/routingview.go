package node

import (
	"github.com/infermesh/infermesh/mesh/route"
	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/dispatch"
)

// routingView is the routing policy in force and the peers as routing
// sees them (policy applied), by node id; both empty before the cluster's
// dispatcher runs. The member list, the dashboard and the per-peer
// metrics show it beside what each node gossips about itself.
type routingView struct {
	pol   dispatch.Policy
	peers map[string]route.Peer
}

// routingOf reads c's dispatcher's view.
func routingOf(c *cluster) routingView {
	if c == nil || c.disp == nil {
		return routingView{}
	}
	pol, peers := c.disp.Routing()
	v := routingView{pol: pol, peers: make(map[string]route.Peer, len(peers))}
	for _, p := range peers {
		v.peers[p.ID] = p
	}
	return v
}

// policy is the policy's entry for node id as the API shows it; nil when
// the policy has none.
func (v routingView) policy(id string) *api.Routing {
	np, ok := v.pol.Nodes[id]
	if !ok {
		return nil
	}
	return &api.Routing{Weight: int(np.Weight), Canary: np.Canary, CanaryPercent: int(np.CanaryPercent), Cap: int(np.InflightCap)}
}

// effective is how routing treats p: the dispatcher's view of it, else
// (no dispatcher yet) the policy applied to what p gossips.
func (v routingView) effective(p route.Peer) route.Peer {
	if e, ok := v.peers[p.ID]; ok {
		return e
	}
	v.pol.Apply(&p)
	return p
}

// routingOfPeer is p's weight, canary settings and cap as the API shows
// them.
func routingOfPeer(p route.Peer) api.Routing {
	return api.Routing{Weight: p.Weight, Canary: p.Canary, CanaryPercent: p.CanaryPercent, Cap: max(p.MaxInFlight, 0)}
}

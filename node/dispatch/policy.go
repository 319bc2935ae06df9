package dispatch

import (
	"github.com/infermesh/infermesh/consensus/routing"
	"github.com/infermesh/infermesh/mesh/route"
)

// Policy is the pool's routing policy: the strategy and per-node settings
// that override what each node gossips about itself.
type Policy struct {
	// Strategy orders candidates; empty means route.DefaultStrategy.
	Strategy route.Strategy `json:"strategy"`
	// Nodes holds per-node settings by node id. A node with an entry is
	// routed with the entry's weight and canary settings (and its cap when
	// set) instead of the ones it gossips.
	Nodes map[string]routing.Node `json:"nodes,omitempty"`
}

// Apply sets p's weight, canary settings and in-flight cap to the ones
// routing uses: the policy's entry for the node where it has one (the cap
// only when the entry sets one), else what the node gossips.
func (pol Policy) Apply(p *route.Peer) {
	np, ok := pol.Nodes[p.ID]
	if !ok {
		return
	}
	p.Weight, p.Canary, p.CanaryPercent = int(np.Weight), np.Canary, int(np.CanaryPercent)
	if np.InflightCap > 0 {
		p.MaxInFlight = int(np.InflightCap)
	}
}

// PolicySource supplies the current policy. Dispatch calls it on every
// request, so it must be cheap. The node serves the replicated policy
// (consensus) through it.
type PolicySource interface {
	// Policy returns the policy in force now; its Nodes map is shared and
	// must not be modified.
	Policy() Policy
}

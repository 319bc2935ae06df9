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

// PolicySource supplies the current policy. Dispatch calls it on every
// request, so it must be cheap. The node serves the replicated policy
// (consensus) through it.
type PolicySource interface {
	// Policy returns the policy in force now; its Nodes map is shared and
	// must not be modified.
	Policy() Policy
}

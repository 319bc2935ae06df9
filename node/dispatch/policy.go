package dispatch

import "github.com/infermesh/infermesh/mesh/route"

// Policy is the pool's routing policy: the strategy and per-node settings
// that override what each node gossips about itself.
type Policy struct {
	// Strategy orders candidates; empty means route.DefaultStrategy.
	Strategy route.Strategy `json:"strategy"`
	// Nodes holds per-node settings by node id. A node with an entry is
	// routed with the entry's weight and canary settings (and its cap when
	// set) instead of the ones it gossips.
	Nodes map[string]NodePolicy `json:"nodes,omitempty"`
}

// NodePolicy is the policy for one node.
type NodePolicy struct {
	// Weight for the weighted strategy; below 1 counts as 1.
	Weight int `json:"weight,omitempty"`
	// Canary marks the node as a canary.
	Canary bool `json:"canary,omitempty"`
	// CanaryPercent is the share of callers (0-100) the canary receives.
	CanaryPercent int `json:"canary_percent,omitempty"`
	// MaxInFlight caps the node's in-flight requests; 0 keeps the node's own.
	MaxInFlight int `json:"max_in_flight,omitempty"`
}

// PolicySource supplies the current policy. Dispatch calls it on every
// request, so it must be cheap. The node serves the replicated policy
// (consensus) through it.
type PolicySource interface {
	// Policy returns the policy in force now; its Nodes map is shared and
	// must not be modified.
	Policy() Policy
}

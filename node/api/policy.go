package api

import "github.com/infermesh/infermesh/consensus/routing"

// Policy is the pool policy as operators write it: the body of
// GET/PUT /v1/server/policy and the shape of <data-dir>/gateway.json.
// The node checks it (strategy, governance, plan and model ids are its
// vocabulary) and stores it through raft.
type Policy struct {
	// Strategy is the routing strategy (round-robin, least-latency,
	// least-connections, weighted, sticky, prefix or prefix.<strategy>);
	// empty means round-robin.
	Strategy string `json:"strategy,omitempty"`
	// Governance is the model pull mode: curated, federated or open; empty
	// means open.
	Governance string `json:"governance,omitempty"`
	// Plan is the server plan, free or pro (spec Limits); empty means
	// pro. On Free, third-party callers share a small daily allowance.
	Plan string `json:"plan,omitempty"`
	// FirstPartyApps lists the applications whose keys are first-party
	// (exempt from the Free allowance).
	FirstPartyApps []string `json:"first_party_apps,omitempty"`
	// Workers holds routing settings by node id; they override what those
	// nodes gossip about themselves.
	Workers map[string]routing.Node `json:"workers,omitempty"`
	// Models holds lifecycle and prices by canonical model id.
	Models map[string]ModelPolicy `json:"models,omitempty"`
	// Revision is the raft index of the last policy change, 0 when none
	// was made; the node sets it and ignores it in a written policy.
	Revision uint64 `json:"revision,omitempty"`
}

// ModelPolicy is one model's lifecycle and price in a Policy. Prices are in
// currency units (the monthly budget's unit).
type ModelPolicy struct {
	// Lifecycle is active, deprecated or blocked; empty means active.
	// Blocked models are hidden, not routed and not pulled; responses for
	// deprecated ones carry X-AI-Model-Deprecated.
	Lifecycle string `json:"lifecycle,omitempty"`
	// Replacement is the model id sent in X-AI-Model-Deprecated while this
	// one is deprecated ("true" is sent when it is empty).
	Replacement string `json:"replacement,omitempty"`
	// PerRequest is the price of one request.
	PerRequest float64 `json:"price_per_request,omitempty"`
	// PerMInput is the price of a million input tokens.
	PerMInput float64 `json:"price_per_million_input_tokens,omitempty"`
	// PerMOutput is the price of a million output tokens.
	PerMOutput float64 `json:"price_per_million_output_tokens,omitempty"`
}

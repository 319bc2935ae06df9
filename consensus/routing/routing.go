// Package routing is the one type of a node's routing settings in the pool
// policy: its weight, canary share and in-flight cap, which override what
// the node gossips about itself. consensus stores it (inside its protobuf
// commands and snapshots, whose encoding is its own), node/dispatch ranks
// peers with it, and node/api sends it as the policy document's workers.
// It imports nothing, so the API and dispatch use it without seeing raft.
package routing

// Node is one node's routing settings. The JSON is the policy document's
// (GET/PUT /v1/server/policy, <data-dir>/gateway.json).
type Node struct {
	// Weight is the node's weight for the weighted strategy; below 1
	// counts as 1.
	Weight int32 `json:"weight,omitempty"`
	// Canary marks the node as a canary.
	Canary bool `json:"canary,omitempty"`
	// CanaryPercent is the share of callers (0..100) the canary receives.
	CanaryPercent int32 `json:"canary_percent,omitempty"`
	// InflightCap caps the node's in-flight requests; 0 keeps the node's
	// own cap.
	InflightCap int32 `json:"inflight_cap,omitempty"`
}

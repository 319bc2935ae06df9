// Package route ranks the nodes that could serve a request. Every function
// here is pure: it takes the request facts and a snapshot of peer views and
// returns an ordered list of candidates, with no I/O, clocks or shared state,
// so each strategy can be tested by itself. Callers supply anything that
// varies per request (a round-robin counter, a random seed).
package route

import "time"

// Health is a node's serving state as it reports it through gossip.
type Health uint8

// Health values. Only HealthReady and HealthSaturated nodes are routable.
const (
	// HealthUnknown means no record has been received for the node yet.
	HealthUnknown Health = iota
	// HealthAlive means the node runs but is not ready to serve.
	HealthAlive
	// HealthReady means the node serves requests.
	HealthReady
	// HealthSaturated means the node is ready but reports itself full.
	HealthSaturated
	// HealthDraining means the node finishes in-flight work and takes no more.
	HealthDraining
)

// String returns the lower-case name used in logs and the members listing.
func (h Health) String() string {
	switch h {
	case HealthAlive:
		return "alive"
	case HealthReady:
		return "ready"
	case HealthSaturated:
		return "saturated"
	case HealthDraining:
		return "draining"
	default:
		return "unknown"
	}
}

// Model is one model installed on a peer.
type Model struct {
	// Warm reports whether the model is loaded and serves without a cold start.
	Warm bool
	// Latency is the peer's moving average of the time to serve a request for
	// this model; 0 means no measurement yet.
	Latency time.Duration
	// WireID, Task and Created describe the model (see mesh.ModelInfo).
	WireID string
	// Task is what the model does (embeddings, chat, background-removal,
	// ...).
	Task string
	// Created is when the peer installed the model, Unix seconds.
	Created int64
	// SizeBytes is the size of the model's files on the peer; 0 for
	// upstream models.
	SizeBytes int64
}

// Peer is a read-only view of one node of the mesh, as the peer table sees it
// now. Views are plain values; the Models map is shared between snapshots
// and must not be modified.
type Peer struct {
	// ID is the node id (memberlist name, raft server id, X-Service-Backend).
	ID string
	// HTTPAddr is the node's advertised client HTTP address.
	HTTPAddr string
	// RPCAddr is the address to dial for Connect RPCs.
	RPCAddr string
	// GossipAddr is the node's memberlist address.
	GossipAddr string
	// Version is the node's software version.
	Version string
	// Self marks the node the view was taken on.
	Self bool
	// Health is the node's reported serving state.
	Health Health
	// Ejected is set when a connection to the node was refused and gossip has
	// not since reported it ready with a newer record.
	Ejected bool
	// InFlight is the number of requests the node is serving.
	InFlight int
	// MaxInFlight is the node's in-flight cap; 0 means no cap.
	MaxInFlight int
	// Outbound is the number of requests this node has in flight to the
	// peer now (exact, unlike InFlight, which arrives by gossip).
	Outbound int
	// QueueDepth is the node's image jobs running plus waiting (its image
	// gate), which image work is routed by.
	QueueDepth int
	// Weight is the node's weight for the weighted strategy; values below 1
	// count as 1.
	Weight int
	// Canary marks a canary node.
	Canary bool
	// CanaryPercent is the share of callers (0-100) a canary node receives.
	CanaryPercent int
	// Models holds the installed models by canonical id.
	Models map[string]Model
	// Updated is when the node produced the record the view is built from.
	Updated time.Time
	// Prefixes summarises the chat prefixes the node served recently, for
	// the prefix strategies; its bytes are shared and must not be
	// modified.
	Prefixes PrefixDigest
}

// Routable reports whether the peer may receive new work at all: it is ready
// (or ready but saturated), not draining and not ejected.
func (p *Peer) Routable() bool {
	return !p.Ejected && (p.Health == HealthReady || p.Health == HealthSaturated)
}

// HasRoom reports whether the peer is below its in-flight cap and does not
// report itself saturated, as its last record says. A remote peer's record
// is up to one record interval old; see SurelyFull for what is known
// exactly.
func (p *Peer) HasRoom() bool {
	if p.Health == HealthSaturated {
		return false
	}
	return p.MaxInFlight <= 0 || p.InFlight < p.MaxInFlight
}

// SurelyFull reports whether the peer is at its cap by what this node
// knows exactly: its own in-flight count for itself, its own outstanding
// calls (Outbound) for a remote peer. A remote peer whose record says
// full may have freed slots since; it is still worth a try, and refuses
// with 503 (answered by the next candidate, before the first byte) if it
// really is full.
func (p *Peer) SurelyFull() bool {
	if p.MaxInFlight <= 0 {
		return false
	}
	if p.Self {
		return p.InFlight >= p.MaxInFlight
	}
	return p.Outbound >= p.MaxInFlight
}

// Has reports whether the peer has the model installed. The empty model
// matches every peer (requests that are not tied to a model).
func (p *Peer) Has(model string) bool {
	if model == "" {
		return true
	}
	_, ok := p.Models[model]
	return ok
}

// Warm reports whether the peer has the model loaded. The empty model counts
// as warm everywhere.
func (p *Peer) Warm(model string) bool {
	if model == "" {
		return true
	}
	return p.Models[model].Warm
}

func (p *Peer) weight() int {
	if p.Weight < 1 {
		return 1
	}
	return p.Weight
}

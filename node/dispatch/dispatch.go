// Package dispatch decides where a request runs: it ranks the candidates
// with mesh/route over the gossiped peer table, serves on this node through
// the local handler when this node comes first, otherwise forwards the
// request to the peer over mesh/forward, and streams the chosen node's
// response to the client with X-Service-Backend naming it. It fails over to
// the next candidate only while nothing has reached the client.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/mesh/route"
	"github.com/infermesh/infermesh/node/prefix"
)

// BackendHeader names the node that served a response.
const BackendHeader = "X-Service-Backend"

// Peers is the peer table dispatch reads (mesh.Mesh implements it).
type Peers interface {
	// Peers returns every member, this node included (Self set). The slice
	// is read-only.
	Peers() []route.Peer
	// Serving returns the routable members holding model (this node
	// included), prepared when the table changes rather than per call, so
	// routing a request does not scan every member. The slice is
	// read-only.
	Serving(model string) []route.Peer
	// Eject takes a peer out of routing until gossip says it is ready again.
	Eject(id string)
	// Refused is Eject for a peer that refused a connection (its process
	// is gone); the other nodes are told and eject it too.
	Refused(id string)
}

// Load receives this node's load for its gossiped record (mesh.Mesh
// implements it).
type Load interface {
	// SetInFlight records the requests this node serves now.
	SetInFlight(n int)
	// ObserveLatency adds a serve time for a model to its moving average.
	ObserveLatency(model string, d time.Duration)
}

// Forwarder sends a request to a peer (forward.Client implements it).
type Forwarder interface {
	// Forward sends req to the peer at RPC address addr and returns its
	// response stream; cancel ctx to abandon the call.
	Forward(ctx context.Context, addr string, req *forward.Request) (*forward.Stream, error)
}

// ErrorWriter writes an error response in the API's format. Dispatch uses it
// only for answers it gives itself: every node saturated or no candidate
// reachable (503, Retry-After already set), or a peer that failed before
// responding in a way that must not be retried (502).
type ErrorWriter func(w http.ResponseWriter, r *http.Request, status int, message string)

// Config configures a Dispatcher.
type Config struct {
	// NodeID is this node's id.
	NodeID string
	// MaxAttempts bounds how many candidates one request tries. Default 4.
	MaxAttempts int
	// MaxInFlight caps this node's own in-flight requests when the policy
	// sets no cap for it; 0 means no cap.
	MaxInFlight int
	// DropRequestHeaders are removed from requests forwarded to peers.
	// Default: Authorization (the serving node does not authenticate again;
	// the caller's identity travels in forward.Caller instead).
	DropRequestHeaders []string
	// WriteError writes dispatch's own error answers; default a JSON body
	// in the OpenAI error shape.
	WriteError ErrorWriter
	// Clock measures serve times for the latency average; default time.Now.
	Clock func() time.Time
}

// Facts are what the API layer knows about a request.
type Facts struct {
	// Model is the canonical model id; empty for requests not tied to one
	// (served locally).
	Model string
	// RequestID is the request id, carried to the serving node.
	RequestID string
	// Caller is the identity auth established.
	Caller forward.Caller
	// RouteKey identifies the caller for sticky routing and the canary
	// split; empty means Caller.KeyID, else the client's IP address.
	RouteKey string
	// OnePiece says the response is not a stream of server-sent events, so
	// a peer returns it in one unary message (less framing than the
	// stream). Leave it false when unsure: streaming works for any response.
	OnePiece bool
}

// Outcome reports how a request was served, for logs, usage and audit.
type Outcome struct {
	// Backend is the node whose response the client received; empty when
	// dispatch answered itself.
	Backend string
	// Status is the status the client received.
	Status int
	// Attempts counts the candidates tried.
	Attempts int
	// Forwarded is set when a peer served the request.
	Forwarded bool
	// Saturated is set when every candidate was at its cap.
	Saturated bool
	// Usage is the token usage the serving handler reported.
	Usage forward.Usage
	// Err is set when no node could serve, or when the response broke off
	// after it started (the client saw an incomplete body). When the body
	// broke off, the API layer may abort the connection (panic with
	// http.ErrAbortHandler) so the client sees the failure.
	Err error
}

// ErrIncomplete wraps failures after the response head reached the client.
var ErrIncomplete = errors.New("dispatch: response incomplete")

// Dispatcher routes requests. It is safe for concurrent use.
type Dispatcher struct {
	cfg    Config
	log    *slog.Logger
	local  http.Handler
	peers  Peers
	fwd    Forwarder
	policy PolicySource
	load   Load
	met    *metrics
	salt   uint64
	drop   map[string]bool

	counter  atomic.Uint64
	inFlight atomic.Int64
	outbound sync.Map // peer id -> *atomic.Int64
	watch    *watcher
}

// New builds a Dispatcher. local is the node's local-only handler (engines,
// no auth, limits or routing); the Dispatcher wraps it with in-flight
// accounting and the cap, see Local. load may be nil.
func New(cfg Config, local http.Handler, peers Peers, fwd Forwarder, policy PolicySource, load Load, logger *slog.Logger, reg prometheus.Registerer) (*Dispatcher, error) {
	if cfg.NodeID == "" || local == nil || peers == nil || fwd == nil || policy == nil {
		return nil, errors.New("dispatch: node id, local handler, peers, forwarder and policy are required")
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 4
	}
	if cfg.DropRequestHeaders == nil {
		cfg.DropRequestHeaders = []string{"Authorization"}
	}
	if cfg.WriteError == nil {
		cfg.WriteError = writeJSONError
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	met, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{
		cfg: cfg, log: logger.With("component", "dispatch", "node", cfg.NodeID),
		local: local, peers: peers, fwd: fwd, policy: policy, load: load, met: met,
		salt: hash64(cfg.NodeID), drop: map[string]bool{}, watch: newWatcher(peers),
	}
	for _, h := range cfg.DropRequestHeaders {
		d.drop[http.CanonicalHeaderKey(h)] = true
	}
	return d, nil
}

// InFlight returns the requests this node serves now (local and forwarded
// in).
func (d *Dispatcher) InFlight() int { return int(d.inFlight.Load()) }

// Serve routes one request and writes the response to w. body is the
// request body the API layer already read and limited. A request that
// arrived forwarded from a peer is always served here (hop limit).
func (d *Dispatcher) Serve(w http.ResponseWriter, r *http.Request, f Facts, body []byte) Outcome {
	if _, forwarded := forward.InfoFrom(r.Context()); forwarded {
		// Already counted by Local on the way in from the forward server.
		o, _ := d.tryLocal(w, r, f, body, true, false)
		return o
	}
	if f.Model == "" {
		o, _ := d.tryLocal(w, r, f, body, true, true)
		d.met.outcomes.WithLabelValues("local").Inc()
		return o
	}
	pol := d.policy.Policy()
	n := d.counter.Add(1)
	rf := route.Facts{
		Model:   f.Model,
		Caller:  routeKey(f, r),
		Counter: n,
		Seed:    route.Seed(n, d.salt),
	}
	// Image work is heavy and queued per node: the least-queued holder
	// first (the strategy breaks ties).
	rf.LeastQueued = strings.HasPrefix(r.URL.Path, "/v1/images/")
	if pol.Strategy.PrefixAware() && strings.HasSuffix(r.URL.Path, "/chat/completions") {
		rf.Prefixes = prefix.RequestHashes(f.Model, body)
	}
	res := route.Rank(pol.Strategy, rf, d.view(pol, f.Model))

	if len(res.Candidates) == 0 {
		if res.Saturated {
			d.met.outcomes.WithLabelValues("saturated").Inc()
			d.writeSaturated(w, r, res.RetryAfter)
			return Outcome{Status: http.StatusServiceUnavailable, Saturated: true}
		}
		// No node has the model: the local handler gives the answer (model
		// not found, or a pull).
		o, _ := d.tryLocal(w, r, f, body, true, true)
		d.met.outcomes.WithLabelValues("local").Inc()
		return o
	}
	cands := res.Candidates
	if len(cands) > d.cfg.MaxAttempts {
		cands = cands[:d.cfg.MaxAttempts]
	}
	var errs []error
	for i := range cands {
		p := &cands[i]
		last := i == len(cands)-1
		if err := r.Context().Err(); err != nil {
			return Outcome{Attempts: i, Err: err}
		}
		var o Outcome
		var done bool
		switch up := upgradeProtocol(r); {
		case p.Self:
			o, done = d.tryLocal(w, r, f, body, last, true)
		case up != "":
			o, done = d.tryUpgrade(w, r, f, p, up, last)
		default:
			o, done = d.tryRemote(w, r, f, body, p, last)
		}
		o.Attempts = i + 1
		if done {
			d.met.attempts.Observe(float64(o.Attempts))
			switch {
			case o.Backend == "":
				d.met.outcomes.WithLabelValues("failed").Inc()
			case o.Forwarded:
				d.met.outcomes.WithLabelValues("forwarded").Inc()
			default:
				d.met.outcomes.WithLabelValues("local").Inc()
			}
			return o
		}
		d.met.retries.Inc()
		d.log.Info("retrying on the next candidate", "request_id", f.RequestID, "model", f.Model, "peer", p.ID, "err", o.Err)
		errs = append(errs, fmt.Errorf("%s: %w", p.ID, o.Err))
	}
	// Every candidate failed transiently before a byte reached the client.
	err := errors.Join(errs...)
	if cerr := r.Context().Err(); cerr != nil {
		return Outcome{Attempts: len(cands), Err: cerr}
	}
	d.met.outcomes.WithLabelValues("failed").Inc()
	d.log.Warn("no candidate could serve", "request_id", f.RequestID, "model", f.Model, "err", err)
	w.Header().Set("Retry-After", "1")
	d.cfg.WriteError(w, r, http.StatusServiceUnavailable, "no node could serve the request; retry shortly")
	return Outcome{Status: http.StatusServiceUnavailable, Attempts: len(cands), Err: err}
}

// view copies the peers that serve model, applies the policy's per-node
// settings and this node's own exact load. Rank would skip every other
// member, so they are not copied: the cost follows the model's holders,
// not the size of the mesh.
func (d *Dispatcher) view(pol Policy, model string) []route.Peer {
	return d.viewOf(pol, d.peers.Serving(model))
}

// viewOf is view over the peers src.
func (d *Dispatcher) viewOf(pol Policy, src []route.Peer) []route.Peer {
	out := make([]route.Peer, len(src))
	copy(out, src)
	for i := range out {
		p := &out[i]
		pol.Apply(p)
		if p.Self {
			p.InFlight = int(d.inFlight.Load())
			p.MaxInFlight = d.localCap(pol)
			continue
		}
		// Requests this node has in flight to the peer now.
		if c, ok := d.outbound.Load(p.ID); ok {
			p.Outbound = int(c.(*atomic.Int64).Load())
			if p.Outbound > p.InFlight {
				p.InFlight = p.Outbound
			}
		}
	}
	return out
}

// Routing returns the policy in force and the peer table as routing sees
// it now: each peer with the policy's weight, canary settings and cap
// applied (Policy.Apply), this node's own exact load and cap, and the
// requests in flight to each peer. The dashboard, the member list and
// the per-peer metrics show it beside what each node gossips.
func (d *Dispatcher) Routing() (Policy, []route.Peer) {
	pol := d.policy.Policy()
	return pol, d.viewOf(pol, d.peers.Peers())
}

// localCap is this node's in-flight cap.
func (d *Dispatcher) localCap(pol Policy) int {
	if np, ok := pol.Nodes[d.cfg.NodeID]; ok && np.InflightCap > 0 {
		return int(np.InflightCap)
	}
	return d.cfg.MaxInFlight
}

func (d *Dispatcher) outboundCounter(id string) *atomic.Int64 {
	if c, ok := d.outbound.Load(id); ok {
		return c.(*atomic.Int64)
	}
	c, _ := d.outbound.LoadOrStore(id, new(atomic.Int64))
	return c.(*atomic.Int64)
}

// writeSaturated answers 503 with Retry-After in whole seconds.
func (d *Dispatcher) writeSaturated(w http.ResponseWriter, r *http.Request, after time.Duration) {
	secs := int((after + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", fmt.Sprint(max(secs, 1)))
	d.cfg.WriteError(w, r, http.StatusServiceUnavailable, "every node that serves this model is at capacity; retry later")
}

// routeKey picks the caller identity for sticky routing and canaries.
func routeKey(f Facts, r *http.Request) string {
	switch {
	case f.RouteKey != "":
		return f.RouteKey
	case f.Caller.KeyID != "":
		return "key:" + f.Caller.KeyID
	}
	addr := f.Caller.ClientAddress
	if addr == "" {
		addr = r.RemoteAddr
	}
	if host, _, err := net.SplitHostPort(addr); err == nil {
		addr = host
	}
	if addr == "" {
		return ""
	}
	return "ip:" + addr
}

// retryableStatus lists the statuses that fail over to the next candidate.
func retryableStatus(code int) bool {
	return code == http.StatusBadGateway || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout
}

// errUnavailable marks an attempt that ended in a retryable status.
var errUnavailable = errors.New("candidate answered with a retryable status")

func hash64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// ServeOn serves a request on the node the caller named: here when it is
// this node, else forwarded to that peer only. There is no failover,
// because the caller chose the node (a pull that should install a model
// there); a peer that is gone or unreachable is a 503 with Retry-After.
func (d *Dispatcher) ServeOn(w http.ResponseWriter, r *http.Request, f Facts, nodeID string, body []byte) Outcome {
	if nodeID == d.cfg.NodeID {
		o, _ := d.tryLocal(w, r, f, body, true, true)
		return o
	}
	for _, p := range d.peers.Peers() {
		if p.ID != nodeID || p.Health == route.HealthDraining || p.Ejected {
			continue
		}
		o, done := d.tryRemote(w, r, f, body, &p, true)
		if done {
			return o
		}
		w.Header().Set("Retry-After", "1")
		d.cfg.WriteError(w, r, http.StatusServiceUnavailable, fmt.Sprintf("node %s could not take the request: %v", nodeID, o.Err))
		return Outcome{Status: http.StatusServiceUnavailable, Attempts: 1, Err: o.Err}
	}
	w.Header().Set("Retry-After", "1")
	d.cfg.WriteError(w, r, http.StatusServiceUnavailable, fmt.Sprintf("node %s is not routable now (draining, unreachable or gone)", nodeID))
	return Outcome{Status: http.StatusServiceUnavailable}
}

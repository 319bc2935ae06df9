package node

import (
	"cmp"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/infermesh/infermesh/consensus"

	"context"
	"fmt"

	"github.com/infermesh/infermesh/mesh/route"

	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/models"
)

// backendDeps are what the api.Backend reads: this node's store and
// engines, and the cluster (gossiped peers, replicated policy and
// readiness) whose parts Start fills in.
type backendDeps struct {
	nodeID, version, engine string
	clock                   func() time.Time
	store                   *models.Store
	engines                 *engines
	imageGate               *api.ImageGate
	cluster                 *cluster     // parts nil until Start built them
	draining                *atomic.Bool // set by Drain
	started                 *time.Time   // set by Start
}

// backend is the api.Backend: the mesh's models, their resolution and
// routing verdict, this node's engines, and readiness.
type backend struct{ backendDeps }

func newBackend(d backendDeps) *backend { return &backend{d} }

var _ api.Backend = (*backend)(nil)

func (n *backend) toAPI(m *models.Manifest) api.Model {
	return api.Model{
		ID: m.ID, WireID: m.WireID(), Runtime: m.Runtime(), Task: m.Task,
		Modalities: m.Modalities, Created: m.Created, SizeBytes: m.TotalSize(),
		Warm: n.engines.isWarm(m.ID), ResidentBytes: n.engines.mem.bytes(m.ID),
	}
}

// Models lists the mesh's models: this node's installed ones, the
// configured providers' and those the routable peers gossip, merged by
// canonical id, without the ones the operator blocked, sorted by id.
func (n *backend) Models() []api.Model {
	seen := n.merge()
	out := make([]api.Model, 0, len(seen))
	for _, m := range seen {
		if m, ok := n.withLifecycle(m); ok {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// merge is the mesh's models by canonical id: the store's, the
// providers' (over the store's), and the routable peers' (adding warmth
// and size to an entry already seen).
func (n *backend) merge() map[string]api.Model {
	seen := map[string]api.Model{}
	for _, m := range n.store.List() {
		seen[m.ID] = n.toAPI(m)
	}
	for _, m := range n.engines.upstreamModels() {
		seen[m.ID] = m
	}
	if n.cluster.mesh == nil {
		return seen
	}
	for _, p := range n.cluster.mesh.Peers() {
		if p.Self || p.Health == route.HealthDraining || p.Health == route.HealthUnknown {
			continue
		}
		for id, pm := range p.Models {
			if cur, ok := seen[id]; ok {
				cur.Warm = cur.Warm || pm.Warm
				cur.SizeBytes = max(cur.SizeBytes, pm.SizeBytes)
				seen[id] = cur
				continue
			}
			runtime, _, _ := strings.Cut(id, "/")
			seen[id] = api.Model{ID: id, WireID: pm.WireID, Runtime: runtime, Task: pm.Task, Created: pm.Created, Warm: pm.Warm, SizeBytes: pm.SizeBytes}
		}
	}
	return seen
}

// withLifecycle applies the replicated lifecycle to a listed model: false
// for one the operator blocked (hidden, so not routable), the replacement
// marked on a deprecated one.
func (n *backend) withLifecycle(m api.Model) (api.Model, bool) {
	lc, repl := n.cluster.modelLifecycle(m.ID)
	if lc == consensus.LifecycleBlocked {
		return api.Model{}, false
	}
	if lc == consensus.LifecycleDeprecated {
		m.Deprecation = cmp.Or(repl, "true")
	}
	return m, true
}

// Model resolves a canonical or wire id among the mesh's models: the
// entry Models would list first among those matching. Only the matching
// entries are checked against the lifecycle and nothing is sorted (the
// whole list per routed request showed in the entry node's profile).
func (n *backend) Model(id string) (api.Model, bool) {
	if m, err := n.store.Get(id); err == nil {
		return n.withLifecycle(n.toAPI(m))
	}
	var best api.Model
	found := false
	for _, m := range n.merge() {
		if m.ID != id && (m.WireID == "" || m.WireID != id) {
			continue
		}
		if found && m.ID >= best.ID {
			continue
		}
		if m, ok := n.withLifecycle(m); ok {
			best, found = m, true
		}
	}
	return best, found
}

// ImageGate is the node's image gate (api.ImageGater): ImageConcurrency
// jobs at once, ImageQueue waiting; its depth is gossiped.
func (n *backend) ImageGate() *api.ImageGate { return n.imageGate }

// Route resolves the model a routed request names, once: the policy's
// block, the task's default model when id is "", a model whose every
// holder is draining, and the mesh-wide resolution, in that order.
func (n *backend) Route(id, defaultTask string) (api.Model, api.Verdict) {
	if id != "" && n.blocked(id) {
		return api.Model{}, api.VerdictBlocked
	}
	if id == "" && defaultTask != "" {
		// The default model of the task is never a blocked one.
		id = n.DefaultModel(defaultTask)
	}
	if (id != "" || defaultTask != "") && n.drainingOnly(id, defaultTask) {
		return api.Model{}, api.VerdictDraining
	}
	m, ok := n.Model(id)
	if id == "" || !ok {
		return api.Model{}, api.VerdictLocal
	}
	return m, api.VerdictServe
}

// DefaultModel is the first model (by id) of a task in the mesh.
func (n *backend) DefaultModel(task string) string {
	for _, m := range n.Models() {
		if m.Task == task {
			return m.ID
		}
	}
	return ""
}

// Embedder returns the embeddings engine of a model.
func (n *backend) Embedder(ctx context.Context, id string) (engine.Embedder, error) {
	e, err := n.engines.get(ctx, id, engine.TaskEmbeddings)
	if err != nil {
		return nil, err
	}
	return e.(engine.Embedder), nil
}

// Chatter returns the chat engine of a model.
func (n *backend) Chatter(ctx context.Context, id string) (engine.Chatter, error) {
	e, err := n.engines.get(ctx, id, engine.TaskChat)
	if err != nil {
		return nil, err
	}
	return e.(engine.Chatter), nil
}

// ImageGenerator returns the image generation engine of a model.
func (n *backend) ImageGenerator(ctx context.Context, id string) (engine.ImageGenerator, error) {
	e, err := n.engines.get(ctx, id, engine.TaskImageGeneration)
	if err != nil {
		return nil, err
	}
	return e.(engine.ImageGenerator), nil
}

// TaskEngine returns the engine of a model for a task, or of the first
// installed model of the task the policy does not block when id is empty.
// A model the policy blocks is refused with 403 model_blocked.
func (n *backend) TaskEngine(ctx context.Context, task engine.Task, id string) (engine.Engine, string, error) {
	if id == "" {
		for _, m := range n.store.List() {
			if engine.Task(m.Task) == task && !n.blocked(m.ID) {
				id = m.ID
				break
			}
		}
		if id == "" {
			return nil, "", fmt.Errorf("no %s model installed: %w", task, api.ErrModelNotFound)
		}
	} else if n.blocked(id) {
		return nil, "", blockedError(id)
	}
	e, err := n.engines.get(ctx, id, task)
	if err != nil {
		return nil, "", err
	}
	return e, e.ID(), nil
}

// blockedError is the answer to a request naming a model the policy blocks.
func blockedError(id string) *apierr.Error {
	return apierr.New(http.StatusForbidden, apierr.TypePermission, apierr.CodeModelBlocked, "model",
		fmt.Sprintf("The model '%s' is blocked by the pool policy.", id))
}

// blocked reports whether the pool policy blocks model id (canonical or
// wire id of a model of this node or a peer).
func (n *backend) blocked(id string) bool {
	lc, _ := n.cluster.modelLifecycle(n.canonicalID(id))
	return lc == consensus.LifecycleBlocked
}

// canonicalID resolves a wire id to the canonical id of the model some
// node holds; other ids come back unchanged.
func (n *backend) canonicalID(id string) string {
	if m, err := n.store.Get(id); err == nil {
		return m.ID
	}
	for _, m := range n.engines.upstreamModels() {
		if m.ID == id || m.WireID == id {
			return m.ID
		}
	}
	if n.cluster.mesh != nil {
		for _, p := range n.cluster.mesh.Peers() {
			for mid, pm := range p.Models {
				if mid == id || (pm.WireID != "" && pm.WireID == id) {
					return mid
				}
			}
		}
	}
	return id
}

// Draining reports whether the node is shutting down.
func (n *backend) Draining() bool { return n.draining.Load() }

// NotReady says why keyed requests may not be served yet: the raft
// replica that holds the API keys has not caught up with a leader since
// the node started (consensus.Node.Usable); "" when the node is ready.
// A replica that caught up stays ready when the quorum is lost later:
// inference needs the keys, not a leader.
func (n *backend) NotReady() string {
	c := n.cluster
	if c.raft == nil {
		return "the node's cluster is not started"
	}
	if c.raft.Usable() {
		return ""
	}
	if c.raft.Leader() == "" {
		return "no raft leader is known yet, so this node's copy of the API keys may be stale"
	}
	return "this node's copy of the API keys and policy is catching up with the raft leader"
}

// WritesBlocked says why writes to the replicated state (keys, policy,
// quotas) cannot commit now, or "" when a leader is known. A node stays
// ready for inference while it is not "".
func (n *backend) WritesBlocked() string {
	c := n.cluster
	switch {
	case c.raft == nil:
		return "the node's cluster is not started"
	case c.raft.Leader() == "":
		return "no raft leader is known: key, policy and quota writes wait for a quorum"
	}
	return ""
}

// drainingOnly reports whether model id (canonical or wire id; "" means
// any model of task) is held by some node and every node that holds it is
// draining, this one included. Peers whose health is unknown count as
// neither.
func (n *backend) drainingOnly(id, task string) bool {
	if id == "" && task == "" {
		return false
	}
	matches := func(canonical, wire, mtask string) bool {
		if id != "" {
			return canonical == id || (wire != "" && wire == id)
		}
		return mtask == task && !n.blocked(canonical)
	}
	held, live := false, false
	self := n.Draining()
	for _, m := range n.store.List() {
		if matches(m.ID, m.WireID(), m.Task) {
			held, live = true, live || !self
		}
	}
	for _, m := range n.engines.upstreamModels() {
		if matches(m.ID, m.WireID, m.Task) {
			held, live = true, live || !self
		}
	}
	if n.cluster.mesh != nil {
		for _, p := range n.cluster.mesh.Peers() {
			if p.Self {
				continue
			}
			for mid, pm := range p.Models {
				if !matches(mid, pm.WireID, pm.Task) {
					continue
				}
				switch p.Health {
				case route.HealthDraining:
					held = true
				case route.HealthUnknown:
				default:
					held, live = true, true
				}
			}
		}
	}
	return held && !live
}

// Status is the dashboard's view of this node.
func (n *backend) Status() api.NodeStatus {
	state := "ready"
	if n.Draining() {
		state = "draining"
	}
	var rows []api.StatusModel
	for _, m := range n.Models() {
		rows = append(rows, api.StatusModel{ID: m.ID, WireID: m.WireID, Task: m.Task, Warm: m.Warm})
	}
	return api.NodeStatus{NodeID: n.nodeID, State: state, Version: n.version, Engine: cmp.Or(n.engine, EngineLocal),
		UptimeSeconds: int64(n.clock().Sub(*n.started).Seconds()), Models: rows, Peers: n.peerRows()}
}

// peerRows is the dashboard's and `infermesh members`' view of the mesh.
func (n *backend) peerRows() []api.Member {
	if n.cluster.mesh == nil {
		return nil
	}
	var out []api.Member
	rv := routingOf(n.cluster)
	for _, p := range n.cluster.mesh.Peers() {
		m := api.Member{ID: p.ID, HTTPAddr: p.HTTPAddr, RPCAddr: p.RPCAddr, State: p.Health.String(), Self: p.Self, Ejected: p.Ejected,
			InFlight: p.InFlight, Cap: p.MaxInFlight, Weight: p.Weight, Canary: p.Canary, CanaryPercent: p.CanaryPercent, Version: p.Version,
			Policy: rv.policy(p.ID), Effective: routingOfPeer(rv.effective(p))}
		for id, pm := range p.Models {
			m.Installed = append(m.Installed, id)
			if pm.Warm {
				m.Warm = append(m.Warm, id)
			}
		}
		sort.Strings(m.Installed)
		sort.Strings(m.Warm)
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Members lists the mesh's nodes.
func (n *backend) Members() []api.Member { return n.peerRows() }

// errNotFound wraps models.ErrNotFound as the API's sentinel.
func errNotFound(id string) error {
	return fmt.Errorf("the model '%s' does not exist or is not installed on this mesh: %w", id, api.ErrModelNotFound)
}

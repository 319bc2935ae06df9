package node

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/routing"
	"github.com/infermesh/infermesh/mesh/route"
	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/dispatch"
	"github.com/infermesh/infermesh/node/models"
)

func micros(v float64) int64 { return int64(math.Round(v * microsPerUnit)) }

func policyToConsensus(d api.Policy) consensus.Policy {
	p := consensus.Policy{Strategy: d.Strategy, Governance: d.Governance, Plan: d.Plan, FirstPartyApps: d.FirstPartyApps}
	for id, w := range d.Workers {
		p.Nodes = append(p.Nodes, consensus.NodePolicy{NodeID: id, Node: w})
	}
	for id, m := range d.Models {
		lc := m.Lifecycle
		if lc == "" {
			lc = consensus.LifecycleActive
		}
		p.Models = append(p.Models, consensus.ModelPolicy{Model: id, Lifecycle: lc, Replacement: m.Replacement,
			Price: consensus.Price{RequestMicros: micros(m.PerRequest), InputPerMillionMicros: micros(m.PerMInput), OutputPerMillionMicros: micros(m.PerMOutput)}})
	}
	sort.Slice(p.Nodes, func(i, j int) bool { return p.Nodes[i].NodeID < p.Nodes[j].NodeID })
	sort.Slice(p.Models, func(i, j int) bool { return p.Models[i].Model < p.Models[j].Model })
	return p
}

func policyFromConsensus(p consensus.Policy) api.Policy {
	d := api.Policy{Strategy: p.Strategy, Governance: p.Governance, Plan: p.Plan, FirstPartyApps: p.FirstPartyApps, Revision: p.Revision, Workers: map[string]routing.Node{}, Models: map[string]api.ModelPolicy{}}
	for _, n := range p.Nodes {
		d.Workers[n.NodeID] = n.Node
	}
	for _, m := range p.Models {
		d.Models[m.Model] = api.ModelPolicy{Lifecycle: m.Lifecycle, Replacement: m.Replacement, PerRequest: float64(m.Price.RequestMicros) / microsPerUnit,
			PerMInput: float64(m.Price.InputPerMillionMicros) / microsPerUnit, PerMOutput: float64(m.Price.OutputPerMillionMicros) / microsPerUnit}
	}
	return d
}

// Policy returns the replicated pool policy.
func (n *governance) Policy() api.Policy { return policyFromConsensus(n.cluster.raft.State().Policy()) }

// SetPolicy replaces the pool policy through raft, after checking the
// whole document; it returns once this node has applied the new policy.
func (n *governance) SetPolicy(ctx context.Context, d api.Policy) (api.Policy, error) {
	if e := validatePolicy(d); e != nil {
		return api.Policy{}, e
	}
	cmd, err := consensus.SetPolicy(policyToConsensus(d), false)
	if err != nil {
		return api.Policy{}, fmt.Errorf("%v: %w", err, api.ErrInvalid)
	}
	res, err := n.cluster.raft.Apply(ctx, cmd)
	if err != nil {
		return api.Policy{}, applyErr(err)
	}
	n.writeVisible(ctx, res.Index, false)
	return policyFromConsensus(*res.Policy), nil
}

// Bounds of a policy document's numbers.
const (
	maxPolicyWeight = 1_000_000
	maxPolicyCap    = 1_000_000
	maxPolicyPrice  = 1e9
)

// appName is the shape of an application name (consensus's validName).
var appName = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)

// validate checks the whole document and names the first bad field
// (strategy, governance, workers.<node>.<field>, models.<id>.<field>).
func validatePolicy(d api.Policy) *apierr.Error {
	bad := func(param, msg string) *apierr.Error { return apierr.BadRequest(apierr.CodeInvalidValue, param, msg) }
	if d.Strategy != "" {
		if _, err := route.ParseStrategy(d.Strategy); err != nil {
			return bad("strategy", fmt.Sprintf("strategy %q is not one of %v.", d.Strategy, route.Strategies()))
		}
	}
	switch d.Governance {
	case "", consensus.GovernanceCurated, consensus.GovernanceFederated, consensus.GovernanceOpen:
	default:
		return bad("governance", fmt.Sprintf("governance %q is not curated, federated or open.", d.Governance))
	}
	switch d.Plan {
	case "", consensus.PlanFree, consensus.PlanPro:
	default:
		return bad("plan", fmt.Sprintf("plan %q is not free or pro.", d.Plan))
	}
	for i, a := range d.FirstPartyApps {
		if !appName.MatchString(a) {
			return bad(fmt.Sprintf("first_party_apps[%d]", i), fmt.Sprintf("application %q: use 1 to 64 lowercase letters, digits, '.', '_' or '-'.", a))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(d.Workers)) {
		w, p := d.Workers[id], "workers."+id
		switch {
		case id == "" || len(id) > 256:
			return bad("workers", "A worker entry needs a node id of 1 to 256 characters.")
		case w.Weight < 0 || w.Weight > maxPolicyWeight:
			return bad(p+".weight", fmt.Sprintf("weight must be between 0 and %d.", maxPolicyWeight))
		case w.CanaryPercent < 0 || w.CanaryPercent > 100:
			return bad(p+".canary_percent", "canary_percent must be between 0 and 100.")
		case w.InflightCap < 0 || w.InflightCap > maxPolicyCap:
			return bad(p+".inflight_cap", fmt.Sprintf("inflight_cap must be between 0 (the node's own cap) and %d.", maxPolicyCap))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(d.Models)) {
		m, p := d.Models[id], "models."+id
		if !models.IsCanonicalID(id) {
			return bad("models", fmt.Sprintf("models are keyed by canonical id <runtime>/<family>/<variant>; %q is not one.", id))
		}
		switch m.Lifecycle {
		case "", consensus.LifecycleActive, consensus.LifecycleDeprecated, consensus.LifecycleBlocked:
		default:
			return bad(p+".lifecycle", fmt.Sprintf("lifecycle %q is not active, deprecated or blocked.", m.Lifecycle))
		}
		if len(m.Replacement) > 256 {
			return bad(p+".replacement", "replacement is at most 256 characters.")
		}
		for _, f := range []struct {
			name string
			v    float64
		}{{"price_per_request", m.PerRequest}, {"price_per_million_input_tokens", m.PerMInput}, {"price_per_million_output_tokens", m.PerMOutput}} {
			if math.IsNaN(f.v) || f.v < 0 || f.v > maxPolicyPrice {
				return bad(p+"."+f.name, fmt.Sprintf("%s must be between 0 and %g.", f.name, float64(maxPolicyPrice)))
			}
		}
	}
	return nil
}

// seedPolicy installs <data-dir>/gateway.json as the policy when none is
// set yet (idempotent across nodes and restarts).
func (n *Node) seedPolicy() {
	b, err := os.ReadFile(filepath.Join(n.cfg.DataDir, "gateway.json"))
	if err != nil {
		return
	}
	var d api.Policy
	if err := json.Unmarshal(b, &d); err != nil {
		n.log.Error("gateway.json is not valid policy JSON; ignored", "err", err)
		return
	}
	if e := validatePolicy(d); e != nil {
		n.log.Error("gateway.json policy rejected; ignored", "field", e.Param, "err", e.Message)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := n.cluster.raft.WaitForLeader(ctx); err != nil {
		return
	}
	cmd, err := consensus.SetPolicy(policyToConsensus(d), true)
	if err != nil {
		n.log.Error("gateway.json policy rejected", "err", err)
		return
	}
	if _, err := n.cluster.raft.Apply(ctx, cmd); err == nil {
		n.log.Info("pool policy seeded from gateway.json")
	}
}

// replicatedPolicy is dispatch's PolicySource over raft state, converted
// once per policy revision; before any policy is set it serves the node's
// flags.
type replicatedPolicy struct {
	raft     *consensus.Node
	fallback dispatch.Policy
	mu       sync.Mutex
	rev      uint64
	cached   dispatch.Policy
}

// Policy returns the routing policy now in force.
func (r *replicatedPolicy) Policy() dispatch.Policy {
	// The revision alone first: copying the whole policy (sorted nodes and
	// models) per request showed in the entry node's profile.
	rev := r.raft.State().PolicyRevision()
	if rev == 0 {
		return r.fallback
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if rev != r.rev {
		p := r.raft.State().Policy()
		s, err := route.ParseStrategy(p.Strategy)
		if err != nil {
			s = r.fallback.Strategy
		}
		out := dispatch.Policy{Strategy: s, Nodes: map[string]routing.Node{}}
		for _, np := range p.Nodes {
			out.Nodes[np.NodeID] = np.Node
		}
		r.rev, r.cached = p.Revision, out
	}
	return r.cached
}

// modelLifecycle reports a model's lifecycle state and replacement
// (active before raft runs).
func (c *cluster) modelLifecycle(id string) (string, string) {
	if c.raft == nil {
		return consensus.LifecycleActive, ""
	}
	mp, ok := c.raft.State().ModelPolicy(id)
	if !ok {
		return consensus.LifecycleActive, ""
	}
	return mp.Lifecycle, mp.Replacement
}

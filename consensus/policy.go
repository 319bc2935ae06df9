package consensus

import (
	"fmt"
	"maps"
	"slices"

	"github.com/infermesh/infermesh/consensus/routing"
	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// Governance modes for model pulls.
const (
	GovernanceCurated   = "curated"
	GovernanceFederated = "federated"
	GovernanceOpen      = "open"
)

// Server plans (spec Limits): on Free, third-party callers share a small
// daily allowance; Pro has none. An unset plan is Pro.
const (
	PlanFree = "free"
	PlanPro  = "pro"
)

// FreeAllowanceKeyID names the reserved lease ledger of the Free plan's
// mesh-wide daily allowance of third-party requests; no API key may take
// an id starting with "plan:".
const FreeAllowanceKeyID = "plan:free"

// FreeDailyRequests is the Free plan's daily allowance of third-party
// requests across the mesh.
const FreeDailyRequests = 10

// Defaults a View reports while the policy leaves a field unset.
const (
	DefaultStrategy   = "round-robin"
	DefaultGovernance = GovernanceOpen
)

// Model lifecycle states.
const (
	LifecycleActive     = "active"
	LifecycleDeprecated = "deprecated"
	LifecycleBlocked    = "blocked"
)

// Price is a model's estimated cost in micro-units.
type Price struct {
	RequestMicros          int64 // per request
	InputPerMillionMicros  int64 // per million input tokens
	OutputPerMillionMicros int64 // per million output tokens
}

// Cost estimates one request's cost in micro-units, rounding token costs up.
func (p Price) Cost(inputTokens, outputTokens int64) int64 {
	return p.RequestMicros + ceilDiv(inputTokens*p.InputPerMillionMicros, 1_000_000) +
		ceilDiv(outputTokens*p.OutputPerMillionMicros, 1_000_000)
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// NodePolicy is one node's routing settings.
type NodePolicy struct {
	NodeID string // node id
	// Node is the settings: weight, canary and canary percent (0..100),
	// in-flight cap (zero: the node's own default).
	routing.Node
}

// ModelPolicy is one model's lifecycle and price.
type ModelPolicy struct {
	Model       string // model id
	Lifecycle   string // active, deprecated or blocked
	Replacement string // named in deprecation notices
	Price       Price  // estimated cost, for budgets
}

// Policy is the replicated pool policy.
type Policy struct {
	Strategy   string        // routing strategy name
	Governance string        // curated, federated or open
	Nodes      []NodePolicy  // sorted by NodeID
	Models     []ModelPolicy // sorted by Model
	// Plan is free or pro; empty means pro.
	Plan string
	// FirstPartyApps lists the applications whose keys are first-party,
	// sorted.
	FirstPartyApps []string
	// Revision is the raft index of the last change; zero when never set.
	Revision uint64
}

type policyTable struct {
	strategy   string
	governance string
	plan       string
	firstParty []string
	nodes      map[string]NodePolicy
	models     map[string]ModelPolicy
	revision   uint64
}

func newPolicyTable() policyTable {
	return policyTable{nodes: map[string]NodePolicy{}, models: map[string]ModelPolicy{}}
}

func (t *policyTable) set(index uint64, s *pb.PolicySet) *pb.ApplyResult {
	if s.GetOnlyIfUnset() && t.revision != 0 {
		return reject(codeAlreadySet, "policy was already set at index %d", t.revision)
	}
	fresh := newPolicyTable()
	if err := fresh.load(s.GetPolicy()); err != "" {
		return reject(codeInvalid, "%s", err)
	}
	fresh.revision = index
	*t = fresh
	return &pb.ApplyResult{Policy: t.toProto()}
}

func (t *policyTable) update(index uint64, u *pb.PolicyUpdate) *pb.ApplyResult {
	if u.Strategy != nil {
		t.strategy = u.GetStrategy()
	}
	if u.Governance != nil {
		t.governance = u.GetGovernance()
	}
	if !u.GetPlanOnlyIfUnset() || t.plan == "" {
		if u.Plan != nil {
			t.plan = u.GetPlan()
		}
		if u.GetSetFirstPartyApps() {
			t.firstParty = normalizeList(u.GetFirstPartyApps())
		}
	}
	t.revision = index
	return &pb.ApplyResult{Policy: t.toProto()}
}

func (t *policyTable) setNode(index uint64, s *pb.PolicyNodeSet) *pb.ApplyResult {
	np := nodePolicyFromProto(s.GetNode())
	if np.NodeID == "" {
		return reject(codeInvalid, "node id is required")
	}
	if s.GetRemove() {
		delete(t.nodes, np.NodeID)
	} else {
		if err := validNodePolicy(np); err != "" {
			return reject(codeInvalid, "%s", err)
		}
		t.nodes[np.NodeID] = np
	}
	t.revision = index
	return &pb.ApplyResult{Policy: t.toProto()}
}

func (t *policyTable) setModel(index uint64, s *pb.PolicyModelSet) *pb.ApplyResult {
	mp := modelPolicyFromProto(s.GetModel())
	if mp.Model == "" {
		return reject(codeInvalid, "model is required")
	}
	if s.GetRemove() {
		delete(t.models, mp.Model)
	} else {
		if err := validModelPolicy(mp); err != "" {
			return reject(codeInvalid, "%s", err)
		}
		t.models[mp.Model] = mp
	}
	t.revision = index
	return &pb.ApplyResult{Policy: t.toProto()}
}

// load fills an empty table from p, checking only structure: value names
// (strategies, modes) are checked by the command builders, so replicas of
// different versions never disagree about what the state machine accepts.
func (t *policyTable) load(p *pb.Policy) string {
	t.strategy = p.GetStrategy()
	t.governance = p.GetGovernance()
	t.plan = p.GetPlan()
	t.firstParty = normalizeList(p.GetFirstPartyApps())
	t.revision = p.GetRevision()
	for _, n := range p.GetNodes() {
		np := nodePolicyFromProto(n)
		if np.NodeID == "" {
			return "node id is required"
		}
		if err := validNodePolicy(np); err != "" {
			return err
		}
		if _, dup := t.nodes[np.NodeID]; dup {
			return "duplicate node " + np.NodeID
		}
		t.nodes[np.NodeID] = np
	}
	for _, m := range p.GetModels() {
		mp := modelPolicyFromProto(m)
		if mp.Model == "" {
			return "model is required"
		}
		if err := validModelPolicy(mp); err != "" {
			return err
		}
		if _, dup := t.models[mp.Model]; dup {
			return "duplicate model " + mp.Model
		}
		t.models[mp.Model] = mp
	}
	return ""
}

func validNodePolicy(np NodePolicy) string {
	if np.Weight < 0 || np.InflightCap < 0 {
		return "weight and in-flight cap cannot be negative"
	}
	if np.CanaryPercent < 0 || np.CanaryPercent > 100 {
		return "canary_percent must be within 0..100"
	}
	return ""
}

func validModelPolicy(mp ModelPolicy) string {
	if mp.Price.RequestMicros < 0 || mp.Price.InputPerMillionMicros < 0 || mp.Price.OutputPerMillionMicros < 0 {
		return "prices cannot be negative"
	}
	return ""
}

func (t *policyTable) view() Policy {
	p := Policy{Strategy: t.strategy, Governance: t.governance, Plan: t.plan, FirstPartyApps: slices.Clone(t.firstParty), Revision: t.revision}
	for _, id := range slices.Sorted(maps.Keys(t.nodes)) {
		p.Nodes = append(p.Nodes, t.nodes[id])
	}
	for _, m := range slices.Sorted(maps.Keys(t.models)) {
		p.Models = append(p.Models, t.models[m])
	}
	return p
}

func (t *policyTable) toProto() *pb.Policy { return policyToProto(t.view()) }

func policyToProto(p Policy) *pb.Policy {
	out := &pb.Policy{Strategy: p.Strategy, Governance: p.Governance, Plan: p.Plan, FirstPartyApps: normalizeList(p.FirstPartyApps), Revision: p.Revision}
	for _, n := range p.Nodes {
		out.Nodes = append(out.Nodes, &pb.NodePolicy{
			NodeId: n.NodeID, Weight: n.Weight, Canary: n.Canary,
			CanaryPercent: n.CanaryPercent, InflightCap: n.InflightCap,
		})
	}
	for _, m := range p.Models {
		out.Models = append(out.Models, modelPolicyToProto(m))
	}
	return out
}

func policyFromProto(p *pb.Policy) Policy {
	out := Policy{Strategy: p.GetStrategy(), Governance: p.GetGovernance(), Plan: p.GetPlan(), FirstPartyApps: p.GetFirstPartyApps(), Revision: p.GetRevision()}
	for _, n := range p.GetNodes() {
		out.Nodes = append(out.Nodes, nodePolicyFromProto(n))
	}
	for _, m := range p.GetModels() {
		out.Models = append(out.Models, modelPolicyFromProto(m))
	}
	return out
}

func nodePolicyFromProto(n *pb.NodePolicy) NodePolicy {
	return NodePolicy{NodeID: n.GetNodeId(), Node: routing.Node{
		Weight: n.GetWeight(), Canary: n.GetCanary(), CanaryPercent: n.GetCanaryPercent(), InflightCap: n.GetInflightCap(),
	}}
}

func modelPolicyToProto(m ModelPolicy) *pb.ModelPolicy {
	return &pb.ModelPolicy{
		Model:       m.Model,
		Lifecycle:   lifecycleToProto(m.Lifecycle),
		Replacement: m.Replacement,
		Price: &pb.Price{
			RequestMicros:          m.Price.RequestMicros,
			InputPerMillionMicros:  m.Price.InputPerMillionMicros,
			OutputPerMillionMicros: m.Price.OutputPerMillionMicros,
		},
	}
}

func modelPolicyFromProto(m *pb.ModelPolicy) ModelPolicy {
	return ModelPolicy{
		Model:       m.GetModel(),
		Lifecycle:   lifecycleFromProto(m.GetLifecycle()),
		Replacement: m.GetReplacement(),
		Price: Price{
			RequestMicros:          m.GetPrice().GetRequestMicros(),
			InputPerMillionMicros:  m.GetPrice().GetInputPerMillionMicros(),
			OutputPerMillionMicros: m.GetPrice().GetOutputPerMillionMicros(),
		},
	}
}

func lifecycleToProto(s string) pb.ModelLifecycle {
	switch s {
	case LifecycleDeprecated:
		return pb.ModelLifecycle_MODEL_LIFECYCLE_DEPRECATED
	case LifecycleBlocked:
		return pb.ModelLifecycle_MODEL_LIFECYCLE_BLOCKED
	case LifecycleActive:
		return pb.ModelLifecycle_MODEL_LIFECYCLE_ACTIVE
	}
	var n int32
	if _, err := fmt.Sscanf(s, "lifecycle(%d)", &n); err == nil {
		return pb.ModelLifecycle(n)
	}
	return pb.ModelLifecycle_MODEL_LIFECYCLE_UNSPECIFIED
}

// lifecycleFromProto keeps values a newer version wrote as "lifecycle(N)",
// so every replica stores and snapshots the same number; readers treat any
// value other than deprecated and blocked as servable.
func lifecycleFromProto(l pb.ModelLifecycle) string {
	switch l {
	case pb.ModelLifecycle_MODEL_LIFECYCLE_UNSPECIFIED, pb.ModelLifecycle_MODEL_LIFECYCLE_ACTIVE:
		return LifecycleActive
	case pb.ModelLifecycle_MODEL_LIFECYCLE_DEPRECATED:
		return LifecycleDeprecated
	case pb.ModelLifecycle_MODEL_LIFECYCLE_BLOCKED:
		return LifecycleBlocked
	}
	return fmt.Sprintf("lifecycle(%d)", int32(l))
}

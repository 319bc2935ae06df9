package consensus

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// Command is one state machine command. Build it with the functions in this
// file, which check values (names, modes, ranges) before anything reaches
// the log; the state machine itself only checks structure, so replicas of
// different versions never disagree about what it accepts. Apply stamps
// TimeUnixNano on the leader when it is zero.
type Command = pb.Command

func newCommand(t pb.CommandType, msg proto.Message) (*Command, error) {
	b, err := proto.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("consensus: encode %s: %w", t, err)
	}
	return &Command{Type: t, Payload: b}, nil
}

// validName accepts 1..64 characters of lowercase letters, digits, '-', '_'
// and '.', the shape of endpoint and strategy names.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

func checkEndpoints(eps []string) error {
	for _, e := range eps {
		if !validName(e) {
			return fmt.Errorf("consensus: endpoint name %q is not valid", e)
		}
	}
	return nil
}

func checkLimits(l Limits) error {
	if l.RPM < 0 || l.DailyQuota < 0 || l.MonthlyBudgetMicros < 0 {
		return errors.New("consensus: limits cannot be negative")
	}
	return nil
}

// KeySpec describes a key to create. Hash is the SHA-256 of the plaintext
// the caller generated and shows the user once (node/auth.HashKey).
type KeySpec struct {
	ID        string    // optional; derived from Hash when empty
	Hash      KeyHash   // SHA-256 of the plaintext
	Name      string    // human-readable name, required
	App       string    // application the key belongs to
	Admin     bool      // may use the admin API
	Endpoints []string  // allowlist; empty allows every endpoint
	Limits    Limits    // rpm, daily quota, monthly budget
	ExpiresAt time.Time // zero never expires
}

// CreateKey builds a key creation command. Retrying it with the same Hash
// and ID answers with the existing key.
func CreateKey(s KeySpec) (*Command, error) {
	if s.Hash == (KeyHash{}) {
		return nil, errors.New("consensus: key hash is required")
	}
	if s.Name == "" {
		return nil, errors.New("consensus: key name is required")
	}
	if err := checkEndpoints(s.Endpoints); err != nil {
		return nil, err
	}
	if err := checkLimits(s.Limits); err != nil {
		return nil, err
	}
	return newCommand(pb.CommandType_COMMAND_TYPE_KEY_CREATE, &pb.KeyCreate{
		KeyHash: s.Hash[:], Id: s.ID, Name: s.Name, App: s.App, Admin: s.Admin,
		Endpoints: s.Endpoints, Limits: limitsToProto(s.Limits), ExpiresUnixNano: nanosFromTime(s.ExpiresAt),
	})
}

// RevokeKey builds a key revocation command. Revocation also drops the
// key's lease ledgers.
func RevokeKey(id string) (*Command, error) {
	if id == "" {
		return nil, errors.New("consensus: key id is required")
	}
	return newCommand(pb.CommandType_COMMAND_TYPE_KEY_REVOKE, &pb.KeyRevoke{Id: id})
}

func checkGovernance(g string, allowEmpty bool) error {
	switch g {
	case GovernanceCurated, GovernanceFederated, GovernanceOpen:
		return nil
	case "":
		if allowEmpty {
			return nil
		}
	}
	return fmt.Errorf("consensus: governance mode %q is not curated, federated or open", g)
}

func checkPlan(p string) error {
	switch p {
	case "", PlanFree, PlanPro:
		return nil
	}
	return fmt.Errorf("consensus: plan %q is not free or pro", p)
}

func checkApps(apps []string) error {
	for _, a := range apps {
		if !validName(a) {
			return fmt.Errorf("consensus: application name %q is not valid", a)
		}
	}
	return nil
}

func checkStrategy(s string, allowEmpty bool) error {
	if s == "" && allowEmpty || validName(s) {
		return nil
	}
	return fmt.Errorf("consensus: strategy name %q is not valid", s)
}

func checkNodePolicy(np NodePolicy) error {
	if np.NodeID == "" {
		return errors.New("consensus: node id is required")
	}
	if err := validNodePolicy(np); err != "" {
		return errors.New("consensus: " + err)
	}
	return nil
}

func checkModelPolicy(mp ModelPolicy) error {
	if mp.Model == "" {
		return errors.New("consensus: model is required")
	}
	switch mp.Lifecycle {
	case "", LifecycleActive, LifecycleDeprecated, LifecycleBlocked:
	default:
		return fmt.Errorf("consensus: lifecycle %q is not active, deprecated or blocked", mp.Lifecycle)
	}
	if err := validModelPolicy(mp); err != "" {
		return errors.New("consensus: " + err)
	}
	return nil
}

// SetPolicy builds a command replacing the whole policy. With onlyIfUnset
// it is refused (ErrAlreadySet) once any policy command has applied: the
// form a node uses to seed the policy from gateway.json on first start.
func SetPolicy(p Policy, onlyIfUnset bool) (*Command, error) {
	if err := checkStrategy(p.Strategy, true); err != nil {
		return nil, err
	}
	if err := checkGovernance(p.Governance, true); err != nil {
		return nil, err
	}
	if err := checkPlan(p.Plan); err != nil {
		return nil, err
	}
	if err := checkApps(p.FirstPartyApps); err != nil {
		return nil, err
	}
	seenNodes, seenModels := map[string]bool{}, map[string]bool{}
	for _, np := range p.Nodes {
		if err := checkNodePolicy(np); err != nil {
			return nil, err
		}
		if seenNodes[np.NodeID] {
			return nil, fmt.Errorf("consensus: node %q listed twice", np.NodeID)
		}
		seenNodes[np.NodeID] = true
	}
	for _, mp := range p.Models {
		if err := checkModelPolicy(mp); err != nil {
			return nil, err
		}
		if seenModels[mp.Model] {
			return nil, fmt.Errorf("consensus: model %q listed twice", mp.Model)
		}
		seenModels[mp.Model] = true
	}
	return newCommand(pb.CommandType_COMMAND_TYPE_POLICY_SET, &pb.PolicySet{Policy: policyToProto(p), OnlyIfUnset: onlyIfUnset})
}

// PolicyChange lists the pool-wide fields to change; nil fields stay.
type PolicyChange struct {
	Strategy       *string   // routing strategy name
	Governance     *string   // curated, federated or open
	Plan           *string   // free or pro
	FirstPartyApps *[]string // replaces the first-party applications
	// PlanOnlyIfUnset applies Plan and FirstPartyApps only while the
	// policy has no plan (a node seeding them from its flags).
	PlanOnlyIfUnset bool
}

// UpdatePolicy builds a command changing pool-wide policy fields.
func UpdatePolicy(c PolicyChange) (*Command, error) {
	if c.Strategy != nil {
		if err := checkStrategy(*c.Strategy, false); err != nil {
			return nil, err
		}
	}
	if c.Governance != nil {
		if err := checkGovernance(*c.Governance, false); err != nil {
			return nil, err
		}
	}
	u := &pb.PolicyUpdate{Strategy: c.Strategy, Governance: c.Governance, Plan: c.Plan, PlanOnlyIfUnset: c.PlanOnlyIfUnset}
	if c.Plan != nil {
		if err := checkPlan(*c.Plan); err != nil {
			return nil, err
		}
	}
	if c.FirstPartyApps != nil {
		if err := checkApps(*c.FirstPartyApps); err != nil {
			return nil, err
		}
		u.FirstPartyApps, u.SetFirstPartyApps = *c.FirstPartyApps, true
	}
	return newCommand(pb.CommandType_COMMAND_TYPE_POLICY_UPDATE, u)
}

// LeaseRequest asks for Want more of a key's limit in the current period,
// after settling Consumed against the node's current holding.
type LeaseRequest struct {
	NodeID   string    // node asking
	KeyID    string    // key whose limit is sliced
	Kind     LeaseKind // daily requests or monthly budget
	Want     int64     // amount to add to the holding
	Consumed int64     // admitted since the last report, settled first
	// TTL is how long the holding should last (capped at the period's
	// end); zero uses DefaultLeaseTTL.
	TTL time.Duration
}

// AcquireLease builds a lease acquire (or renew) command.
func AcquireLease(r LeaseRequest) (*Command, error) {
	switch {
	case r.NodeID == "" || r.KeyID == "":
		return nil, errors.New("consensus: node id and key id are required")
	case !validLeaseKind(r.Kind):
		return nil, fmt.Errorf("consensus: unknown lease kind %d", r.Kind)
	case r.Want < 0 || r.Consumed < 0 || r.TTL < 0:
		return nil, errors.New("consensus: want, consumed and ttl cannot be negative")
	}
	return newCommand(pb.CommandType_COMMAND_TYPE_LEASE_ACQUIRE, &pb.LeaseAcquire{
		NodeId: r.NodeID, KeyId: r.KeyID, Kind: r.Kind, Want: r.Want, Consumed: r.Consumed, TtlMs: r.TTL.Milliseconds(),
	})
}

// Settlement reports consumption against one holding and, with Release,
// gives back the rest.
type Settlement struct {
	KeyID    string    // key of the holding
	Kind     LeaseKind // kind of the holding
	Period   string    // period of the holding (LeaseGrant.Period)
	Consumed int64     // admitted since the last report
	Release  bool      // give back the rest of the holding
}

// SettleLeases builds one command settling many holdings of a node.
func SettleLeases(nodeID string, s []Settlement) (*Command, error) {
	if nodeID == "" {
		return nil, errors.New("consensus: node id is required")
	}
	m := &pb.LeaseSettle{NodeId: nodeID}
	for _, st := range s {
		if st.KeyID == "" || st.Period == "" || !validLeaseKind(st.Kind) || st.Consumed < 0 {
			return nil, fmt.Errorf("consensus: settlement for key %q is malformed", st.KeyID)
		}
		m.Settlements = append(m.Settlements, &pb.LeaseSettlement{
			KeyId: st.KeyID, Kind: st.Kind, Period: st.Period, Consumed: st.Consumed, Release: st.Release,
		})
	}
	return newCommand(pb.CommandType_COMMAND_TYPE_LEASE_SETTLE, m)
}

// RecordUsage builds a usage batch. seq must increase per node (zero turns
// the duplicate check off); send one batch at a time per node, so a retried
// batch is recognised (ErrDuplicate) rather than counted twice.
func RecordUsage(nodeID string, seq uint64, entries []UsageEntry) (*Command, error) {
	if nodeID == "" {
		return nil, errors.New("consensus: node id is required")
	}
	b := &pb.UsageBatch{NodeId: nodeID, Seq: seq}
	for _, e := range entries {
		if e.Requests < 0 || e.InputTokens < 0 || e.OutputTokens < 0 || e.CostMicros < 0 || e.Errors < 0 || e.Day < 0 {
			return nil, errors.New("consensus: usage counts and days cannot be negative")
		}
		b.Entries = append(b.Entries, &pb.UsageEntry{
			App: e.App, Model: e.Model, KeyId: e.KeyID, Worker: e.Worker, Day: e.Day, Requests: e.Requests,
			InputTokens: e.InputTokens, OutputTokens: e.OutputTokens, CostMicros: e.CostMicros, Errors: e.Errors,
		})
	}
	return newCommand(pb.CommandType_COMMAND_TYPE_USAGE_BATCH, b)
}

// SetAuditKey builds a command recording the ed25519 public key that signs
// nodeID's audit records (replacing an earlier one).
func SetAuditKey(nodeID string, pub ed25519.PublicKey) (*Command, error) {
	if nodeID == "" {
		return nil, errors.New("consensus: node id is required")
	}
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("consensus: an audit key is %d bytes, not %d", ed25519.PublicKeySize, len(pub))
	}
	cmd, err := newCommand(pb.CommandType_COMMAND_TYPE_AUDIT_KEY_SET, &pb.AuditKeySet{Key: &pb.AuditKey{NodeId: nodeID, PublicKey: pub}})
	if cmd != nil {
		// Replicas that predate audit keys skip it rather than stop: they
		// verify nothing with it.
		cmd.Ignorable = true
	}
	return cmd, err
}

package consensus

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// state is the replicated state: one table per concern. It is only touched
// by the state machine under its lock.
type state struct {
	keys      keysTable
	policy    policyTable
	leases    leaseTable
	usage     usageTable
	auditKeys auditKeyTable
}

func newState() *state {
	return &state{keys: newKeysTable(), policy: newPolicyTable(), leases: newLeaseTable(), usage: newUsageTable(), auditKeys: auditKeyTable{}}
}

// errUnknownCommand marks a command type this version does not know.
var errUnknownCommand = errors.New("unknown command type")

// apply executes one decoded command. It returns errUnknownCommand for an
// unknown type and a decode error for a malformed payload; both leave the
// state untouched. A refused command yields a result with a rejection code.
func (s *state) apply(index uint64, cmd *pb.Command) (*pb.ApplyResult, error) {
	msg := payloadFor(cmd.GetType())
	if msg == nil {
		return nil, errUnknownCommand
	}
	if err := proto.Unmarshal(cmd.GetPayload(), msg); err != nil {
		return nil, fmt.Errorf("decode %s payload: %w", cmd.GetType(), err)
	}
	now := timeFromNanos(cmd.GetTimeUnixNano())
	var res *pb.ApplyResult
	switch p := msg.(type) {
	case *pb.KeyCreate:
		res = s.keys.create(now, p)
	case *pb.KeyUpdate:
		res = s.keys.update(p)
	case *pb.KeyRevoke:
		res = s.keys.revoke(now, p)
		if res.GetRejectionCode() == "" {
			s.leases.dropKey(p.GetId())
		}
	case *pb.PolicySet:
		res = s.policy.set(index, p)
	case *pb.PolicyUpdate:
		res = s.policy.update(index, p)
	case *pb.PolicyNodeSet:
		res = s.policy.setNode(index, p)
	case *pb.PolicyModelSet:
		res = s.policy.setModel(index, p)
	case *pb.LeaseAcquire:
		res = s.leases.acquire(now, p, &s.keys, &s.policy)
	case *pb.LeaseSettle:
		res = s.leases.settle(now, p, &s.keys, &s.policy)
	case *pb.UsageBatch:
		res = s.usage.apply(p)
	case *pb.AuditKeySet:
		res = s.auditKeys.set(p)
	}
	res.Index = index
	return res, nil
}

// payloadFor returns an empty payload message for a known command type and
// nil for an unknown one.
func payloadFor(t pb.CommandType) proto.Message {
	switch t {
	case pb.CommandType_COMMAND_TYPE_KEY_CREATE:
		return &pb.KeyCreate{}
	case pb.CommandType_COMMAND_TYPE_KEY_UPDATE:
		return &pb.KeyUpdate{}
	case pb.CommandType_COMMAND_TYPE_KEY_REVOKE:
		return &pb.KeyRevoke{}
	case pb.CommandType_COMMAND_TYPE_POLICY_SET:
		return &pb.PolicySet{}
	case pb.CommandType_COMMAND_TYPE_POLICY_UPDATE:
		return &pb.PolicyUpdate{}
	case pb.CommandType_COMMAND_TYPE_POLICY_NODE_SET:
		return &pb.PolicyNodeSet{}
	case pb.CommandType_COMMAND_TYPE_POLICY_MODEL_SET:
		return &pb.PolicyModelSet{}
	case pb.CommandType_COMMAND_TYPE_LEASE_ACQUIRE:
		return &pb.LeaseAcquire{}
	case pb.CommandType_COMMAND_TYPE_LEASE_SETTLE:
		return &pb.LeaseSettle{}
	case pb.CommandType_COMMAND_TYPE_USAGE_BATCH:
		return &pb.UsageBatch{}
	case pb.CommandType_COMMAND_TYPE_AUDIT_KEY_SET:
		return &pb.AuditKeySet{}
	}
	return nil
}

// toProto is the canonical form of the state: every list sorted.
func (s *state) toProto() *pb.State {
	out := &pb.State{Policy: s.policy.toProto(), Leases: s.leases.ledgers()}
	for _, k := range s.keys.sorted() {
		out.Keys = append(out.Keys, keyToProto(k))
	}
	out.Usage, out.UsageCursors = s.usage.toProto()
	out.AuditKeys = s.auditKeys.toProto()
	return out
}

// stateFromProto builds a fresh state from a snapshot.
func stateFromProto(p *pb.State) (*state, error) {
	s := newState()
	if err := s.keys.load(p.GetKeys()); err != nil {
		return nil, err
	}
	if err := s.policy.load(p.GetPolicy()); err != "" {
		return nil, errorf("snapshot: policy: %s", err)
	}
	if err := s.leases.load(p.GetLeases()); err != nil {
		return nil, err
	}
	if err := s.usage.load(p.GetUsage(), p.GetUsageCursors()); err != nil {
		return nil, err
	}
	if err := s.auditKeys.load(p.GetAuditKeys()); err != nil {
		return nil, err
	}
	return s, nil
}

// digest is the hex SHA-256 of the deterministic encoding of the canonical
// state. Replicas that applied the same log agree on it.
func (s *state) digest() string {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s.toProto())
	if err != nil {
		// Marshalling generated messages of valid UTF-8 strings cannot
		// fail; keep the digest distinct from any real one if it does.
		return "error: " + err.Error()
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func timeFromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func nanosFromTime(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// normalizeList returns the sorted, de-duplicated non-empty entries.
func normalizeList(in []string) []string {
	var out []string
	for _, s := range in {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func compareStrings(a, b string) int { return strings.Compare(a, b) }

func errorf(format string, args ...any) error { return fmt.Errorf("consensus: "+format, args...) }

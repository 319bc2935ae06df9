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
	c, ok := commandFor(cmd.GetType())
	if !ok {
		return nil, errUnknownCommand
	}
	msg := c.payload()
	if err := proto.Unmarshal(cmd.GetPayload(), msg); err != nil {
		return nil, fmt.Errorf("decode %s payload: %w", cmd.GetType(), err)
	}
	res := c.apply(s, index, timeFromNanos(cmd.GetTimeUnixNano()), msg)
	res.Index = index
	return res, nil
}

// command is one command the state machine knows: a new empty payload and
// how the payload changes the state.
type command struct {
	payload func() proto.Message
	apply   func(s *state, index uint64, now time.Time, m proto.Message) *pb.ApplyResult
}

// commandOf builds a command from a typed payload constructor and apply.
func commandOf[T proto.Message](payload func() T, apply func(s *state, index uint64, now time.Time, p T) *pb.ApplyResult) command {
	return command{
		payload: func() proto.Message { return payload() },
		apply: func(s *state, index uint64, now time.Time, m proto.Message) *pb.ApplyResult {
			return apply(s, index, now, m.(T))
		},
	}
}

// commandFor is the one list of the commands the state machine knows, by
// type; false for a type this version does not know.
func commandFor(t pb.CommandType) (command, bool) {
	switch t {
	case pb.CommandType_COMMAND_TYPE_KEY_CREATE:
		return commandOf(func() *pb.KeyCreate { return &pb.KeyCreate{} }, func(s *state, _ uint64, now time.Time, p *pb.KeyCreate) *pb.ApplyResult {
			return s.keys.create(now, p)
		}), true
	case pb.CommandType_COMMAND_TYPE_KEY_UPDATE:
		return commandOf(func() *pb.KeyUpdate { return &pb.KeyUpdate{} }, func(s *state, _ uint64, _ time.Time, p *pb.KeyUpdate) *pb.ApplyResult {
			return s.keys.update(p)
		}), true
	case pb.CommandType_COMMAND_TYPE_KEY_REVOKE:
		return commandOf(func() *pb.KeyRevoke { return &pb.KeyRevoke{} }, func(s *state, _ uint64, now time.Time, p *pb.KeyRevoke) *pb.ApplyResult {
			res := s.keys.revoke(now, p)
			if res.GetRejectionCode() == "" {
				s.leases.dropKey(p.GetId())
			}
			return res
		}), true
	case pb.CommandType_COMMAND_TYPE_POLICY_SET:
		return commandOf(func() *pb.PolicySet { return &pb.PolicySet{} }, func(s *state, index uint64, _ time.Time, p *pb.PolicySet) *pb.ApplyResult {
			return s.policy.set(index, p)
		}), true
	case pb.CommandType_COMMAND_TYPE_POLICY_UPDATE:
		return commandOf(func() *pb.PolicyUpdate { return &pb.PolicyUpdate{} }, func(s *state, index uint64, _ time.Time, p *pb.PolicyUpdate) *pb.ApplyResult {
			return s.policy.update(index, p)
		}), true
	case pb.CommandType_COMMAND_TYPE_POLICY_NODE_SET:
		return commandOf(func() *pb.PolicyNodeSet { return &pb.PolicyNodeSet{} }, func(s *state, index uint64, _ time.Time, p *pb.PolicyNodeSet) *pb.ApplyResult {
			return s.policy.setNode(index, p)
		}), true
	case pb.CommandType_COMMAND_TYPE_POLICY_MODEL_SET:
		return commandOf(func() *pb.PolicyModelSet { return &pb.PolicyModelSet{} }, func(s *state, index uint64, _ time.Time, p *pb.PolicyModelSet) *pb.ApplyResult {
			return s.policy.setModel(index, p)
		}), true
	case pb.CommandType_COMMAND_TYPE_LEASE_ACQUIRE:
		return commandOf(func() *pb.LeaseAcquire { return &pb.LeaseAcquire{} }, func(s *state, _ uint64, now time.Time, p *pb.LeaseAcquire) *pb.ApplyResult {
			return s.leases.acquire(now, p, &s.keys, &s.policy)
		}), true
	case pb.CommandType_COMMAND_TYPE_LEASE_SETTLE:
		return commandOf(func() *pb.LeaseSettle { return &pb.LeaseSettle{} }, func(s *state, _ uint64, now time.Time, p *pb.LeaseSettle) *pb.ApplyResult {
			return s.leases.settle(now, p, &s.keys, &s.policy)
		}), true
	case pb.CommandType_COMMAND_TYPE_USAGE_BATCH:
		return commandOf(func() *pb.UsageBatch { return &pb.UsageBatch{} }, func(s *state, _ uint64, _ time.Time, p *pb.UsageBatch) *pb.ApplyResult {
			return s.usage.apply(p)
		}), true
	case pb.CommandType_COMMAND_TYPE_AUDIT_KEY_SET:
		return commandOf(func() *pb.AuditKeySet { return &pb.AuditKeySet{} }, func(s *state, _ uint64, _ time.Time, p *pb.AuditKeySet) *pb.ApplyResult {
			return s.auditKeys.set(p)
		}), true
	}
	return command{}, false
}

// payloadFor returns an empty payload message for a known command type and
// nil for an unknown one.
func payloadFor(t pb.CommandType) proto.Message {
	if c, ok := commandFor(t); ok {
		return c.payload()
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

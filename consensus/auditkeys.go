package consensus

import (
	"crypto/ed25519"
	"maps"
	"slices"

	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// auditKeyTable holds each node's audit public key (node/audit signs
// records with the private half), so `infermesh audit verify` checks
// records against keys the mesh agreed on rather than ones a file
// carries.
type auditKeyTable map[string][]byte

func (t auditKeyTable) set(s *pb.AuditKeySet) *pb.ApplyResult {
	k := s.GetKey()
	if k.GetNodeId() == "" {
		return reject(codeInvalid, "node id is required")
	}
	if len(k.GetPublicKey()) != ed25519.PublicKeySize {
		return reject(codeInvalid, "an audit key is %d bytes", ed25519.PublicKeySize)
	}
	t[k.GetNodeId()] = slices.Clone(k.GetPublicKey())
	return &pb.ApplyResult{}
}

func (t auditKeyTable) toProto() []*pb.AuditKey {
	var out []*pb.AuditKey
	for _, id := range slices.Sorted(maps.Keys(t)) {
		out = append(out, &pb.AuditKey{NodeId: id, PublicKey: t[id]})
	}
	return out
}

func (t auditKeyTable) load(keys []*pb.AuditKey) error {
	for _, k := range keys {
		if k.GetNodeId() == "" || len(k.GetPublicKey()) != ed25519.PublicKeySize {
			return errorf("snapshot: bad audit key for %q", k.GetNodeId())
		}
		if _, dup := t[k.GetNodeId()]; dup {
			return errorf("snapshot: duplicate audit key for %q", k.GetNodeId())
		}
		t[k.GetNodeId()] = slices.Clone(k.GetPublicKey())
	}
	return nil
}

// AuditKeys returns every node's audit public key.
func (v View) AuditKeys() map[string]ed25519.PublicKey {
	out := map[string]ed25519.PublicKey{}
	v.f.read(func(s *state) {
		for id, k := range s.auditKeys {
			out[id] = slices.Clone(k)
		}
	})
	return out
}

// Plan returns the server plan and the first-party applications, without
// copying the rest of the policy (read on every admitted request).
func (v View) Plan() (plan string, firstPartyApps []string) {
	v.f.read(func(s *state) { plan, firstPartyApps = s.policy.plan, slices.Clone(s.policy.firstParty) })
	return plan, firstPartyApps
}

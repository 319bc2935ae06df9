package consensus

import (
	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// Result is the applied outcome of one command.
type Result struct {
	// Index is the raft log index the command was applied at.
	Index uint64
	// Key is the key after a key command.
	Key *Key
	// Lease is the node's holding after AcquireLease.
	Lease *LeaseGrant
	// Settled are the holdings after SettleLeases, in request order.
	Settled []LeaseGrant
	// Policy is the whole policy after a policy command.
	Policy *Policy
	// Skipped is set when the command's type was unknown to the leader's
	// version and ignorable, so it was skipped.
	Skipped bool
}

// resultFromProto converts an applied result; a rejection becomes a
// *RejectedError next to a Result carrying only the index.
func resultFromProto(r *pb.ApplyResult) (Result, error) {
	res := Result{Index: r.GetIndex(), Skipped: r.GetSkipped()}
	if r.GetRejectionCode() != "" {
		return res, &RejectedError{Index: r.GetIndex(), Code: r.GetRejectionCode(), Message: r.GetRejectionMessage()}
	}
	if r.GetKey() != nil {
		k, err := keyFromProto(r.GetKey())
		if err != nil {
			return res, err
		}
		res.Key = k
	}
	if r.GetLease() != nil {
		g := grantFromProto(r.GetLease())
		res.Lease = &g
	}
	for _, g := range r.GetSettled() {
		res.Settled = append(res.Settled, grantFromProto(g))
	}
	if r.GetPolicy() != nil {
		p := policyFromProto(r.GetPolicy())
		res.Policy = &p
	}
	return res, nil
}

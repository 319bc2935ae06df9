package consensus

// View reads this node's copy of the replicated state. Reads are local: a
// follower may lag the leader by the entries it has not applied yet. Every
// method returns copies, never references into the state.
type View struct {
	f *fsm
}

// KeyByHash finds a key by the hash of its plaintext (SHA-256).
func (v View) KeyByHash(h KeyHash) (Key, bool) {
	var (
		k  Key
		ok bool
	)
	v.f.read(func(s *state) {
		if p := s.keys.byHash[h]; p != nil {
			k, ok = p.clone(), true
		}
	})
	return k, ok
}

// Key finds a key by id.
func (v View) Key(id string) (Key, bool) {
	var (
		k  Key
		ok bool
	)
	v.f.read(func(s *state) {
		if p := s.keys.byID[id]; p != nil {
			k, ok = p.clone(), true
		}
	})
	return k, ok
}

// Keys lists every key, revoked ones included, sorted by id.
func (v View) Keys() []Key {
	var out []Key
	v.f.read(func(s *state) {
		for _, k := range s.keys.sorted() {
			out = append(out, k.clone())
		}
	})
	return out
}

// Policy returns the pool policy with unset pool-wide fields filled with
// DefaultStrategy and DefaultGovernance.
func (v View) Policy() Policy {
	var p Policy
	v.f.read(func(s *state) { p = s.policy.view() })
	if p.Strategy == "" {
		p.Strategy = DefaultStrategy
	}
	if p.Governance == "" {
		p.Governance = DefaultGovernance
	}
	return p
}

// PolicyRevision returns the raft index of the policy's last change (0
// before any policy is set), without copying the policy: a reader that
// caches what it derives from Policy checks it per request.
func (v View) PolicyRevision() uint64 {
	var rev uint64
	v.f.read(func(s *state) { rev = s.policy.revision })
	return rev
}

// NodePolicy returns one node's routing settings.
func (v View) NodePolicy(nodeID string) (NodePolicy, bool) {
	var (
		np NodePolicy
		ok bool
	)
	v.f.read(func(s *state) { np, ok = s.policy.nodes[nodeID] })
	return np, ok
}

// ModelPolicy returns one model's lifecycle and price.
func (v View) ModelPolicy(model string) (ModelPolicy, bool) {
	var (
		mp ModelPolicy
		ok bool
	)
	v.f.read(func(s *state) { mp, ok = s.policy.models[model] })
	return mp, ok
}

// Ledger returns the lease ledger of a key, kind and period.
func (v View) Ledger(keyID string, kind LeaseKind, period string) (LeaseLedger, bool) {
	var (
		l  LeaseLedger
		ok bool
	)
	v.f.read(func(s *state) {
		pk := periodKey{kind, period}
		if r := s.leases.record(keyID, pk, false); r != nil {
			l, ok = ledgerFromProto(recordToProto(keyID, pk, r)), true
		}
	})
	return l, ok
}

// Ledgers lists every lease ledger sorted by key id, kind and period.
func (v View) Ledgers() []LeaseLedger {
	var out []LeaseLedger
	v.f.read(func(s *state) {
		for _, lr := range s.leases.ledgers() {
			out = append(out, ledgerFromProto(lr))
		}
	})
	return out
}

// Holdings lists what nodeID holds in every ledger, sorted by key id, kind
// and period; a draining node settles and releases each of them. Holdings
// past ExpiresAt are already void and count as used.
func (v View) Holdings(nodeID string) []LeaseGrant {
	var out []LeaseGrant
	v.f.read(func(s *state) {
		for _, lr := range s.leases.ledgers() {
			for _, h := range lr.GetHolds() {
				if h.GetNodeId() == nodeID {
					out = append(out, LeaseGrant{
						KeyID: lr.GetKeyId(), Kind: lr.GetKind(), Period: lr.GetPeriod(),
						Held: h.GetAmount(), ExpiresAt: timeFromNanos(h.GetExpiresUnixNano()),
					})
				}
			}
		}
	})
	return out
}

// Usage sums usage totals by one dimension, sorted by group.
func (v View) Usage(by UsageDimension) []UsageRow { return v.UsageIn(by, DayRange{}) }

// UsageIn sums the usage totals of the UTC days in r by one dimension,
// sorted by group.
func (v View) UsageIn(by UsageDimension, r DayRange) []UsageRow {
	var out []UsageRow
	v.f.read(func(s *state) { out = s.usage.group(by, r) })
	return out
}

// UsageTotals lists the totals per app, model, key and node, sorted.
func (v View) UsageTotals() []UsageTotal {
	var out []UsageTotal
	v.f.read(func(s *state) { out = s.usage.rows() })
	return out
}

// Digest is a hash of the canonical state; replicas that applied the same
// entries report the same digest.
func (v View) Digest() string {
	var d string
	v.f.read(func(s *state) { d = s.digest() })
	return d
}

// AppliedIndex is the raft index of the last entry applied to this copy.
func (v View) AppliedIndex() uint64 {
	var i uint64
	v.f.read(func(*state) { i = v.f.applied })
	return i
}

// DigestAt returns the digest and applied index read together, so two
// replicas can be compared at the same index.
func (v View) DigestAt() (string, uint64) {
	var (
		d string
		i uint64
	)
	v.f.read(func(s *state) { d, i = s.digest(), v.f.applied })
	return d, i
}

package consensus

import (
	"cmp"
	"maps"
	"slices"
	"time"

	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// LeaseKind names the limit a lease is a slice of.
type LeaseKind = pb.LeaseKind

// Lease kinds.
const (
	// LeaseDailyRequests slices a key's daily request quota; periods are
	// UTC days such as "2026-11-22".
	LeaseDailyRequests = pb.LeaseKind_LEASE_KIND_DAILY_REQUESTS
	// LeaseMonthlyBudget slices a key's monthly budget in micro-units;
	// periods are UTC months such as "2026-11".
	LeaseMonthlyBudget = pb.LeaseKind_LEASE_KIND_MONTHLY_BUDGET
)

// DefaultLeaseTTL is how long a holding lasts when the request names no TTL.
const DefaultLeaseTTL = time.Minute

// LeaseGrant is a node's holding after a lease command.
type LeaseGrant struct {
	KeyID  string    // key whose limit is sliced
	Kind   LeaseKind // which limit
	Period string    // UTC day or month of the holding
	// Granted is what this command added.
	Granted int64
	// Held is the node's whole holding in the period after the command.
	Held int64
	// Limit is the key's limit when the command applied.
	Limit int64
	// Remaining is what is left to grant in the period.
	Remaining int64
	// ExpiresAt ends the holding; the node must not admit against it later.
	ExpiresAt time.Time
	// Unlimited means the key has no such limit and nothing needs counting.
	Unlimited bool
}

// LeaseHold is one node's outstanding slice in a ledger.
type LeaseHold struct {
	NodeID    string    // holder
	Amount    int64     // amount held
	ExpiresAt time.Time // end of the holding
}

// LeaseLedger is the account of one key, kind and period: Used plus the
// holds never exceeds the limit the grants were made under.
type LeaseLedger struct {
	KeyID  string    // key
	Kind   LeaseKind // which limit
	Period string    // UTC day or month
	// Used is consumption reported by nodes plus holdings that expired
	// unreported (counted as fully used, so nothing is admitted twice).
	Used int64
	// Expired is the part of Used that came from expired holdings.
	Expired int64
	Holds   []LeaseHold // sorted by node id
}

// Period returns the period of kind that contains t, and when it ends.
func Period(kind LeaseKind, t time.Time) (string, time.Time) {
	t = t.UTC()
	y, m, d := t.Date()
	if kind == LeaseMonthlyBudget {
		return t.Format("2006-01"), time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC)
	}
	return t.Format("2006-01-02"), time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
}

func previousPeriod(kind LeaseKind, t time.Time) string {
	t = t.UTC()
	y, m, d := t.Date()
	if kind == LeaseMonthlyBudget {
		return time.Date(y, m-1, 1, 0, 0, 0, 0, time.UTC).Format("2006-01")
	}
	return time.Date(y, m, d-1, 0, 0, 0, 0, time.UTC).Format("2006-01-02")
}

func validLeaseKind(k LeaseKind) bool { return k == LeaseDailyRequests || k == LeaseMonthlyBudget }

func kindLimit(k *Key, kind LeaseKind) int64 {
	if kind == LeaseMonthlyBudget {
		return k.Limits.MonthlyBudgetMicros
	}
	return k.Limits.DailyQuota
}

type periodKey struct {
	kind   LeaseKind
	period string
}

type leaseHold struct {
	amount  int64
	expires int64 // Unix nanoseconds
}

type leaseRecord struct {
	used    int64
	expired int64
	holds   map[string]*leaseHold
}

func (r *leaseRecord) held() int64 {
	var sum int64
	for _, h := range r.holds {
		sum += h.amount
	}
	return sum
}

// sweep counts holdings that expired at or before now as fully used.
func (r *leaseRecord) sweep(now int64) {
	for node, h := range r.holds {
		if h.expires <= now {
			r.used += h.amount
			r.expired += h.amount
			delete(r.holds, node)
		}
	}
}

// consume moves up to n from the node's holding to used. Consumption beyond
// the holding cannot have been admitted legitimately and is not counted
// against the limit.
func (r *leaseRecord) consume(node string, n int64) {
	h := r.holds[node]
	if h == nil || n <= 0 {
		return
	}
	c := min(n, h.amount)
	h.amount -= c
	r.used += c
	if h.amount == 0 {
		delete(r.holds, node)
	}
}

type leaseTable struct {
	byKey map[string]map[periodKey]*leaseRecord
}

func newLeaseTable() leaseTable {
	return leaseTable{byKey: map[string]map[periodKey]*leaseRecord{}}
}

func (t *leaseTable) record(keyID string, pk periodKey, create bool) *leaseRecord {
	recs := t.byKey[keyID]
	if recs == nil {
		if !create {
			return nil
		}
		recs = map[periodKey]*leaseRecord{}
		t.byKey[keyID] = recs
	}
	r := recs[pk]
	if r == nil && create {
		r = &leaseRecord{holds: map[string]*leaseHold{}}
		recs[pk] = r
	}
	return r
}

// tidy drops a ledger with nothing in it, and the key's map when empty.
func (t *leaseTable) tidy(keyID string, pk periodKey) {
	recs := t.byKey[keyID]
	if r := recs[pk]; r != nil && r.used == 0 && len(r.holds) == 0 {
		delete(recs, pk)
	}
	if len(recs) == 0 {
		delete(t.byKey, keyID)
	}
}

// prune keeps the current and the previous period of kind for the key, so
// late settlements right after midnight still find their ledger.
func (t *leaseTable) prune(keyID string, kind LeaseKind, now time.Time) {
	prev := previousPeriod(kind, now)
	for pk := range t.byKey[keyID] {
		if pk.kind == kind && pk.period < prev {
			delete(t.byKey[keyID], pk)
		}
	}
}

func (t *leaseTable) dropKey(keyID string) { delete(t.byKey, keyID) }

// ledgerLimit is the limit of keyID's ledger of kind: the key's own, or
// for the reserved FreeAllowanceKeyID the Free plan's daily allowance
// (zero, unlimited, on Pro). It answers a rejection for an unknown or
// inactive key.
func ledgerLimit(now time.Time, keyID string, kind pb.LeaseKind, keys *keysTable, pol *policyTable) (int64, *pb.ApplyResult) {
	if keyID == FreeAllowanceKeyID {
		if kind != pb.LeaseKind_LEASE_KIND_DAILY_REQUESTS {
			return 0, reject(codeInvalid, "the %s ledger counts daily requests only", FreeAllowanceKeyID)
		}
		if pol.plan == PlanFree {
			return FreeDailyRequests, nil
		}
		return 0, nil
	}
	k := keys.byID[keyID]
	if k == nil {
		return 0, reject(codeNotFound, "no key %q", keyID)
	}
	if !k.Active(now) {
		return 0, reject(codeInactive, "key %q is revoked or expired", k.ID)
	}
	return kindLimit(k, kind), nil
}

func (t *leaseTable) acquire(now time.Time, a *pb.LeaseAcquire, keys *keysTable, pol *policyTable) *pb.ApplyResult {
	switch {
	case a.GetNodeId() == "" || a.GetKeyId() == "":
		return reject(codeInvalid, "node id and key id are required")
	case !validLeaseKind(a.GetKind()):
		return reject(codeInvalid, "unknown lease kind %d", a.GetKind())
	case a.GetWant() < 0 || a.GetConsumed() < 0 || a.GetTtlMs() < 0:
		return reject(codeInvalid, "want, consumed and ttl cannot be negative")
	}
	kind := a.GetKind()
	limit, rej := ledgerLimit(now, a.GetKeyId(), kind, keys, pol)
	if rej != nil {
		return rej
	}
	keyID := a.GetKeyId()
	period, end := Period(kind, now)
	t.prune(keyID, kind, now)
	if limit == 0 {
		return &pb.ApplyResult{Lease: &pb.LeaseGrant{
			KeyId: keyID, Kind: kind, Period: period, Granted: a.GetWant(), Held: a.GetWant(),
			ExpiresUnixNano: end.UnixNano(), Unlimited: true,
		}}
	}
	pk := periodKey{kind, period}
	r := t.record(keyID, pk, true)
	nowN := now.UnixNano()
	r.sweep(nowN)
	r.consume(a.GetNodeId(), a.GetConsumed())
	granted := min(a.GetWant(), max(0, limit-r.used-r.held()))
	h := r.holds[a.GetNodeId()]
	if granted > 0 {
		if h == nil {
			h = &leaseHold{}
			r.holds[a.GetNodeId()] = h
		}
		h.amount += granted
	}
	if h != nil && a.GetWant() > 0 {
		ttl := time.Duration(a.GetTtlMs()) * time.Millisecond
		if ttl == 0 {
			ttl = DefaultLeaseTTL
		}
		h.expires = min(now.Add(ttl).UnixNano(), end.UnixNano())
	}
	g := grantOf(keyID, pk, r, a.GetNodeId(), limit)
	g.Granted = granted
	t.tidy(keyID, pk)
	return &pb.ApplyResult{Lease: g}
}

func (t *leaseTable) settle(now time.Time, s *pb.LeaseSettle, keys *keysTable, pol *policyTable) *pb.ApplyResult {
	node := s.GetNodeId()
	if node == "" {
		return reject(codeInvalid, "node id is required")
	}
	for _, st := range s.GetSettlements() {
		switch {
		case st.GetKeyId() == "" || st.GetPeriod() == "":
			return reject(codeInvalid, "key id and period are required")
		case !validLeaseKind(st.GetKind()):
			return reject(codeInvalid, "unknown lease kind %d", st.GetKind())
		case st.GetConsumed() < 0:
			return reject(codeInvalid, "consumed cannot be negative")
		}
	}
	res := &pb.ApplyResult{}
	nowN := now.UnixNano()
	for _, st := range s.GetSettlements() {
		pk := periodKey{st.GetKind(), st.GetPeriod()}
		var limit int64
		if st.GetKeyId() == FreeAllowanceKeyID {
			limit, _ = ledgerLimit(now, st.GetKeyId(), pk.kind, keys, pol)
		} else if k := keys.byID[st.GetKeyId()]; k != nil {
			limit = kindLimit(k, pk.kind)
		}
		r := t.record(st.GetKeyId(), pk, false)
		if r == nil {
			res.Settled = append(res.Settled, &pb.LeaseGrant{
				KeyId: st.GetKeyId(), Kind: pk.kind, Period: pk.period, Limit: limit, Unlimited: limit == 0,
			})
			continue
		}
		r.sweep(nowN)
		r.consume(node, st.GetConsumed())
		if st.GetRelease() {
			delete(r.holds, node)
		}
		res.Settled = append(res.Settled, grantOf(st.GetKeyId(), pk, r, node, limit))
		t.tidy(st.GetKeyId(), pk)
	}
	return res
}

func grantOf(keyID string, pk periodKey, r *leaseRecord, node string, limit int64) *pb.LeaseGrant {
	g := &pb.LeaseGrant{KeyId: keyID, Kind: pk.kind, Period: pk.period, Limit: limit, Unlimited: limit == 0}
	if h := r.holds[node]; h != nil {
		g.Held = h.amount
		g.ExpiresUnixNano = h.expires
	}
	g.Remaining = max(0, limit-r.used-r.held())
	return g
}

func (t *leaseTable) ledgers() []*pb.LeaseRecord {
	var out []*pb.LeaseRecord
	for _, keyID := range slices.Sorted(maps.Keys(t.byKey)) {
		recs := t.byKey[keyID]
		pks := slices.SortedFunc(maps.Keys(recs), func(a, b periodKey) int {
			return cmp.Or(cmp.Compare(a.kind, b.kind), cmp.Compare(a.period, b.period))
		})
		for _, pk := range pks {
			out = append(out, recordToProto(keyID, pk, recs[pk]))
		}
	}
	return out
}

func recordToProto(keyID string, pk periodKey, r *leaseRecord) *pb.LeaseRecord {
	lr := &pb.LeaseRecord{KeyId: keyID, Kind: pk.kind, Period: pk.period, Used: r.used, Expired: r.expired}
	for _, node := range slices.Sorted(maps.Keys(r.holds)) {
		h := r.holds[node]
		lr.Holds = append(lr.Holds, &pb.LeaseHold{NodeId: node, Amount: h.amount, ExpiresUnixNano: h.expires})
	}
	return lr
}

func (t *leaseTable) load(recs []*pb.LeaseRecord) error {
	for _, lr := range recs {
		if lr.GetKeyId() == "" || !validLeaseKind(lr.GetKind()) {
			return errorf("snapshot: malformed lease ledger for %q", lr.GetKeyId())
		}
		pk := periodKey{lr.GetKind(), lr.GetPeriod()}
		if t.record(lr.GetKeyId(), pk, false) != nil {
			return errorf("snapshot: duplicate lease ledger %s/%s", lr.GetKeyId(), lr.GetPeriod())
		}
		r := t.record(lr.GetKeyId(), pk, true)
		r.used, r.expired = lr.GetUsed(), lr.GetExpired()
		for _, h := range lr.GetHolds() {
			r.holds[h.GetNodeId()] = &leaseHold{amount: h.GetAmount(), expires: h.GetExpiresUnixNano()}
		}
	}
	return nil
}

func ledgerFromProto(lr *pb.LeaseRecord) LeaseLedger {
	l := LeaseLedger{KeyID: lr.GetKeyId(), Kind: lr.GetKind(), Period: lr.GetPeriod(), Used: lr.GetUsed(), Expired: lr.GetExpired()}
	for _, h := range lr.GetHolds() {
		l.Holds = append(l.Holds, LeaseHold{NodeID: h.GetNodeId(), Amount: h.GetAmount(), ExpiresAt: timeFromNanos(h.GetExpiresUnixNano())})
	}
	return l
}

func grantFromProto(g *pb.LeaseGrant) LeaseGrant {
	return LeaseGrant{
		KeyID: g.GetKeyId(), Kind: g.GetKind(), Period: g.GetPeriod(),
		Granted: g.GetGranted(), Held: g.GetHeld(), Limit: g.GetLimit(), Remaining: g.GetRemaining(),
		ExpiresAt: timeFromNanos(g.GetExpiresUnixNano()), Unlimited: g.GetUnlimited(),
	}
}

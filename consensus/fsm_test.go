package consensus

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/infermesh/infermesh/consensus/routing"
	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

func TestKeys(t *testing.T) {
	m := newMachine(t)
	h := hashKey("sk-alpha")
	res := m.ok(must(CreateKey(KeySpec{Hash: h, Name: "alpha", App: "app1", Endpoints: []string{"vision", "chat", "vision"},
		Limits: Limits{RPM: 60, DailyQuota: 100}, ExpiresAt: t0.Add(time.Hour)})), t0)
	id := res.GetKey().GetId()
	if id != keyIDFromHash(h) {
		t.Fatalf("derived id %q, want %q", id, keyIDFromHash(h))
	}
	k, ok := m.view().KeyByHash(h)
	if !ok || k.ID != id || k.Name != "alpha" || k.App != "app1" || k.Admin || !k.CreatedAt.Equal(t0) {
		t.Fatalf("KeyByHash = %+v, %v", k, ok)
	}
	if !slices.Equal(k.Endpoints, []string{"chat", "vision"}) {
		t.Fatalf("endpoints %v, want sorted and de-duplicated", k.Endpoints)
	}
	if !k.Allows("vision") || k.Allows("images") {
		t.Fatal("allowlist not applied")
	}
	if !k.Active(t0) || k.Active(t0.Add(time.Hour)) {
		t.Fatal("expiry not applied")
	}
	if _, ok := m.view().KeyByHash(hashKey("sk-other")); ok {
		t.Fatal("unknown hash found")
	}

	// The same create again (a retry) answers with the existing key.
	again := m.ok(must(CreateKey(KeySpec{Hash: h, Name: "alpha"})), t0.Add(time.Minute))
	if again.GetKey().GetId() != id || again.GetKey().GetCreatedUnixNano() != t0.UnixNano() {
		t.Fatalf("retried create = %v", again.GetKey())
	}
	if code := m.apply(must(CreateKey(KeySpec{ID: "other", Hash: h, Name: "dup"})), t0).GetRejectionCode(); code != codeConflict {
		t.Fatalf("same hash under another id: code %q, want conflict", code)
	}
	if code := m.apply(must(CreateKey(KeySpec{ID: id, Hash: hashKey("sk-beta"), Name: "dup"})), t0).GetRejectionCode(); code != codeConflict {
		t.Fatalf("same id: code %q, want conflict", code)
	}

	name, admin := "alpha2", true
	eps := []string{"models"}
	noExpiry := time.Time{}
	// KeyUpdate is no longer issued, but an old log may hold one.
	zero := nanosFromTime(noExpiry)
	m.ok(must(legacyKeyUpdate(&pb.KeyUpdate{Id: id, Name: &name, Admin: &admin, SetEndpoints: true, Endpoints: eps, ExpiresUnixNano: &zero})), t0)
	k, _ = m.view().Key(id)
	if k.Name != "alpha2" || !k.Admin || !slices.Equal(k.Endpoints, eps) || !k.ExpiresAt.IsZero() || k.Limits.RPM != 60 {
		t.Fatalf("after update: %+v", k)
	}
	if code := m.apply(must(legacyKeyUpdate(&pb.KeyUpdate{Id: "missing", Name: &name})), t0).GetRejectionCode(); code != codeNotFound {
		t.Fatalf("update of a missing key: %q", code)
	}

	m.ok(must(RevokeKey(id)), t0.Add(2*time.Minute))
	k, _ = m.view().KeyByHash(h)
	if !k.Revoked || k.Active(t0) || !k.RevokedAt.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("after revoke: %+v", k)
	}
	if code := m.apply(must(RevokeKey("missing")), t0).GetRejectionCode(); code != codeNotFound {
		t.Fatalf("revoke of a missing key: %q", code)
	}
	if got := len(m.view().Keys()); got != 1 {
		t.Fatalf("%d keys listed, want 1", got)
	}
}

func TestKeyViewIsACopy(t *testing.T) {
	m := newMachine(t)
	h := hashKey("sk-copy")
	m.ok(must(CreateKey(KeySpec{Hash: h, Name: "copy", Endpoints: []string{"chat", "vision"}})), t0)
	k, _ := m.view().KeyByHash(h)
	k.Endpoints[0] = "pull"
	k.Name = "changed"
	again, _ := m.view().KeyByHash(h)
	if again.Endpoints[0] != "chat" || again.Name != "copy" {
		t.Fatalf("a view change reached the state: %+v", again)
	}
}

func TestPolicy(t *testing.T) {
	m := newMachine(t)
	p := m.view().Policy()
	if p.Strategy != DefaultStrategy || p.Governance != DefaultGovernance || p.Revision != 0 {
		t.Fatalf("default policy %+v", p)
	}
	seed := Policy{
		Strategy: "weighted", Governance: GovernanceCurated,
		Nodes:  []NodePolicy{{NodeID: "n2", Node: routing.Node{Weight: 2}}, {NodeID: "n1", Node: routing.Node{Weight: 5, Canary: true, CanaryPercent: 10, InflightCap: 8}}},
		Models: []ModelPolicy{{Model: "old", Lifecycle: LifecycleDeprecated, Replacement: "new"}, {Model: "bad", Lifecycle: LifecycleBlocked}},
	}
	res := m.ok(must(SetPolicy(seed, true)), t0)
	if res.GetPolicy().GetRevision() != m.index {
		t.Fatalf("revision %d, want %d", res.GetPolicy().GetRevision(), m.index)
	}
	// Seeding again (another node's first start) changes nothing.
	if code := m.apply(must(SetPolicy(Policy{Strategy: "sticky"}, true)), t0).GetRejectionCode(); code != codeAlreadySet {
		t.Fatalf("second seed: %q, want already_set", code)
	}
	p = m.view().Policy()
	if p.Strategy != "weighted" || p.Governance != GovernanceCurated || len(p.Nodes) != 2 || p.Nodes[0].NodeID != "n1" || p.Models[0].Model != "bad" {
		t.Fatalf("policy after seed: %+v", p)
	}
	np, ok := m.view().NodePolicy("n1")
	if !ok || np.Weight != 5 || !np.Canary || np.CanaryPercent != 10 || np.InflightCap != 8 {
		t.Fatalf("node policy n1 = %+v", np)
	}
	mp, _ := m.view().ModelPolicy("old")
	if mp.Lifecycle != LifecycleDeprecated || mp.Replacement != "new" {
		t.Fatalf("model policy = %+v", mp)
	}

	open := GovernanceOpen
	m.ok(must(UpdatePolicy(PolicyChange{Governance: &open})), t0)
	// PolicyNodeSet and PolicyModelSet are no longer issued, but an old
	// log may hold them.
	m.ok(must(legacyNodePolicy(NodePolicy{NodeID: "n2"}, true)), t0)
	m.ok(must(legacyModelPolicy(ModelPolicy{Model: "old", Price: Price{RequestMicros: 3, InputPerMillionMicros: 1_000_000}}, false)), t0)
	p = m.view().Policy()
	if p.Strategy != "weighted" || p.Governance != GovernanceOpen || len(p.Nodes) != 1 {
		t.Fatalf("policy after updates: %+v", p)
	}
	mp, _ = m.view().ModelPolicy("old")
	if mp.Lifecycle != LifecycleActive || mp.Price.Cost(10, 0) != 3+10 {
		t.Fatalf("model policy after update: %+v (cost %d)", mp, mp.Price.Cost(10, 0))
	}
	// A full replace without only_if_unset wins.
	m.ok(must(SetPolicy(Policy{Strategy: "sticky"}, false)), t0)
	if p := m.view().Policy(); p.Strategy != "sticky" || len(p.Nodes) != 0 || len(p.Models) != 0 {
		t.Fatalf("after replace: %+v", p)
	}
}

func TestBuildersRefuseBadValues(t *testing.T) {
	bad := "Not A Name"
	mode := "anarchy"
	cases := map[string]error{
		"key without hash":      second(CreateKey(KeySpec{Name: "x"})),
		"key without name":      second(CreateKey(KeySpec{Hash: hashKey("x")})),
		"bad endpoint":          second(CreateKey(KeySpec{Hash: hashKey("x"), Name: "x", Endpoints: []string{"Chat!"}})),
		"negative quota":        second(CreateKey(KeySpec{Hash: hashKey("x"), Name: "x", Limits: Limits{DailyQuota: -1}})),
		"bad strategy":          second(UpdatePolicy(PolicyChange{Strategy: &bad})),
		"bad governance":        second(UpdatePolicy(PolicyChange{Governance: &mode})),
		"canary percent":        second(SetPolicy(Policy{Nodes: []NodePolicy{{NodeID: "n1", Node: routing.Node{CanaryPercent: 101}}}}, false)),
		"lifecycle":             second(SetPolicy(Policy{Models: []ModelPolicy{{Model: "m", Lifecycle: "retired"}}}, false)),
		"duplicate node":        second(SetPolicy(Policy{Nodes: []NodePolicy{{NodeID: "a"}, {NodeID: "a"}}}, false)),
		"lease kind":            second(AcquireLease(LeaseRequest{NodeID: "n", KeyID: "k", Want: 1})),
		"negative want":         second(AcquireLease(LeaseRequest{NodeID: "n", KeyID: "k", Kind: LeaseDailyRequests, Want: -1})),
		"settlement w/o period": second(SettleLeases("n", []Settlement{{KeyID: "k", Kind: LeaseDailyRequests}})),
		"negative usage":        second(RecordUsage("n", 1, []UsageEntry{{Requests: -1}})),
		"usage without node":    second(RecordUsage("", 1, nil)),
		"revoke without id":     second(RevokeKey("")),
		"model without id":      second(SetPolicy(Policy{Models: []ModelPolicy{{}}}, false)),
	}
	for name, err := range cases {
		if err == nil {
			t.Errorf("%s: builder accepted it", name)
		}
	}
}

func second[T any](_ T, err error) error { return err }

func TestUsage(t *testing.T) {
	m := newMachine(t)
	m.ok(must(RecordUsage("n1", 1, []UsageEntry{
		{App: "a", Model: "m1", KeyID: "k1", Requests: 2, InputTokens: 10, OutputTokens: 20, CostMicros: 5},
		{App: "b", Model: "m1", KeyID: "k2", Requests: 1, InputTokens: 1, Errors: 1},
	})), t0)
	m.ok(must(RecordUsage("n2", 1, []UsageEntry{{App: "a", Model: "m2", KeyID: "k1", Requests: 3, OutputTokens: 7}})), t0)
	m.ok(must(RecordUsage("n1", 2, []UsageEntry{{App: "a", Model: "m1", KeyID: "k1", Requests: 1, InputTokens: 5}})), t0)
	// A retried batch is recognised and not counted again.
	if code := m.apply(must(RecordUsage("n1", 2, []UsageEntry{{App: "a", Model: "m1", KeyID: "k1", Requests: 100}})), t0).GetRejectionCode(); code != codeDuplicate {
		t.Fatalf("retried batch: %q, want duplicate", code)
	}
	want := map[UsageDimension][]UsageRow{
		ByApp: {
			{Group: "a", Counters: Counters{Requests: 6, InputTokens: 15, OutputTokens: 27, CostMicros: 5}},
			{Group: "b", Counters: Counters{Requests: 1, InputTokens: 1, Errors: 1}},
		},
		ByModel: {
			{Group: "m1", Counters: Counters{Requests: 4, InputTokens: 16, OutputTokens: 20, CostMicros: 5, Errors: 1}},
			{Group: "m2", Counters: Counters{Requests: 3, OutputTokens: 7}},
		},
		ByKey: {
			{Group: "k1", Counters: Counters{Requests: 6, InputTokens: 15, OutputTokens: 27, CostMicros: 5}},
			{Group: "k2", Counters: Counters{Requests: 1, InputTokens: 1, Errors: 1}},
		},
		ByNode: {
			{Group: "n1", Counters: Counters{Requests: 4, InputTokens: 16, OutputTokens: 20, CostMicros: 5, Errors: 1}},
			{Group: "n2", Counters: Counters{Requests: 3, OutputTokens: 7}},
		},
	}
	for by, rows := range want {
		if got := m.view().Usage(by); !slices.Equal(got, rows) {
			t.Errorf("usage by %s = %+v, want %+v", by, got, rows)
		}
	}
	// A request n1 admitted and n3 served is credited to n3 as worker.
	m.ok(must(RecordUsage("n1", 3, []UsageEntry{{App: "a", Model: "m1", KeyID: "k1", Worker: "n3", Requests: 2, OutputTokens: 9}})), t0)
	if got, want := m.view().Usage(ByNode), []UsageRow{
		{Group: "n1", Counters: Counters{Requests: 4, InputTokens: 16, OutputTokens: 20, CostMicros: 5, Errors: 1}},
		{Group: "n2", Counters: Counters{Requests: 3, OutputTokens: 7}},
		{Group: "n3", Counters: Counters{Requests: 2, OutputTokens: 9}},
	}; !slices.Equal(got, want) {
		t.Errorf("usage by worker after a forwarded batch = %+v, want %+v", got, want)
	}
	// Daily totals: a range selects the days it covers.
	m.ok(must(RecordUsage("n2", 2, []UsageEntry{
		{App: "a", Model: "m2", KeyID: "k1", Day: 20000, Requests: 1, OutputTokens: 4},
		{App: "a", Model: "m2", KeyID: "k1", Day: 20001, Requests: 2, OutputTokens: 6},
	})), t0)
	for r, want := range map[DayRange][]UsageRow{
		{From: 20000, To: 20000}: {{Group: "m2", Counters: Counters{Requests: 1, OutputTokens: 4}}},
		{From: 20001}:            {{Group: "m2", Counters: Counters{Requests: 2, OutputTokens: 6}}},
		{From: 19000, To: 19999}: {},
	} {
		if got := m.view().UsageIn(ByModel, r); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Errorf("usage by model in %+v = %+v, want %+v", r, got, want)
		}
	}
	if code := m.apply(must(RecordUsage("n2", 3, nil)), t0).GetRejectionCode(); code != "" {
		t.Fatalf("empty batch refused: %q", code)
	}
	if _, err := RecordUsage("n2", 4, []UsageEntry{{Day: -1, Requests: 1}}); err == nil {
		t.Fatal("a negative day was accepted")
	}
	if d, err := ParseUsageDimension("node"); err != nil || d != ByNode {
		t.Fatalf("ParseUsageDimension(node) = %q, %v", d, err)
	}
	if _, err := ParseUsageDimension("prompt"); err == nil {
		t.Fatal("unknown dimension accepted")
	}
}

func TestUnknownIgnorableCommandIsSkipped(t *testing.T) {
	m := newMachine(t)
	m.ok(must(CreateKey(KeySpec{Hash: hashKey("sk-1"), Name: "one"})), t0)
	before := m.view().Digest()
	out := m.applyRaw(entry(t, &Command{Type: pb.CommandType(900), Ignorable: true, Payload: []byte{1, 2, 3}}, t0))
	if out.err != nil || !out.res.GetSkipped() || out.res.GetIndex() != m.index {
		t.Fatalf("ignorable unknown command: %+v", out)
	}
	if m.view().Digest() != before || m.view().AppliedIndex() != m.index {
		t.Fatal("a skipped command changed the state or did not advance the applied index")
	}
	// The machine keeps applying afterwards.
	m.ok(must(CreateKey(KeySpec{Hash: hashKey("sk-2"), Name: "two"})), t0)
}

func TestUnknownCommandHalts(t *testing.T) {
	for name, data := range map[string][]byte{
		"unknown type":  entry(t, &Command{Type: pb.CommandType(901), Payload: []byte{1}}, t0),
		"not a command": {0xff, 0xff, 0xff},
		"bad payload":   entry(t, &Command{Type: pb.CommandType_COMMAND_TYPE_KEY_CREATE, Payload: []byte{0x0a, 0x7f}}, t0),
	} {
		t.Run(name, func(t *testing.T) {
			m := newMachine(t)
			m.ok(must(CreateKey(KeySpec{Hash: hashKey("sk-1"), Name: "one"})), t0)
			before, index := m.view().Digest(), m.view().AppliedIndex()
			out := m.applyRaw(data)
			if !errors.Is(out.err, ErrHalted) {
				t.Fatalf("outcome %+v, want ErrHalted", out)
			}
			if err := <-m.fatal; !errors.Is(err, ErrHalted) {
				t.Fatalf("OnFatal got %v", err)
			}
			// Nothing after the bad entry applies, so this replica cannot drift.
			out = m.applyRaw(entry(t, must(CreateKey(KeySpec{Hash: hashKey("sk-2"), Name: "two"})), t0))
			if !errors.Is(out.err, ErrHalted) {
				t.Fatalf("entry after the halt: %+v", out)
			}
			if m.view().Digest() != before || m.view().AppliedIndex() != index {
				t.Fatal("state changed after the halt")
			}
			if _, err := m.f.Snapshot(); !errors.Is(err, ErrHalted) {
				t.Fatalf("snapshot of a halted machine: %v", err)
			}
		})
	}
}

func TestApplyIsDeterministic(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		cmds, times := randomCommands(seed, 600)
		a, b := newMachine(t), newMachine(t)
		for i, cmd := range cmds {
			ra, rb := a.apply(cmd, times[i]), b.apply(cmd, times[i])
			if !proto.Equal(ra, rb) {
				t.Fatalf("seed %d command %d (%s): results differ:\n%v\n%v", seed, i, cmd.GetType(), ra, rb)
			}
		}
		if da, db := a.view().Digest(), b.view().Digest(); da != db {
			t.Fatalf("seed %d: digests differ: %s %s", seed, da, db)
		}
		sa, sb := snapshotBytes(t, a.f), snapshotBytes(t, b.f)
		if !bytes.Equal(sa, sb) {
			t.Fatalf("seed %d: snapshots differ", seed)
		}
		if len(a.view().Keys()) == 0 || len(a.view().UsageTotals()) == 0 || len(a.view().Ledgers()) == 0 {
			t.Fatalf("seed %d: the random mix left a table empty; the test would prove little", seed)
		}
	}
}

func TestDigestSeesEveryTable(t *testing.T) {
	base := newMachine(t)
	d0 := base.view().Digest()
	changes := map[string]*Command{
		"key":    must(CreateKey(KeySpec{Hash: hashKey("sk"), Name: "k"})),
		"policy": must(SetPolicy(Policy{Nodes: []NodePolicy{{NodeID: "n1", Node: routing.Node{Weight: 1}}}}, false)),
		"usage":  must(RecordUsage("n1", 0, []UsageEntry{{Requests: 1}})),
	}
	for name, cmd := range changes {
		m := newMachine(t)
		m.ok(cmd, t0)
		if m.view().Digest() == d0 {
			t.Errorf("digest unchanged by a %s command", name)
		}
	}
	m := newMachine(t)
	m.ok(must(CreateKey(KeySpec{ID: "k", Hash: hashKey("sk"), Name: "k", Limits: Limits{DailyQuota: 5}})), t0)
	d1 := m.view().Digest()
	m.ok(must(AcquireLease(LeaseRequest{NodeID: "n1", KeyID: "k", Kind: LeaseDailyRequests, Want: 1})), t0)
	if m.view().Digest() == d1 {
		t.Error("digest unchanged by a lease")
	}
}

// snapshotBytes persists a snapshot through a real file snapshot store and
// reads it back.
func snapshotBytes(t *testing.T, f *fsm) []byte {
	t.Helper()
	store, err := raft.NewFileSnapshotStoreWithLogger(t.TempDir(), 1, newHCLog(discardLogger(), "snap"))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink, err := store.Create(raft.SnapshotVersionMax, 1, 1, raft.Configuration{}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	_, rc, err := store.Open(sink.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	cmds, times := randomCommands(42, 800)
	a := newMachine(t)
	for i, cmd := range cmds[:500] {
		a.apply(cmd, times[i])
	}
	snap := snapshotBytes(t, a.f)

	// Restore into a machine that already holds other state: the old state
	// must be replaced, not merged.
	b := newMachine(t)
	b.ok(must(CreateKey(KeySpec{ID: "stale", Hash: hashKey("sk-stale"), Name: "stale"})), t0)
	if err := b.f.Restore(io.NopCloser(bytes.NewReader(snap))); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.view().Key("stale"); ok {
		t.Fatal("restore merged into the old state")
	}
	if a.view().Digest() != b.view().Digest() || b.view().AppliedIndex() != a.index {
		t.Fatal("restored state differs from the snapshotted one")
	}
	if !bytes.Equal(snapshotBytes(t, b.f), snap) {
		t.Fatal("snapshot of the restored state differs: the encoding is not canonical")
	}
	// Both continue identically from the snapshot point.
	b.index = a.index
	for i, cmd := range cmds[500:] {
		ra, rb := a.apply(cmd, times[500+i]), b.apply(cmd, times[500+i])
		if !proto.Equal(ra, rb) {
			t.Fatalf("after restore, command %d results differ", 500+i)
		}
	}
	if a.view().Digest() != b.view().Digest() {
		t.Fatal("digests differ after continuing from the snapshot")
	}
}

func TestRestoreRefusesBadSnapshotAndKeepsState(t *testing.T) {
	m := newMachine(t)
	m.ok(must(CreateKey(KeySpec{Hash: hashKey("sk-keep"), Name: "keep"})), t0)
	before := m.view().Digest()
	future := must(proto.Marshal(&pb.Snapshot{Format: 99}))
	dup := must(proto.Marshal(&pb.Snapshot{Format: snapshotFormat, State: &pb.State{Keys: []*pb.ApiKey{
		{Id: "a", KeyHash: make([]byte, 32)}, {Id: "a", KeyHash: make([]byte, 32)},
	}}}))
	for name, b := range map[string][]byte{"garbage": {0xff, 0x01}, "future format": future, "duplicate keys": dup} {
		if err := m.f.Restore(io.NopCloser(bytes.NewReader(b))); err == nil {
			t.Errorf("%s: restore accepted it", name)
		}
		if m.view().Digest() != before {
			t.Fatalf("%s: a failed restore changed the state", name)
		}
	}
}

func TestPlanFreeAllowanceAndAuditKeys(t *testing.T) {
	m := newMachine(t)
	acquire := func(node string, want int64) *pb.LeaseGrant {
		t.Helper()
		res := m.apply(must(AcquireLease(LeaseRequest{NodeID: node, KeyID: FreeAllowanceKeyID, Kind: LeaseDailyRequests, Want: want})), t0)
		if res.GetRejectionCode() != "" {
			t.Fatalf("acquire: %s", res.GetRejectionCode())
		}
		return res.GetLease()
	}
	// Pro (unset): the allowance is unlimited.
	if g := acquire("n1", 3); !g.GetUnlimited() {
		t.Fatalf("pro plan: %+v, want unlimited", g)
	}
	free, apps := PlanFree, []string{"chat-app"}
	m.ok(must(UpdatePolicy(PolicyChange{Plan: &free, FirstPartyApps: &apps})), t0)
	if p := m.view().Policy(); p.Plan != PlanFree || !slices.Equal(p.FirstPartyApps, apps) {
		t.Fatalf("policy after update: %+v", p)
	}
	// Seeding from flags does not override an operator's plan.
	pro := PlanPro
	m.ok(must(UpdatePolicy(PolicyChange{Plan: &pro, PlanOnlyIfUnset: true})), t0)
	if p := m.view().Policy(); p.Plan != PlanFree {
		t.Fatalf("seeding replaced the plan: %q", p.Plan)
	}
	// Free: ten requests a day across the nodes.
	if g := acquire("n1", 6); g.GetGranted() != 6 || g.GetUnlimited() {
		t.Fatalf("free n1: %+v", g)
	}
	if g := acquire("n2", 6); g.GetGranted() != FreeDailyRequests-6 {
		t.Fatalf("free n2: %+v, want %d granted", g, FreeDailyRequests-6)
	}
	if _, err := UpdatePolicy(PolicyChange{Plan: new("gold")}); err == nil {
		t.Fatal("unknown plan accepted")
	}
	if _, err := SetPolicy(Policy{FirstPartyApps: []string{"Bad App"}}, false); err == nil {
		t.Fatal("bad application name accepted")
	}
	if code := m.apply(must(CreateKey(KeySpec{ID: "plan:free", Hash: hashKey("sk-plan"), Name: "x"})), t0).GetRejectionCode(); code != codeInvalid {
		t.Fatalf("key id plan:free: %q, want invalid", code)
	}
	// Audit keys replicate and survive a snapshot.
	pub := make([]byte, 32)
	pub[0] = 7
	m.ok(must(SetAuditKey("n1", pub)), t0)
	if _, err := SetAuditKey("n1", pub[:31]); err == nil {
		t.Fatal("short audit key accepted")
	}
	if k := m.view().AuditKeys(); len(k) != 1 || k["n1"][0] != 7 {
		t.Fatalf("audit keys: %v", k)
	}
	m.f.read(func(st *state) {
		s, err := stateFromProto(st.toProto())
		if err != nil || s.digest() != st.digest() {
			t.Fatalf("snapshot round trip: %v", err)
		}
	})
}

// TestPolicyEntriesOfAnOlderBuild: raft log entries of routing policy
// written before NodePolicy took routing.Node (bytes frozen from that
// build) still apply to the same state, and today's builders encode the
// same bytes, so an existing data directory replays unchanged.
func TestPolicyEntriesOfAnOlderBuild(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	for _, c := range []struct {
		name, old string
		cmd       *Command
	}{
		{"node", "080c188080a8b1e39fe7cb17220e0a0c0a026e3110051801200a2808",
			must(legacyNodePolicy(NodePolicy{NodeID: "n1", Node: routing.Node{Weight: 5, Canary: true, CanaryPercent: 10, InflightCap: 8}}, false))},
		{"policy", "080a188080a8b1e39fe7cb1722140a120a0877656967687465641a060a026e321002",
			must(SetPolicy(Policy{Strategy: "weighted", Nodes: []NodePolicy{{NodeID: "n2", Node: routing.Node{Weight: 2}}}}, false))},
	} {
		if got := hex.EncodeToString(entry(t, c.cmd, at)); got != c.old {
			t.Errorf("%s: encoded %s, the older build wrote %s", c.name, got, c.old)
		}
	}
	m := newMachine(t)
	for _, old := range []string{"080c188080a8b1e39fe7cb17220e0a0c0a026e3110051801200a2808", "080a188080a8b1e39fe7cb1722140a120a0877656967687465641a060a026e321002"} {
		b, _ := hex.DecodeString(old)
		if out := m.applyRaw(b); out.err != nil || out.res.GetRejectionCode() != "" {
			t.Fatalf("old entry %s: %v %v", old, out.err, out.res.GetRejectionCode())
		}
	}
	// The whole-policy entry replaced the node entry before it.
	p := m.view().Policy()
	if p.Strategy != "weighted" || len(p.Nodes) != 1 || p.Nodes[0] != (NodePolicy{NodeID: "n2", Node: routing.Node{Weight: 2}}) {
		t.Fatalf("policy from old entries: %+v", p)
	}
	m = newMachine(t)
	b, _ := hex.DecodeString("080c188080a8b1e39fe7cb17220e0a0c0a026e3110051801200a2808")
	m.applyRaw(b)
	if np, ok := m.view().NodePolicy("n1"); !ok || np.Node != (routing.Node{Weight: 5, Canary: true, CanaryPercent: 10, InflightCap: 8}) {
		t.Fatalf("node policy from an old entry: %+v %v", np, ok)
	}
}

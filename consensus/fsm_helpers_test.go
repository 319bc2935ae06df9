package consensus

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/infermesh/infermesh/consensus/routing"
	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// machine drives a state machine the way raft does: entries with increasing
// indexes, encoded as they are in the log.
type machine struct {
	t     testing.TB
	f     *fsm
	index uint64
	fatal chan error // OnFatal reports
}

func newMachine(t testing.TB) *machine {
	m := &machine{t: t, fatal: make(chan error, 4)}
	m.f = newFSM(discardLogger(), func(err error) { m.fatal <- err })
	return m
}

// entry encodes cmd with its time set to at.
func entry(t testing.TB, cmd *Command, at time.Time) []byte {
	t.Helper()
	c := proto.Clone(cmd).(*Command)
	c.TimeUnixNano = at.UnixNano()
	b, err := proto.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (m *machine) applyRaw(data []byte) applyOutcome {
	m.index++
	return m.f.applyEntry(m.index, data)
}

// apply applies cmd at time at and fails the test on a state machine error
// (a rejection is a result, not an error).
func (m *machine) apply(cmd *Command, at time.Time) *pb.ApplyResult {
	m.t.Helper()
	out := m.applyRaw(entry(m.t, cmd, at))
	if out.err != nil {
		m.t.Fatalf("apply %s: %v", cmd.GetType(), out.err)
	}
	if out.res.GetIndex() != m.index {
		m.t.Fatalf("result index %d, want %d", out.res.GetIndex(), m.index)
	}
	return out.res
}

// ok applies cmd and fails the test on a rejection.
func (m *machine) ok(cmd *Command, at time.Time) *pb.ApplyResult {
	m.t.Helper()
	res := m.apply(cmd, at)
	if res.GetRejectionCode() != "" {
		m.t.Fatalf("apply %s rejected: %s: %s", cmd.GetType(), res.GetRejectionCode(), res.GetRejectionMessage())
	}
	return res
}

func (m *machine) view() View { return View{f: m.f} }

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// randomCommands builds a reproducible mix of every command type, valid and
// invalid, over a small set of keys and nodes so that they interact.
func randomCommands(seed uint64, n int) ([]*Command, []time.Time) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	nodes := []string{"n1", "n2", "n3"}
	models := []string{"m-a", "m-b", "m-c"}
	keyID := func() string { return fmt.Sprintf("k%d", rng.IntN(6)) }
	var cmds []*Command
	var times []time.Time
	at := t0
	seq := map[string]uint64{}
	for len(cmds) < n {
		at = at.Add(time.Duration(rng.IntN(int(5 * time.Minute))))
		var cmd *Command
		var err error
		switch rng.IntN(10) {
		case 0:
			i := rng.IntN(6)
			cmd, err = CreateKey(KeySpec{
				ID: fmt.Sprintf("k%d", i), Hash: hashKey(fmt.Sprintf("sk-plain-%d", i)), Name: fmt.Sprintf("key %d", i),
				App: fmt.Sprintf("app%d", rng.IntN(2)), Admin: rng.IntN(4) == 0,
				Endpoints: []string{"vision", "chat", "embeddings"}[:rng.IntN(4)%3],
				Limits:    Limits{RPM: int64(rng.IntN(100)), DailyQuota: int64(rng.IntN(50)), MonthlyBudgetMicros: int64(rng.IntN(1000))},
			})
		case 1:
			name := fmt.Sprintf("renamed-%d", rng.IntN(100))
			lim := Limits{DailyQuota: int64(rng.IntN(60))}
			cmd, err = legacyKeyUpdate(&pb.KeyUpdate{Id: keyID(), Name: &name, Limits: limitsToProto(lim)})
		case 2:
			if rng.IntN(10) == 0 {
				cmd, err = RevokeKey(keyID())
			} else {
				cmd, err = legacyNodePolicy(NodePolicy{NodeID: nodes[rng.IntN(3)], Node: routing.Node{Weight: int32(rng.IntN(10)), Canary: rng.IntN(2) == 0, CanaryPercent: int32(rng.IntN(101)), InflightCap: int32(rng.IntN(64))}}, false)
			}
		case 3:
			cmd, err = legacyModelPolicy(ModelPolicy{Model: models[rng.IntN(3)], Lifecycle: []string{"", LifecycleActive, LifecycleDeprecated, LifecycleBlocked}[rng.IntN(4)], Replacement: models[rng.IntN(3)], Price: Price{RequestMicros: int64(rng.IntN(10))}}, false)
		case 4:
			s := []string{"round-robin", "weighted", "sticky"}[rng.IntN(3)]
			g := []string{GovernanceCurated, GovernanceFederated, GovernanceOpen}[rng.IntN(3)]
			cmd, err = UpdatePolicy(PolicyChange{Strategy: &s, Governance: &g})
		case 5, 6:
			cmd, err = AcquireLease(LeaseRequest{
				NodeID: nodes[rng.IntN(3)], KeyID: keyID(), Kind: []LeaseKind{LeaseDailyRequests, LeaseMonthlyBudget}[rng.IntN(2)],
				Want: int64(rng.IntN(20)), Consumed: int64(rng.IntN(10)), TTL: time.Duration(rng.IntN(40)) * time.Minute,
			})
		case 7:
			kind := []LeaseKind{LeaseDailyRequests, LeaseMonthlyBudget}[rng.IntN(2)]
			period, _ := Period(kind, at)
			cmd, err = SettleLeases(nodes[rng.IntN(3)], []Settlement{{KeyID: keyID(), Kind: kind, Period: period, Consumed: int64(rng.IntN(10)), Release: rng.IntN(3) == 0}})
		default:
			node := nodes[rng.IntN(3)]
			seq[node]++
			s := seq[node]
			if rng.IntN(8) == 0 {
				s-- // a retried batch
			}
			var entries []UsageEntry
			for range rng.IntN(4) {
				entries = append(entries, UsageEntry{
					App: fmt.Sprintf("app%d", rng.IntN(2)), Model: models[rng.IntN(3)], KeyID: keyID(),
					Requests: int64(1 + rng.IntN(5)), InputTokens: int64(rng.IntN(500)), OutputTokens: int64(rng.IntN(500)),
					CostMicros: int64(rng.IntN(30)), Errors: int64(rng.IntN(2)),
				})
			}
			cmd, err = RecordUsage(node, s, entries)
		}
		if err != nil {
			panic(err)
		}
		cmds = append(cmds, cmd)
		times = append(times, at)
	}
	return cmds, times
}

package consensus

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// UsageEntry is one aggregate a node reports: counts and tokens, never
// request or response content.
type UsageEntry struct {
	App          string // application of the key
	Model        string // model id
	KeyID        string // key id; empty for keyless loopback callers
	Worker       string // node that served; empty means the reporting node
	Day          int32  // UTC day the requests finished (days since 1970-01-01)
	Requests     int64  // counted requests
	InputTokens  int64  // input tokens
	OutputTokens int64  // output tokens
	CostMicros   int64  // estimated cost
	Errors       int64  // requests that failed
}

// UsageTotal is the running total of one app, model, key and node on one
// UTC day.
type UsageTotal struct {
	App, Model, KeyID, NodeID string // the group
	Day                       int32  // days since 1970-01-01; 0 before daily totals
	Counters
}

// DayOf is the UTC day of t in days since 1970-01-01, as usage totals
// count it.
func DayOf(t time.Time) int32 { return int32(t.UTC().Unix() / 86400) }

// DayRange selects usage totals by UTC day, both ends included; a zero
// end is open.
type DayRange struct{ From, To int32 }

func (r DayRange) has(d int32) bool {
	return (r.From == 0 || d >= r.From) && (r.To == 0 || d <= r.To)
}

// Counters are the summed usage figures.
type Counters struct {
	Requests     int64 // counted requests
	InputTokens  int64 // input tokens
	OutputTokens int64 // output tokens
	CostMicros   int64 // estimated cost
	Errors       int64 // requests that failed
}

func (c *Counters) add(o Counters) {
	c.Requests += o.Requests
	c.InputTokens += o.InputTokens
	c.OutputTokens += o.OutputTokens
	c.CostMicros += o.CostMicros
	c.Errors += o.Errors
}

// UsageDimension groups usage totals.
type UsageDimension string

// Usage dimensions; "worker" is the spec's name for a node.
const (
	ByApp   UsageDimension = "app"
	ByModel UsageDimension = "model"
	ByKey   UsageDimension = "key"
	ByNode  UsageDimension = "worker"
)

// ParseUsageDimension accepts app, model, key, worker and node.
func ParseUsageDimension(s string) (UsageDimension, error) {
	switch s {
	case "app":
		return ByApp, nil
	case "model":
		return ByModel, nil
	case "key":
		return ByKey, nil
	case "worker", "node":
		return ByNode, nil
	}
	return "", fmt.Errorf("unknown usage dimension %q (want app, model, key or worker)", s)
}

// UsageRow is the total of one group.
type UsageRow struct {
	Group string // app, model, key id or node id
	Counters
}

type usageKey struct {
	app, model, keyID, node string
	day                     int32
}

func compareUsageKeys(a, b usageKey) int {
	return cmp.Or(cmp.Compare(a.app, b.app), cmp.Compare(a.model, b.model),
		cmp.Compare(a.keyID, b.keyID), cmp.Compare(a.node, b.node), cmp.Compare(a.day, b.day))
}

type usageTable struct {
	totals  map[usageKey]*Counters
	cursors map[string]uint64
}

func newUsageTable() usageTable {
	return usageTable{totals: map[usageKey]*Counters{}, cursors: map[string]uint64{}}
}

func (t *usageTable) apply(b *pb.UsageBatch) *pb.ApplyResult {
	node := b.GetNodeId()
	if node == "" {
		return reject(codeInvalid, "node id is required")
	}
	for _, e := range b.GetEntries() {
		if e.GetRequests() < 0 || e.GetInputTokens() < 0 || e.GetOutputTokens() < 0 ||
			e.GetCostMicros() < 0 || e.GetErrors() < 0 || e.GetDay() < 0 {
			return reject(codeInvalid, "usage counts and days cannot be negative")
		}
	}
	if seq := b.GetSeq(); seq != 0 {
		if seq <= t.cursors[node] {
			return reject(codeDuplicate, "usage batch %d from %s was already applied", seq, node)
		}
		t.cursors[node] = seq
	}
	for _, e := range b.GetEntries() {
		worker := e.GetWorker()
		if worker == "" {
			worker = node
		}
		k := usageKey{app: e.GetApp(), model: e.GetModel(), keyID: e.GetKeyId(), node: worker, day: e.GetDay()}
		c := t.totals[k]
		if c == nil {
			c = &Counters{}
			t.totals[k] = c
		}
		c.add(Counters{
			Requests: e.GetRequests(), InputTokens: e.GetInputTokens(), OutputTokens: e.GetOutputTokens(),
			CostMicros: e.GetCostMicros(), Errors: e.GetErrors(),
		})
	}
	return &pb.ApplyResult{}
}

func (t *usageTable) sortedKeys() []usageKey {
	return slices.SortedFunc(maps.Keys(t.totals), compareUsageKeys)
}

func (t *usageTable) rows() []UsageTotal {
	keys := t.sortedKeys()
	out := make([]UsageTotal, 0, len(keys))
	for _, k := range keys {
		out = append(out, UsageTotal{App: k.app, Model: k.model, KeyID: k.keyID, NodeID: k.node, Day: k.day, Counters: *t.totals[k]})
	}
	return out
}

// group sums the totals of the days in r by one dimension, sorted by
// group.
func (t *usageTable) group(by UsageDimension, r DayRange) []UsageRow {
	sums := map[string]*Counters{}
	for k, c := range t.totals {
		if !r.has(k.day) {
			continue
		}
		var g string
		switch by {
		case ByApp:
			g = k.app
		case ByModel:
			g = k.model
		case ByKey:
			g = k.keyID
		default:
			g = k.node
		}
		s := sums[g]
		if s == nil {
			s = &Counters{}
			sums[g] = s
		}
		s.add(*c)
	}
	out := make([]UsageRow, 0, len(sums))
	for _, g := range slices.Sorted(maps.Keys(sums)) {
		out = append(out, UsageRow{Group: g, Counters: *sums[g]})
	}
	return out
}

func (t *usageTable) toProto() ([]*pb.UsageTotal, []*pb.UsageCursor) {
	var totals []*pb.UsageTotal
	for _, k := range t.sortedKeys() {
		c := t.totals[k]
		totals = append(totals, &pb.UsageTotal{
			App: k.app, Model: k.model, KeyId: k.keyID, NodeId: k.node, Day: k.day,
			Requests: c.Requests, InputTokens: c.InputTokens, OutputTokens: c.OutputTokens,
			CostMicros: c.CostMicros, Errors: c.Errors,
		})
	}
	var cursors []*pb.UsageCursor
	for _, node := range slices.Sorted(maps.Keys(t.cursors)) {
		cursors = append(cursors, &pb.UsageCursor{NodeId: node, Seq: t.cursors[node]})
	}
	return totals, cursors
}

func (t *usageTable) load(totals []*pb.UsageTotal, cursors []*pb.UsageCursor) error {
	for _, u := range totals {
		k := usageKey{app: u.GetApp(), model: u.GetModel(), keyID: u.GetKeyId(), node: u.GetNodeId(), day: u.GetDay()}
		if _, dup := t.totals[k]; dup {
			return errorf("snapshot: duplicate usage total %v", k)
		}
		t.totals[k] = &Counters{
			Requests: u.GetRequests(), InputTokens: u.GetInputTokens(), OutputTokens: u.GetOutputTokens(),
			CostMicros: u.GetCostMicros(), Errors: u.GetErrors(),
		}
	}
	for _, c := range cursors {
		t.cursors[c.GetNodeId()] = c.GetSeq()
	}
	return nil
}

package mesh

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infermesh/infermesh/mesh/route"
	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

// version orders the records of one node: epoch first, then sequence.
type version struct {
	epoch, seq uint64
}

func (v version) after(o version) bool {
	return v.epoch > o.epoch || (v.epoch == o.epoch && v.seq > o.seq)
}

func recordVersion(r *meshv1.NodeRecord) version {
	return version{r.GetEpoch(), r.GetSeq()}
}

// entry is what the table knows about one node.
type entry struct {
	member     bool // memberlist reports the node alive (joined, not gone)
	id         Identity
	gossipAddr string
	record     *meshv1.NodeRecord // latest record; nil until one arrives
	contentSeq uint64             // seq of the record at which its content last changed (heartbeats keep it)
	view       route.Peer         // record decoded once, without identity
	ejected    bool
	ejectedAt  version   // record version when ejected
	ejectedOn  time.Time // when ejected, by the table's clock
}

// table is the peer table: memberlist membership joined with the gossiped
// records. Readers get an immutable snapshot. Writers only mark it stale:
// the next reader rebuilds it, once, however many changes came in
// between. Every node's load reaches every other node several times a
// second under traffic, and a snapshot is a copy of every member's view,
// so rebuilding on every change cost O(members) per record received
// (O(members²) a second per node); now it costs O(members) per read that
// follows a change, at most.
type table struct {
	self  string
	clock func() time.Time
	hold  time.Duration // minimum time an ejection lasts

	mu      sync.Mutex
	nodes   map[string]*entry
	order   []string           // ids of members, sorted
	tombs   map[string]version // last version seen when a node went away
	members atomic.Int64

	stale atomic.Bool // a change since snap was built
	snap  atomic.Pointer[snapshot]
}

// snapshot is one immutable state of the table for readers: every member's
// view sorted by id, and per model the routable members that hold it (also
// sorted by id), so routing a request reads only the peers that could
// serve it instead of scanning every member.
type snapshot struct {
	peers   []route.Peer
	serving map[string][]route.Peer
}

func newTable(self string, clock func() time.Time, hold time.Duration) *table {
	t := &table{self: self, clock: clock, hold: hold, nodes: map[string]*entry{}, tombs: map[string]version{}}
	t.snap.Store(&snapshot{serving: map[string][]route.Peer{}})
	return t
}

// change describes what a table update did, for events and metrics.
type change struct {
	accepted    bool // the record was newer and stored
	significant bool // health, models or routing settings changed
	restored    bool // an ejected node came back
	view        route.Peer
	isMember    bool
}

// snapshot returns the current peer views (members only), sorted by id.
// The slice is shared; callers must not modify it.
func (t *table) snapshot() []route.Peer {
	return t.current().peers
}

// serving returns the routable members holding model, sorted by id, from
// the current snapshot. The slice is shared; callers must not modify it.
func (t *table) serving(model string) []route.Peer {
	return t.current().serving[model]
}

// current returns the snapshot, rebuilding it first if anything changed.
func (t *table) current() *snapshot {
	if t.stale.Load() {
		t.mu.Lock()
		if t.stale.Load() {
			t.rebuildLocked()
		}
		t.mu.Unlock()
	}
	return t.snap.Load()
}

func (t *table) get(id string) *entry {
	e := t.nodes[id]
	if e == nil {
		e = &entry{id: Identity{NodeID: id}}
		t.nodes[id] = e
	}
	return e
}

// join marks a node as a member (memberlist NotifyJoin).
func (t *table) join(id Identity, gossipAddr string) route.Peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.get(id.NodeID)
	if !e.member {
		t.members.Add(1)
		if i, found := slices.BinarySearch(t.order, id.NodeID); !found {
			t.order = slices.Insert(t.order, i, id.NodeID)
		}
	}
	e.member, e.id, e.gossipAddr = true, id, gossipAddr
	t.stale.Store(true)
	return t.peerLocked(e)
}

// updateMeta refreshes a member's identity (memberlist NotifyUpdate).
func (t *table) updateMeta(id Identity, gossipAddr string) route.Peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.get(id.NodeID)
	e.id, e.gossipAddr = id, gossipAddr
	t.stale.Store(true)
	return t.peerLocked(e)
}

// leave removes a node (memberlist NotifyLeave: left or dead). Its record is
// dropped and remembered as a tombstone so that older copies still
// circulating cannot bring it back; a restarted node has a newer epoch.
// graceful reports whether the node's last record announced the leave.
func (t *table) leave(id string) (p route.Peer, graceful, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.nodes[id]
	if !ok || id == t.self {
		return route.Peer{}, false, false
	}
	p = t.peerLocked(e)
	graceful = e.record.GetLeaving()
	if e.member {
		t.members.Add(-1)
		if i, found := slices.BinarySearch(t.order, id); found {
			t.order = slices.Delete(t.order, i, i+1)
		}
	}
	if e.record != nil {
		if v := recordVersion(e.record); v.after(t.tombs[id]) {
			t.tombs[id] = v
		}
	}
	delete(t.nodes, id)
	t.stale.Store(true)
	return p, graceful, true
}

// merge stores r if it is newer than what the table holds for its node.
func (t *table) merge(r *meshv1.NodeRecord) change {
	id := r.GetNodeId()
	if id == "" {
		return change{}
	}
	v := recordVersion(r)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !v.after(t.tombs[id]) {
		return change{}
	}
	e := t.get(id)
	if e.record != nil && !v.after(recordVersion(e.record)) {
		return change{}
	}
	view := viewOf(r)
	ch := change{accepted: true, isMember: e.member}
	ch.significant = e.record == nil || significantChange(&e.view, &view)
	if !sameContent(e.record, r) {
		e.contentSeq = r.GetSeq()
	}
	e.record, e.view = r, view
	// A dead node's last records may still be echoing through gossip right
	// after the ejection; only a newer ready record that arrives after the
	// hold time restores the node.
	if e.ejected && v.after(e.ejectedAt) && (view.Health == route.HealthReady || view.Health == route.HealthSaturated) &&
		t.clock().Sub(e.ejectedOn) >= t.hold {
		e.ejected = false
		ch.restored, ch.significant = true, true
	}
	t.stale.Store(true)
	ch.view = t.peerLocked(e)
	return ch
}

// eject marks a node as not routable until a newer ready record arrives.
func (t *table) eject(id string) (route.Peer, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.nodes[id]
	if !ok || id == t.self || e.ejected {
		return route.Peer{}, false
	}
	e.ejected = true
	e.ejectedOn = t.clock()
	if e.record != nil {
		e.ejectedAt = recordVersion(e.record)
	}
	t.stale.Store(true)
	return t.peerLocked(e), true
}

// refusedApplies reports whether a refusal seen at record version v still
// concerns node id here: a member, not ejected yet, whose record is not
// newer than v.
func (t *table) refusedApplies(id string, v version) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.nodes[id]
	return ok && e.member && !e.ejected && e.record != nil && !recordVersion(e.record).after(v)
}

// ejectedNow reports whether node id is ejected.
func (t *table) ejectedNow(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.nodes[id]
	return ok && e.ejected
}

// record returns the latest record of node id, or nil.
func (t *table) record(id string) *meshv1.NodeRecord {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.nodes[id]; ok {
		return e.record
	}
	return nil
}

// otherAddrs returns the gossip addresses of the other members.
func (t *table) otherAddrs() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for id, e := range t.nodes {
		if e.member && id != t.self && e.gossipAddr != "" {
			out = append(out, e.gossipAddr)
		}
	}
	return out
}

// recordVersions returns, for push-pull, each current member's record
// with the seq at which its content last changed.
func (t *table) recordVersions() []recordVersionOf {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]recordVersionOf, 0, len(t.nodes))
	for _, e := range t.nodes {
		if e.member && e.record != nil {
			out = append(out, recordVersionOf{id: e.id.NodeID, v: recordVersion(e.record), content: e.contentSeq})
		}
	}
	return out
}

// records returns the records of current members, for push-pull.
func (t *table) records() []*meshv1.NodeRecord {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*meshv1.NodeRecord, 0, len(t.nodes))
	for _, e := range t.nodes {
		if e.member && e.record != nil {
			out = append(out, e.record)
		}
	}
	return out
}

// rebuildLocked publishes a new snapshot of member views in id order and
// the per-model lists of routable holders. Callers hold mu.
func (t *table) rebuildLocked() {
	out := make([]route.Peer, 0, len(t.order))
	for _, id := range t.order {
		if e := t.nodes[id]; e != nil && e.member {
			out = append(out, t.peerLocked(e))
		}
	}
	serving := map[string][]route.Peer{}
	for _, p := range out {
		if p.Routable() {
			for m := range p.Models {
				serving[m] = append(serving[m], p)
			}
		}
	}
	t.snap.Store(&snapshot{peers: out, serving: serving})
	t.stale.Store(false)
}

func (t *table) peerLocked(e *entry) route.Peer {
	p := e.view
	p.ID = e.id.NodeID
	p.HTTPAddr, p.RPCAddr, p.Version = e.id.HTTPAddr, e.id.RPCAddr, e.id.Version
	p.GossipAddr = e.gossipAddr
	p.Self = p.ID == t.self
	p.Ejected = e.ejected
	return p
}

// viewOf decodes a record into the load and model part of a peer view.
func viewOf(r *meshv1.NodeRecord) route.Peer {
	p := route.Peer{
		Health:        healthFromProto(r.GetHealth()),
		InFlight:      int(r.GetInFlight()),
		MaxInFlight:   int(r.GetMaxInFlight()),
		QueueDepth:    int(r.GetQueueDepth()),
		Weight:        int(r.GetWeight()),
		Canary:        r.GetCanary(),
		CanaryPercent: int(r.GetCanaryPercent()),
		Models:        make(map[string]route.Model, len(r.GetModels())),
		Updated:       time.UnixMilli(r.GetUpdatedUnixMs()),
		Prefixes:      digestFromProto(r.GetPrefixDigest()),
	}
	for _, m := range r.GetModels() {
		p.Models[m.GetModel()] = route.Model{Warm: m.GetWarm(), Latency: time.Duration(m.GetLatencyUs()) * time.Microsecond,
			WireID: m.GetWireId(), Task: m.GetTask(), Created: m.GetCreatedUnix(), SizeBytes: m.GetSizeBytes()}
	}
	return p
}

// significantChange reports changes other than load (in-flight, queue
// depth, latency): those are what subscribers hear about as updates.
func significantChange(a, b *route.Peer) bool {
	if a.Health != b.Health || a.MaxInFlight != b.MaxInFlight || a.Weight != b.Weight ||
		a.Canary != b.Canary || a.CanaryPercent != b.CanaryPercent || len(a.Models) != len(b.Models) {
		return true
	}
	for id, m := range a.Models {
		if n, ok := b.Models[id]; !ok || n.Warm != m.Warm {
			return true
		}
	}
	return false
}

func healthFromProto(h meshv1.Health) route.Health {
	switch h {
	case meshv1.Health_HEALTH_ALIVE:
		return route.HealthAlive
	case meshv1.Health_HEALTH_READY:
		return route.HealthReady
	case meshv1.Health_HEALTH_SATURATED:
		return route.HealthSaturated
	case meshv1.Health_HEALTH_DRAINING:
		return route.HealthDraining
	default:
		return route.HealthUnknown
	}
}

func healthToProto(h route.Health) meshv1.Health {
	switch h {
	case route.HealthAlive:
		return meshv1.Health_HEALTH_ALIVE
	case route.HealthReady:
		return meshv1.Health_HEALTH_READY
	case route.HealthSaturated:
		return meshv1.Health_HEALTH_SATURATED
	case route.HealthDraining:
		return meshv1.Health_HEALTH_DRAINING
	default:
		return meshv1.Health_HEALTH_UNSPECIFIED
	}
}

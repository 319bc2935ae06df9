package mesh

import (
	"sync"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

// Message kinds, the first byte of every user message and push-pull state.
const (
	msgRecord    byte = 1 // a NodeRecord
	msgRecordSet byte = 2 // a RecordSet (push-pull)
)

// delegate implements memberlist.Delegate and memberlist.EventDelegate for
// a Mesh, keeping those methods off the Mesh's own API. memberlist calls
// them from its own goroutines, sometimes with its locks held: they must
// not block and must not call back into memberlist.
type delegate struct {
	m *Mesh
}

// recordBroadcast is a record queued for UDP gossip. A newer record of the
// same node replaces a queued older one (NamedBroadcast).
type recordBroadcast struct {
	node string
	msg  []byte
}

// Invalidates reports whether o is an older record of the same node.
func (b *recordBroadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(*recordBroadcast)
	return ok && ob.node == b.node
}

// Name identifies the broadcast by node, so a newer record replaces it.
func (b *recordBroadcast) Name() string { return "record/" + b.node }

// Message returns the encoded record.
func (b *recordBroadcast) Message() []byte { return b.msg }

// Finished is called when memberlist stops retransmitting; nothing to do.
func (b *recordBroadcast) Finished() {}

func encodeRecord(r *meshv1.NodeRecord) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		// A NodeRecord has no fields that can fail to encode.
		panic(err)
	}
	return append([]byte{msgRecord}, b...)
}

// spread sends a record to the other nodes: through memberlist's gossip
// queue when it fits a UDP packet, else over TCP to every member (push-pull
// would also deliver it, later).
func (m *Mesh) spread(r *meshv1.NodeRecord) {
	msg := encodeRecord(r)
	if len(msg) <= m.maxCast {
		m.queue.QueueBroadcast(&recordBroadcast{node: r.GetNodeId(), msg: msg})
		return
	}
	if m.ml == nil {
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.sendAll(msg)
	}()
}

// sendAll sends msg over TCP to every other member, concurrently, and
// returns when all sends finished (each is bounded by TCPTimeout).
func (m *Mesh) sendAll(msg []byte) {
	var wg sync.WaitGroup
	for _, n := range m.ml.Members() {
		if n.Name == m.cfg.NodeID {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.ml.SendReliable(n, msg); err != nil {
				m.log.Debug("reliable record send", "peer", n.Name, "err", err)
			}
		}()
	}
	wg.Wait()
}

// greetQueue bounds the members waiting for this node's record; when more
// arrive at once the rest learn it from gossip and push-pull.
const greetQueue = 256

// greet queues this node's record for a member that just appeared. Gossip
// spreads records too, but a broadcast sent while a node had few members
// is retransmitted only a few times and may never reach a member that
// appeared later; push-pull repairs that, after up to PushPullInterval
// (30 s on a LAN). Sending each new member the record directly (both
// sides do, as each sees the other join) makes a cluster started at once
// list every member ready as soon as memberlist knows them all. It runs
// under memberlist's locks: it must not block.
func (m *Mesh) greet(n *memberlist.Node) {
	c := *n // memberlist changes its nodes in place once its lock is released
	select {
	case m.greetCh <- &c:
	default:
	}
}

// greetLoop sends this node's current record to each member greet queued
// (sendDirect).
func (m *Mesh) greetLoop() {
	defer m.wg.Done()
	for {
		select {
		case <-m.stop:
			return
		case n := <-m.greetCh:
			r := m.table.record(m.cfg.NodeID)
			if r == nil {
				continue
			}
			if err := m.sendDirect(n, r); err != nil {
				m.log.Debug("greeting a new member", "peer", n.Name, "err", err)
			}
		}
	}
}

// sendDirect sends record r to one member as a record set, which the
// receiver merges without relaying (a record of kind 1 is relayed when
// new: greets, direct notices and answers sent that way to every member
// came back as a storm of relays when a hundred nodes started together):
// a UDP packet when it fits, else over TCP.
func (m *Mesh) sendDirect(n *memberlist.Node, r *meshv1.NodeRecord) error {
	msg, err := encodeRecordSet([]*meshv1.NodeRecord{r})
	if err != nil {
		return err
	}
	if len(msg) <= m.maxCast {
		return m.ml.SendBestEffort(n, msg)
	}
	return m.ml.SendReliable(n, msg)
}

// receive merges one record from gossip; relay says whether an accepted
// record should be gossiped on (records that arrived by broadcast and say
// something new are relayed once, so they spread even if the owner's
// retransmits are lost).
func (m *Mesh) receive(r *meshv1.NodeRecord, relay bool) {
	if r.GetNodeId() == m.cfg.NodeID {
		// This node owns its record and never takes it from others. A copy
		// from a previous life that is not older than the current version
		// (the clock went back across a restart) would win everywhere, so
		// move past it; an echo of the current record is not one.
		if m.local.adopt(r) {
			m.log.Warn("saw a newer record of this node from an earlier run; moving past it")
			m.publish()
		}
		return
	}
	m.evMu.Lock()
	prev := m.table.record(r.GetNodeId())
	ch := m.table.merge(r)
	if ch.accepted && ch.significant && ch.isMember {
		m.emitLocked(Event{Type: EventUpdate, Peer: ch.view})
	}
	m.evMu.Unlock()
	if !ch.accepted {
		m.met.received.WithLabelValues("stale").Inc()
		return
	}
	m.met.received.WithLabelValues("accepted").Inc()
	if ch.restored {
		m.log.Info("peer restored to routing", "peer", r.GetNodeId())
	}
	// A heartbeat (the same content under a new version) is not relayed:
	// its owner's own gossip reaches a few nodes, push-pull the rest, and
	// relaying every heartbeat through every node cost each node
	// (members / RecordHeartbeat) x fan-out x retransmits records a second.
	if relay && !sameContent(prev, r) {
		if msg := encodeRecord(r); len(msg) <= m.maxCast {
			m.queue.QueueBroadcast(&recordBroadcast{node: r.GetNodeId(), msg: msg})
		}
	}
}

// NodeMeta returns the node's identity; New checked it fits.
func (d *delegate) NodeMeta(limit int) []byte {
	if len(d.m.meta) > limit {
		d.m.log.Error("node meta exceeds memberlist limit", "size", len(d.m.meta), "limit", limit)
		return nil
	}
	return d.m.meta
}

// NotifyMsg handles a user message: a gossiped or directly sent record,
// or a record set a peer sent after a push-pull found this node lacking.
func (d *delegate) NotifyMsg(b []byte) {
	if len(b) >= 1 && b[0] == msgRecordSet {
		d.m.mergeRecordSet(b)
		return
	}
	if len(b) >= 2 && b[0] == msgRecordRequest && len(b) <= 1+maxVersionsID {
		d.m.answerRecordRequest(b)
		return
	}
	if len(b) >= 1 && b[0] == msgRefused {
		d.m.receiveRefused(b)
		return
	}
	if len(b) < 1 || b[0] != msgRecord {
		d.m.met.received.WithLabelValues("invalid").Inc()
		return
	}
	var r meshv1.NodeRecord
	if err := proto.Unmarshal(b[1:], &r); err != nil {
		d.m.met.received.WithLabelValues("invalid").Inc()
		d.m.log.Debug("bad record message", "err", err)
		return
	}
	d.m.receive(&r, true)
}

// GetBroadcasts hands queued records to memberlist's gossip.
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.m.queue.GetBroadcasts(overhead, limit)
}

// LocalState returns this node's side of a push-pull: for a join, every
// record it knows of current members (the joiner has them all when Join
// returns); otherwise only their versions, and each side then sends the
// other the records it has newer (pushpull.go).
func (d *delegate) LocalState(join bool) []byte {
	if !join {
		return encodeVersions(d.m.cfg.NodeID, d.m.table.recordVersions())
	}
	b, err := encodeRecordSet(d.m.table.records())
	if err != nil {
		d.m.log.Error("encode push-pull state", "err", err)
		return nil
	}
	return b
}

// MergeRemoteState merges the other side's push-pull state: records, or
// versions to answer with the records it lacks.
func (d *delegate) MergeRemoteState(b []byte, join bool) {
	switch {
	case len(b) < 1:
	case b[0] == msgRecordSet:
		d.m.mergeRecordSet(b)
	case b[0] == msgVersions:
		d.m.answerVersions(b)
	}
}

// NotifyJoin records a node memberlist reports alive.
func (d *delegate) NotifyJoin(n *memberlist.Node) {
	m := d.m
	m.evMu.Lock()
	p := m.table.join(decodeMeta(n.Name, n.Meta), n.Address())
	m.emitLocked(Event{Type: EventJoin, Peer: p})
	m.evMu.Unlock()
	if n.Name != m.cfg.NodeID {
		m.log.Info("peer joined", "peer", n.Name, "addr", n.Address())
		m.greet(n)
	}
	m.membershipChanged()
}

// NotifyLeave removes a node that left or died.
func (d *delegate) NotifyLeave(n *memberlist.Node) {
	m := d.m
	// memberlist does not tell NotifyLeave whether the node left or died
	// (Node.State is not maintained); the node's last record says.
	typ := EventFailed
	m.evMu.Lock()
	p, graceful, ok := m.table.leave(n.Name)
	if ok {
		if graceful {
			typ = EventLeave
		}
		m.emitLocked(Event{Type: typ, Peer: p})
	}
	m.evMu.Unlock()
	if ok {
		m.log.Info("peer gone", "peer", n.Name, "how", typ.String())
	}
	m.membershipChanged()
}

// NotifyUpdate refreshes a node's identity after a metadata change.
func (d *delegate) NotifyUpdate(n *memberlist.Node) {
	m := d.m
	m.evMu.Lock()
	p := m.table.updateMeta(decodeMeta(n.Name, n.Meta), n.Address())
	m.emitLocked(Event{Type: EventUpdate, Peer: p})
	m.evMu.Unlock()
}

package mesh

import (
	"encoding/binary"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

// msgRecordRequest asks a peer for a fresh record: a node that ejected the
// peer sends it once the ejection's hold has passed. Payload: the asking
// node's id. Heartbeats are rare and reach only a few random nodes each
// (they are not relayed), so an ejected peer that is alive would otherwise
// stay out of routing for a long time.
const msgRecordRequest byte = 4

// minRepublish is how often a record request may make this node publish a
// new version; more frequent requests get the current record.
const minRepublish = time.Second

// sameContent reports whether two records of a node say the same thing:
// they differ at most in sequence number and publication time (a
// heartbeat).
func sameContent(a, b *meshv1.NodeRecord) bool {
	if a == nil || b == nil || a.GetEpoch() != b.GetEpoch() {
		return false
	}
	ca, cb := proto.Clone(a).(*meshv1.NodeRecord), proto.Clone(b).(*meshv1.NodeRecord)
	ca.Seq, cb.Seq, ca.UpdatedUnixMs, cb.UpdatedUnixMs = 0, 0, 0, 0
	return proto.Equal(ca, cb)
}

// askRecordAfterHold sends an ejected peer a record request every
// EjectHold while it stays ejected and a member, so a peer that is alive
// comes back about one hold after its ejection.
func (m *Mesh) askRecordAfterHold(id string) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for {
			select {
			case <-m.stop:
				return
			case <-time.After(m.cfg.EjectHold):
			}
			node := m.member(id)
			if node == nil || !m.table.ejectedNow(id) {
				return
			}
			msg := append([]byte{msgRecordRequest}, m.cfg.NodeID...)
			if err := m.ml.SendBestEffort(node, msg); err != nil {
				m.log.Debug("asking an ejected peer for its record", "peer", id, "err", err)
			}
		}
	}()
}

// member returns memberlist's node for id, or nil.
func (m *Mesh) member(id string) *memberlist.Node {
	for _, n := range m.ml.Members() {
		if n.Name == id {
			return n
		}
	}
	return nil
}

// answerRecordRequest publishes a new version of this node's record (at
// most once per minRepublish) and sends it to the asking node directly.
func (m *Mesh) answerRecordRequest(b []byte) {
	asker := string(b[1:])
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.evMu.Lock()
		r := m.table.record(m.cfg.NodeID)
		if r == nil || m.clock().Sub(time.UnixMilli(r.GetUpdatedUnixMs())) >= minRepublish {
			r = m.local.next()
			m.publishLocked(r)
		}
		m.evMu.Unlock()
		node := m.member(asker)
		if node == nil {
			return
		}
		if err := m.sendDirect(node, r); err != nil {
			m.log.Debug("answering a record request", "peer", asker, "err", err)
		}
	}()
}

// msgRefused tells the mesh that a node refused a connection (nothing
// listens on its port: the process is gone) while its record was at the
// given version. Payload: uvarint epoch, uvarint seq, then the node id.
// A receiver whose record of the node is not newer ejects it too and
// relays the news once, so a node killed without a leave stops receiving
// work at every entry node within a gossip round or two, not after one
// failed attempt per entry node or memberlist's failure detection
// (seconds). A node that is in fact alive is restored by the record
// requests every ejector sends it after EjectHold.
const msgRefused byte = 5

// refusedBroadcast is a msgRefused on the gossip queue; a newer one about
// the same node replaces it.
type refusedBroadcast struct {
	node string
	msg  []byte
}

// Invalidates reports whether o is about the same node.
func (b *refusedBroadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(*refusedBroadcast)
	return ok && ob.node == b.node
}

// Name identifies the broadcast by node.
func (b *refusedBroadcast) Name() string { return "refused/" + b.node }

// Message returns the encoded message.
func (b *refusedBroadcast) Message() []byte { return b.msg }

// Finished is called when memberlist stops retransmitting; nothing to do.
func (b *refusedBroadcast) Finished() {}

func encodeRefused(id string, v version) []byte {
	b := []byte{msgRefused}
	b = binary.AppendUvarint(b, v.epoch)
	b = binary.AppendUvarint(b, v.seq)
	return append(b, id...)
}

func decodeRefused(b []byte) (string, version, bool) {
	if len(b) < 1 || b[0] != msgRefused {
		return "", version{}, false
	}
	b = b[1:]
	e, k := binary.Uvarint(b)
	if k <= 0 {
		return "", version{}, false
	}
	b = b[k:]
	s, k := binary.Uvarint(b)
	if k <= 0 || len(b[k:]) == 0 || len(b[k:]) > maxVersionsID {
		return "", version{}, false
	}
	return string(b[k:]), version{e, s}, true
}

// Refused takes a peer out of routing at once because a connection to it
// was refused, like Eject, and tells the other members, which eject it too
// unless they hold a newer record of it.
func (m *Mesh) Refused(id string) {
	r := m.table.record(id)
	m.Eject(id)
	if r == nil || id == m.cfg.NodeID {
		return
	}
	msg := encodeRefused(id, recordVersion(r))
	m.queue.QueueBroadcast(&refusedBroadcast{node: id, msg: msg})
}

// receiveRefused ejects the node a msgRefused names, when the record held
// of it is not newer than the one the sender held, and relays it once.
func (m *Mesh) receiveRefused(b []byte) {
	id, v, ok := decodeRefused(b)
	if !ok {
		m.met.received.WithLabelValues("invalid").Inc()
		return
	}
	if id == m.cfg.NodeID || !m.table.refusedApplies(id, v) {
		return
	}
	m.Eject(id)
	m.queue.QueueBroadcast(&refusedBroadcast{node: id, msg: append([]byte(nil), b...)})
}

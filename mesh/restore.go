package mesh

import (
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
		msg := encodeRecord(r)
		var err error
		if len(msg) <= m.maxCast {
			err = m.ml.SendBestEffort(node, msg)
		} else {
			err = m.ml.SendReliable(node, msg)
		}
		if err != nil {
			m.log.Debug("answering a record request", "peer", asker, "err", err)
		}
	}()
}

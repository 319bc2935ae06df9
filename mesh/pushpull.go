package mesh

import (
	"encoding/binary"
	"errors"
	"net"
	"strconv"

	"github.com/hashicorp/memberlist"
	"google.golang.org/protobuf/proto"

	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

// msgVersions is a periodic push-pull's state: the sender's id and, for
// every record it holds, its version and the seq at which its content last
// changed, not the records. Each side then sends the other only the
// records whose content the other lacks (a record set over TCP), so a
// push-pull between nodes that agree costs about 25 bytes per member
// instead of every record (a record with a full prefix digest is up to
// 8 KiB). Heartbeats (same content, new seq) reach only a few nodes and
// are not relayed, so copies that differ only by heartbeats are common;
// such a copy is refreshed only when it is heartbeatLag heartbeats old,
// so record ages stay meaningful. A join's push-pull still carries every
// record, so a joiner has them all when Join returns.
const msgVersions byte = 3

// heartbeatLag is how many versions a copy with current content may be
// behind before push-pull refreshes it.
const heartbeatLag = 6

// maxVersionsID bounds a node id in a versions message.
const maxVersionsID = 256

// recordVersionOf is one entry of a versions message.
type recordVersionOf struct {
	id      string
	v       version
	content uint64 // seq at which the content last changed
}

// encodeVersions encodes self and the versions of its records.
func encodeVersions(self string, vs []recordVersionOf) []byte {
	b := make([]byte, 0, 1+len(self)+2+len(vs)*28)
	b = append(b, msgVersions)
	b = binary.AppendUvarint(b, uint64(len(self)))
	b = append(b, self...)
	for _, r := range vs {
		b = binary.AppendUvarint(b, uint64(len(r.id)))
		b = append(b, r.id...)
		b = binary.AppendUvarint(b, r.v.epoch)
		b = binary.AppendUvarint(b, r.v.seq)
		b = binary.AppendUvarint(b, r.content)
	}
	return b
}

var errBadVersions = errors.New("mesh: malformed versions message")

// decodeVersions reads a versions message (kind byte included).
func decodeVersions(b []byte) (string, map[string]version, error) {
	if len(b) < 1 || b[0] != msgVersions {
		return "", nil, errBadVersions
	}
	b = b[1:]
	str := func() (string, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > maxVersionsID || uint64(len(b)-k) < n {
			return "", false
		}
		s := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return s, true
	}
	num := func() (uint64, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 {
			return 0, false
		}
		b = b[k:]
		return n, true
	}
	self, ok := str()
	if !ok {
		return "", nil, errBadVersions
	}
	out := map[string]version{}
	for len(b) > 0 {
		id, ok1 := str()
		e, ok2 := num()
		s, ok3 := num()
		_, ok4 := num() // the sender's content seq: what it lacks is decided by its seq
		if !ok1 || !ok2 || !ok3 || !ok4 {
			return "", nil, errBadVersions
		}
		out[id] = version{e, s}
	}
	return self, out, nil
}

// newerFor returns the records of current members the other side should
// get, given the versions it holds: those it lacks, of a newer epoch,
// whose content changed after its copy, or whose copy is heartbeatLag
// versions behind.
func (t *table) newerFor(theirs map[string]version) []*meshv1.NodeRecord {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*meshv1.NodeRecord
	for _, e := range t.nodes {
		if !e.member || e.record == nil {
			continue
		}
		mine := recordVersion(e.record)
		v, ok := theirs[e.id.NodeID]
		switch {
		case !ok, mine.epoch > v.epoch:
		case mine.epoch < v.epoch || mine.seq <= v.seq:
			continue
		case e.contentSeq > v.seq, mine.seq-v.seq >= heartbeatLag:
		default:
			continue
		}
		out = append(out, e.record)
	}
	return out
}

// encodeRecordSet encodes records as a record set message.
func encodeRecordSet(recs []*meshv1.NodeRecord) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(&meshv1.RecordSet{Records: recs})
	if err != nil {
		return nil, err
	}
	return append([]byte{msgRecordSet}, b...), nil
}

// mergeRecordSet merges a record set (push-pull state, or the records a
// peer found this node lacking); they are not relayed.
func (m *Mesh) mergeRecordSet(b []byte) {
	var s meshv1.RecordSet
	if err := proto.Unmarshal(b[1:], &s); err != nil {
		m.met.received.WithLabelValues("invalid").Inc()
		m.log.Debug("bad record set", "err", err)
		return
	}
	for _, r := range s.GetRecords() {
		m.receive(r, false)
	}
}

// answerVersions sends the peer that sent a versions message the records
// it lacks, over TCP, in the background (memberlist may hold its locks
// while it merges remote state).
func (m *Mesh) answerVersions(b []byte) {
	peer, theirs, err := decodeVersions(b)
	if err != nil {
		m.met.received.WithLabelValues("invalid").Inc()
		return
	}
	recs := m.table.newerFor(theirs)
	if len(recs) == 0 || peer == m.cfg.NodeID {
		return
	}
	msg, err := encodeRecordSet(recs)
	if err != nil {
		m.log.Error("encode records for a peer", "err", err)
		return
	}
	// The address comes from this mesh's own table: a *memberlist.Node
	// from Members() points into memberlist's state, which its packet
	// handler rewrites while the send below reads it (go test -race).
	// A peer not in the table yet (start-up) is looked up in memberlist's
	// list and its address copied at once.
	addr := ""
	if p, ok := m.Peer(peer); ok {
		addr = p.GossipAddr
	} else {
		for _, n := range m.ml.Members() {
			if n.Name == peer {
				addr = n.Address()
				break
			}
		}
	}
	host, port, err := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	pn, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || ip == nil || perr != nil {
		return
	}
	node := &memberlist.Node{Name: peer, Addr: ip, Port: uint16(pn)}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-m.stop:
			return
		default:
		}
		if err := m.ml.SendReliable(node, msg); err != nil {
			m.log.Debug("sending records a peer lacks", "peer", peer, "err", err)
		}
	}()
}

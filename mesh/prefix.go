package mesh

import (
	"bytes"

	"github.com/infermesh/infermesh/mesh/route"
	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

// SetPrefixDigest sets the digest of the chat prefixes this node served
// recently (node/prefix.Tracker.Digest). Like load, it is published with
// the next record, within Config.RecordInterval, so a node that serves
// many chats a second publishes its digest at most once an interval.
// Peers see it as route.Peer.Prefixes, which the prefix strategies read.
func (m *Mesh) SetPrefixDigest(d route.PrefixDigest) {
	if !d.Valid() {
		m.log.Error("prefix digest out of bounds; not published", "bytes", len(d.Bits), "hashes", d.Hashes)
		return
	}
	m.local.setPrefix(d)
}

// setPrefix stores the digest to publish and marks the record changed when
// it differs from the last one.
func (l *localState) setPrefix(d route.PrefixDigest) {
	l.mu.Lock()
	same := bytes.Equal(l.prefix.Bits, d.Bits) && l.prefix.Hashes == d.Hashes && l.prefix.Entries == d.Entries
	if !same {
		l.prefix = d
	}
	l.mu.Unlock()
	if !same {
		l.loadCh.Store(true)
	}
}

// digestToProto encodes a digest for the record; nil for an empty one.
func digestToProto(d route.PrefixDigest) *meshv1.PrefixDigest {
	if d.Empty() {
		return nil
	}
	return &meshv1.PrefixDigest{Bloom: d.Bits, HashCount: uint32(d.Hashes), Entries: uint32(d.Entries)}
}

// digestFromProto decodes a peer's digest; a malformed one (too large, no
// or too many hash functions) is dropped, so it cannot claim every prefix.
func digestFromProto(p *meshv1.PrefixDigest) route.PrefixDigest {
	if p == nil || len(p.GetBloom()) == 0 || p.GetHashCount() > route.MaxDigestHashes {
		return route.PrefixDigest{}
	}
	d := route.PrefixDigest{Bits: p.GetBloom(), Hashes: int(p.GetHashCount()), Entries: int(min(p.GetEntries(), 1<<30))}
	if !d.Valid() {
		return route.PrefixDigest{}
	}
	return d
}

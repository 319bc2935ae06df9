package mesh

import (
	"testing"
	"time"

	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

func TestVersionsRoundTripAndNewerFor(t *testing.T) {
	recs := []*meshv1.NodeRecord{
		rec("a", 5, 2, meshv1.Health_HEALTH_READY, "m"),
		rec("b", 1<<62, 900, meshv1.Health_HEALTH_READY),
	}
	self, vs, err := decodeVersions(encodeVersions("me", recs))
	if err != nil || self != "me" || len(vs) != 2 || vs["a"] != (version{5, 2}) || vs["b"] != (version{1 << 62, 900}) {
		t.Fatalf("decoded %q %v %v", self, vs, err)
	}
	for _, bad := range [][]byte{nil, {msgVersions}, {msgRecordSet, 0}, append(encodeVersions("me", recs), 3, 'x')} {
		if _, _, err := decodeVersions(bad); err == nil {
			t.Fatalf("malformed versions %v accepted", bad)
		}
	}

	tb := newTable("me", time.Now, 0)
	for _, id := range []string{"a", "b", "c"} {
		tb.join(Identity{NodeID: id}, "")
	}
	tb.merge(rec("a", 5, 3, meshv1.Health_HEALTH_READY)) // newer than theirs
	tb.merge(rec("b", 1<<62, 900, meshv1.Health_HEALTH_READY))
	tb.merge(rec("c", 1, 1, meshv1.Health_HEALTH_READY)) // they lack it
	got := map[string]bool{}
	for _, r := range tb.newerFor(vs) {
		got[r.GetNodeId()] = true
	}
	if len(got) != 2 || !got["a"] || !got["c"] {
		t.Fatalf("records to send: %v, want a and c", got)
	}
}

func TestRefusedRoundTrip(t *testing.T) {
	id, v, ok := decodeRefused(encodeRefused("node-7", version{1 << 60, 42}))
	if !ok || id != "node-7" || v != (version{1 << 60, 42}) {
		t.Fatalf("decoded %q %v %v", id, v, ok)
	}
	for _, bad := range [][]byte{nil, {msgRefused}, {msgRefused, 1, 2}, {msgRecord, 1, 2, 'x'}} {
		if _, _, ok := decodeRefused(bad); ok {
			t.Fatalf("malformed refusal %v accepted", bad)
		}
	}
}

package mesh

import (
	"testing"
	"time"

	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

func TestVersionsRoundTripAndNewerFor(t *testing.T) {
	vs := []recordVersionOf{
		{id: "a", v: version{5, 2}, content: 2},
		{id: "b", v: version{1 << 62, 900}, content: 17},
		{id: "d", v: version{3, 10}, content: 4},
		{id: "e", v: version{3, 10}, content: 4},
	}
	self, got, err := decodeVersions(encodeVersions("me", vs))
	if err != nil || self != "me" || len(got) != 4 || got["a"] != (version{5, 2}) || got["b"] != (version{1 << 62, 900}) {
		t.Fatalf("decoded %q %v %v", self, got, err)
	}
	for _, bad := range [][]byte{nil, {msgVersions}, {msgRecordSet, 0}, append(encodeVersions("me", vs), 3, 'x')} {
		if _, _, err := decodeVersions(bad); err == nil {
			t.Fatalf("malformed versions %v accepted", bad)
		}
	}

	tb := newTable("me", time.Now, 0)
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		tb.join(Identity{NodeID: id}, "")
	}
	ready := meshv1.Health_HEALTH_READY
	tb.merge(rec("a", 5, 3, ready, "m")) // content changed after their copy
	tb.merge(rec("b", 1<<62, 900, ready))
	tb.merge(rec("c", 1, 1, ready)) // they lack it
	tb.merge(rec("d", 3, 10, ready))
	tb.merge(rec("d", 3, 12, ready)) // heartbeats only, 2 versions ahead
	tb.merge(rec("e", 3, 10, ready))
	tb.merge(rec("e", 3, 10+heartbeatLag, ready)) // heartbeats only, far ahead
	sent := map[string]bool{}
	for _, r := range tb.newerFor(got) {
		sent[r.GetNodeId()] = true
	}
	if len(sent) != 3 || !sent["a"] || !sent["c"] || !sent["e"] {
		t.Fatalf("records to send: %v, want a, c and e", sent)
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

package mesh_test

import (
	"testing"

	"github.com/infermesh/infermesh/mesh/meshtest"
	"github.com/infermesh/infermesh/mesh/route"
)

// TestPrefixDigestsPropagate shows digests travelling between real
// memberlist instances, replacing older ones, and steering the prefix
// strategy on a node that holds nothing itself.
func TestPrefixDigestsPropagate(t *testing.T) {
	c := meshtest.Start(t, meshtest.Options{Nodes: 3})
	for _, n := range c.Nodes() {
		n.Ready("chat/m")
	}
	c.WaitConverged()

	convA := []uint64{11, 12, 13, 14}
	convB := []uint64{21, 22}
	longest := func(id string, conv []uint64, want int) func([]route.Peer) bool {
		return func(peers []route.Peer) bool {
			p, ok := peer(peers, id)
			return ok && p.Prefixes.Longest(conv) == want
		}
	}
	n1, n2, n3 := c.Node("n1"), c.Node("n2"), c.Node("n3")
	n1.Mesh.SetPrefixDigest(route.NewPrefixDigest(512, []uint64{13, 99}))
	n2.Mesh.SetPrefixDigest(route.NewPrefixDigest(512, []uint64{22}))
	for _, n := range c.Nodes() {
		meshtest.WaitFor(t, n, "n1's digest", longest("n1", convA, 3))
		meshtest.WaitFor(t, n, "n2's digest", longest("n2", convB, 2))
	}
	res := route.Rank(route.Prefix, route.Facts{Model: "chat/m", Prefixes: convA}, n3.Mesh.Peers())
	if got := res.Candidates[0].ID; got != "n1" {
		t.Fatalf("n3 ranks %s first for conversation A, want n1", got)
	}
	res = route.Rank(route.Prefix, route.Facts{Model: "chat/m", Prefixes: convB}, n3.Mesh.Peers())
	if got := res.Candidates[0].ID; got != "n2" {
		t.Fatalf("n3 ranks %s first for conversation B, want n2", got)
	}

	// A newer digest replaces the old one everywhere; an empty one clears it.
	n1.Mesh.SetPrefixDigest(route.NewPrefixDigest(512, []uint64{14}))
	n2.Mesh.SetPrefixDigest(route.PrefixDigest{})
	for _, n := range c.Nodes() {
		meshtest.WaitFor(t, n, "n1's new digest", longest("n1", convA, 4))
		meshtest.WaitFor(t, n, "n2's empty digest", longest("n2", convB, 0))
	}
	// A malformed digest is refused locally and not published.
	n1.Mesh.SetPrefixDigest(route.PrefixDigest{Bits: make([]byte, route.MaxDigestBytes+1), Hashes: 1})
	if p, _ := n1.Mesh.Peer("n1"); p.Prefixes.Longest(convA) != 4 {
		t.Fatal("a malformed digest replaced the published one")
	}
}

package mesh

import (
	"fmt"
	"testing"
	"time"

	"github.com/infermesh/infermesh/mesh/route"
	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

// benchTable is a table of n ready members; the first holders of them
// (all when holders >= n) hold model "m", every member holds "other".
func benchTable(n, holders int) *table {
	tb := newTable("n0000", time.Now, 0)
	for i := range n {
		id := fmt.Sprintf("n%04d", i)
		tb.join(Identity{NodeID: id, RPCAddr: id + ":7947", HTTPAddr: id + ":8080"}, id+":7946")
		models := []string{"other"}
		if i < holders {
			models = append(models, "m")
		}
		r := rec(id, 1, 1, meshv1.Health_HEALTH_READY, models...)
		r.MaxInFlight, r.InFlight = 8, uint32(i%5)
		tb.merge(r)
	}
	return tb
}

// BenchmarkRoutePerRequest measures what dispatch does per request before
// it forwards: take the peers, copy them (dispatch overlays its own exact
// load on the copy) and rank. "scan" is the path before prepared lists
// (every member copied and filtered per request), "prepared" the
// per-model list the table keeps. Compare the two at each size within
// one run: the prepared cost follows the model's holders, the scan's
// the mesh's size.
func BenchmarkRoutePerRequest(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		for _, holders := range []int{8, n} {
			if holders == 8 && n == 10 {
				continue // the same as holders=10 within noise; keep the run short
			}
			tb := benchTable(n, holders)
			for _, path := range []string{"scan", "prepared"} {
				b.Run(fmt.Sprintf("peers=%d/holders=%d/%s", n, holders, path), func(b *testing.B) {
					b.ReportAllocs()
					var c uint64
					for b.Loop() {
						var src []route.Peer
						if path == "scan" {
							src = tb.snapshot()
						} else {
							src = tb.serving("m")
						}
						view := make([]route.Peer, len(src))
						copy(view, src)
						c++
						res := route.Rank(route.RoundRobin, route.Facts{Model: "m", Counter: c}, view)
						if len(res.Candidates) != holders {
							b.Fatalf("%d candidates, want %d", len(res.Candidates), holders)
						}
					}
				})
			}
		}
	}
}

// BenchmarkRecordMerge measures the gossip side: merging one load-only
// record of a member, the most frequent table change (every node publishes
// its load every RecordInterval under traffic). "merge" is the merge alone
// (the snapshot is only marked stale); "merge+route" also reads the
// prepared list after each merge, the worst case, in which every request
// follows a change and pays the rebuild.
func BenchmarkRecordMerge(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		for _, path := range []string{"merge", "merge+route"} {
			b.Run(fmt.Sprintf("peers=%d/%s", n, path), func(b *testing.B) {
				tb := benchTable(n, min(n, 8))
				b.ReportAllocs()
				seq := uint64(1)
				for b.Loop() {
					seq++
					r := rec("n0003", 1, seq, meshv1.Health_HEALTH_READY, "other", "m")
					r.MaxInFlight, r.InFlight = 8, uint32(seq%7)
					if !tb.merge(r).accepted {
						b.Fatal("record not accepted")
					}
					if path == "merge+route" && len(tb.serving("m")) != min(n, 8) {
						b.Fatal("prepared list lost a holder")
					}
				}
			})
		}
	}
}

package mesh

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/infermesh/infermesh/mesh/route"
	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

// filterServing is what Serving computed per call before the prepared
// lists: every routable member holding the model, in id order.
func filterServing(peers []route.Peer, model string) []string {
	var out []string
	for _, p := range peers {
		if p.Routable() && p.Has(model) {
			out = append(out, p.ID)
		}
	}
	return out
}

func servingIDs(tb *table, model string) []string {
	var out []string
	for _, p := range tb.serving(model) {
		out = append(out, p.ID)
	}
	return out
}

// TestServingListsFollowEveryChange drives a table through random joins,
// records (health, models, load), ejections and leaves, and checks after
// every step that each model's prepared list is exactly the filter of the
// snapshot and carries the member's current view.
func TestServingListsFollowEveryChange(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 31))
	tb := newTable("n00", time.Now, 0)
	models := []string{"a", "b", "c"}
	healths := []meshv1.Health{meshv1.Health_HEALTH_READY, meshv1.Health_HEALTH_SATURATED, meshv1.Health_HEALTH_ALIVE, meshv1.Health_HEALTH_DRAINING}
	seq := map[string]uint64{}
	for step := range 3000 {
		id := fmt.Sprintf("n%02d", rng.IntN(20))
		switch op := rng.IntN(10); {
		case op < 2:
			tb.join(Identity{NodeID: id, RPCAddr: id + ":1"}, id+":7946")
		case op < 8:
			seq[id]++
			var ms []string
			for _, m := range models {
				if rng.IntN(2) == 0 {
					ms = append(ms, m)
				}
			}
			r := rec(id, 1, seq[id], healths[rng.IntN(len(healths))], ms...)
			r.InFlight = uint32(rng.IntN(9))
			tb.merge(r)
		case op < 9:
			tb.eject(id)
		default:
			tb.leave(id)
		}
		snap := tb.snapshot()
		for _, m := range models {
			want, got := filterServing(snap, m), servingIDs(tb, m)
			if !slices.Equal(want, got) {
				t.Fatalf("step %d model %s: prepared %v, filter %v", step, m, got, want)
			}
			for _, p := range tb.serving(m) {
				i := slices.IndexFunc(snap, func(q route.Peer) bool { return q.ID == p.ID })
				if snap[i].InFlight != p.InFlight || snap[i].Health != p.Health {
					t.Fatalf("step %d model %s: %s stale in the prepared list", step, m, p.ID)
				}
			}
		}
	}
}

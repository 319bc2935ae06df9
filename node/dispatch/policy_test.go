package dispatch_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/infermesh/infermesh/consensus/routing"
	"github.com/infermesh/infermesh/mesh/route"
	"github.com/infermesh/infermesh/node/dispatch"
)

// fixedPolicy is a PolicySource serving one policy.
type fixedPolicy dispatch.Policy

func (p fixedPolicy) Policy() dispatch.Policy { return dispatch.Policy(p) }

func TestPolicyWeightsAndCanaryReachRouting(t *testing.T) {
	c := start(t, spec{
		ids:    three,
		models: map[string][]string{"n2": {"m"}, "n3": {"m"}},
		policy: dispatch.Policy{Strategy: route.Weighted, Nodes: map[string]routing.Node{"n2": {Weight: 3}, "n3": {Weight: 1}}},
		engine: echo,
	})
	const n = 800
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		resp, _ := c.send(t, "n1", "m", "k", "x")
		counts[resp.Header.Get(dispatch.BackendHeader)]++
	}
	// sd of the share is ~0.015; allow 4 sd.
	if share := float64(counts["n2"]) / n; math.Abs(share-0.75) > 0.06 {
		t.Fatalf("weighted 3:1 through the cluster: %v", counts)
	}

	c2 := start(t, spec{
		ids:    three,
		models: map[string][]string{"n1": {"m"}, "n2": {"m"}, "n3": {"m"}},
		policy: dispatch.Policy{Nodes: map[string]routing.Node{"n3": {Canary: true, CanaryPercent: 30}}},
		engine: echo,
	})
	const callers = 300
	onCanary := 0
	for i := 0; i < callers; i++ {
		key := fmt.Sprint("caller-", i)
		first, _ := c2.send(t, "n1", "m", key, "x")
		second, _ := c2.send(t, "n2", "m", key, "x")
		a, b := first.Header.Get(dispatch.BackendHeader) == "n3", second.Header.Get(dispatch.BackendHeader) == "n3"
		if a != b {
			t.Fatalf("caller %s switched sides between requests", key)
		}
		if a {
			onCanary++
		}
	}
	// sd ~0.026; allow 4 sd.
	if share := float64(onCanary) / callers; math.Abs(share-0.30) > 0.11 {
		t.Fatalf("canary share %.3f, want ~0.30", share)
	}
}

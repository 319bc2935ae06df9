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

// TestPolicyApply: a node with an entry takes its weight and canary
// settings, and its cap when the entry sets one; others keep their own.
func TestPolicyApply(t *testing.T) {
	pol := dispatch.Policy{Nodes: map[string]routing.Node{
		"a": {Weight: 3, Canary: true, CanaryPercent: 10, InflightCap: 2},
		"b": {Weight: 5},
	}}
	a := route.Peer{ID: "a", Weight: 1, MaxInFlight: 8}
	b := route.Peer{ID: "b", Weight: 1, Canary: true, CanaryPercent: 50, MaxInFlight: 8}
	c := route.Peer{ID: "c", Weight: 7, MaxInFlight: 4}
	for _, p := range []*route.Peer{&a, &b, &c} {
		pol.Apply(p)
	}
	if a.Weight != 3 || !a.Canary || a.CanaryPercent != 10 || a.MaxInFlight != 2 {
		t.Errorf("a: %+v", a)
	}
	if b.Weight != 5 || b.Canary || b.CanaryPercent != 0 || b.MaxInFlight != 8 {
		t.Errorf("b (no cap in its entry keeps its own): %+v", b)
	}
	if c.Weight != 7 || c.MaxInFlight != 4 {
		t.Errorf("c (no entry): %+v", c)
	}
}

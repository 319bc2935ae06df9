package mesh

import (
	"slices"
	"testing"
)

// Join names are looked up on every round, every address kept, and the
// node's own gossip address left out.
func TestResolveJoin(t *testing.T) {
	cfg := Config{NodeID: "a", BindAddr: "127.0.0.1:0", Timers: TestTimers()}
	m, err := New(cfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	self := m.GossipAddr()
	got := m.resolveJoin([]string{"localhost:7999", self, "127.0.0.2", "no-such-host.invalid:7946"})
	if !slices.Contains(got, "127.0.0.1:7999") {
		t.Fatalf("localhost not resolved: %v", got)
	}
	if slices.Contains(got, self) {
		t.Fatalf("own address %s kept: %v", self, got)
	}
	if !slices.Contains(got, "127.0.0.2:7946") {
		t.Fatalf("bare host without the default port: %v", got)
	}
	if !slices.Contains(got, "no-such-host.invalid:7946") {
		t.Fatalf("unresolvable name dropped: %v", got)
	}
}

func TestJoinBackoffDefaultsCapAtTwoSeconds(t *testing.T) {
	c, err := Config{NodeID: "a"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.JoinBackoffMax.Seconds() != 2 {
		t.Fatalf("JoinBackoffMax %s", c.JoinBackoffMax)
	}
}

package node

import "testing"

// Loads are not serialised for the estimate: a lone load records what it
// holds, two that overlap record nothing rather than each other's growth.
func TestModelMemoryOverlappingLoads(t *testing.T) {
	m := newModelMemory()
	m.beginLoad()("alone", true)
	if _, ok := m.all()["alone"]; !ok {
		t.Fatal("a lone load recorded no estimate")
	}
	endA := m.beginLoad()
	endB := m.beginLoad()
	endA("a", true)
	endB("b", true)
	for _, id := range []string{"a", "b"} {
		if _, ok := m.all()[id]; ok {
			t.Fatalf("overlapping load %s recorded an estimate", id)
		}
	}
	m.beginLoad()("failed", false)
	if _, ok := m.all()["failed"]; ok {
		t.Fatal("a failed load recorded an estimate")
	}
}

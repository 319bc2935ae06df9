package main

import "testing"

func TestGCPercentFor(t *testing.T) {
	const floor = 64 << 20
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 100},         // nothing measured yet: Go's default
		{32 << 20, 100},  // half the floor: the default already reaches it
		{100 << 20, 100}, // above the floor
		{16 << 20, 300},  // 16 MB live grows to 64 MB
		{8 << 20, 700},   // 8 MB live grows to 64 MB
		{1 << 20, 1600},  // capped
		{20 << 20, 220},  // 64/20 = 3.2
	} {
		if got := gcPercentFor(c.live, floor); got != c.want {
			t.Errorf("gcPercentFor(%d) = %d, want %d", c.live, got, c.want)
		}
	}
}

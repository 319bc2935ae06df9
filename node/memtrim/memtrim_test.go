package memtrim

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestIdle: work keeps the release away; once the work is gone the release
// comes after the quiet period, once; work that comes back before it
// cancels it.
func TestIdle(t *testing.T) {
	var calls atomic.Int32
	i := &Idle{quiet: time.Hour, release: func() { calls.Add(1) }}
	i.Busy(1)
	if i.timer != nil {
		t.Fatal("a release is pending while work runs")
	}
	i.Busy(0)
	if i.timer == nil {
		t.Fatal("no release pending once the work is gone")
	}
	i.Busy(2)
	if i.timer != nil {
		t.Fatal("work came back and the release is still pending")
	}
	i.quiet = time.Millisecond
	i.Busy(0)
	deadline := time.Now().Add(10 * time.Second)
	for calls.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // a second release would come now
	if calls.Load() != 1 {
		t.Fatalf("%d releases, want 1", calls.Load())
	}
}

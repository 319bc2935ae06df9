package main

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// gcHeapFloor is the smallest heap the garbage collector lets grow before
// it collects. A node that only forwards holds a live heap of a few MB, so
// at Go's default (collect when the heap doubles) it collects every few
// hundred requests; letting the heap reach gcHeapFloor first takes about
// 8 % off the CPU an entry node spends per forwarded request
// (docs/benchmarks.md) for at most gcHeapFloor of memory. A node whose
// live heap is half the floor or more collects exactly as Go's default
// does.
const gcHeapFloor = 32 << 20

// gcFloorInterval is how often the live heap is read to re-derive the GC
// percentage.
const gcFloorInterval = time.Second

// keepGCFloor raises the GC percentage while the live heap is small, so
// the heap target is about gcHeapFloor, and returns it to 100 once the
// live heap is half the floor or more; it runs until ctx ends. With GOGC
// set by the operator it does nothing.
func keepGCFloor(ctx context.Context) {
	if os.Getenv("GOGC") != "" {
		return
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	cur := 100
	t := time.NewTicker(gcFloorInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			return
		}
		if pct := gcPercentFor(sample[0].Value.Uint64(), gcHeapFloor); pct != cur {
			debug.SetGCPercent(pct)
			cur = pct
		}
	}
}

// gcPercentFor is the GC percentage whose heap target, for a live heap of
// live bytes, is floor: never below Go's default 100, and at most 1600 (a
// live heap under 1/17 of the floor keeps that).
func gcPercentFor(live, floor uint64) int {
	if live == 0 || live*2 >= floor {
		return 100
	}
	return int(min(floor*100/live-100, 1600))
}

// Package memtrim gives memory a node freed back to the operating system:
// the Go heap's (debug.FreeOSMemory) and the C allocator's, where ONNX
// Runtime's arenas and the other C libraries free (glibc's malloc_trim,
// which returns the free pages of every malloc arena, not only the top of
// the heap). Freed C memory otherwise stays in the process: glibc keeps
// blocks under its mmap threshold (which grows up to 32 MiB as large
// blocks are freed) for reuse, so a burst of large image jobs would leave
// the node's resident size at its peak.
//
// Releasing costs a full garbage collection and a walk of the C heap
// (milliseconds on an idle node), so it is done after heavy work has
// ended and the node has been quiet for a moment (Idle), never per
// request on a hot path.
package memtrim

/*
#include <stdlib.h>
#if defined(__GLIBC__)
#include <malloc.h>
static int trimHeap(void) { return malloc_trim(0); }
#else
static int trimHeap(void) { return 0; }
#endif
*/
import "C"

import (
	"runtime/debug"
	"sync"
	"time"
)

// Release returns the free Go heap and the free C heap to the operating
// system now.
func Release() {
	debug.FreeOSMemory()
	C.trimHeap()
}

// Idle calls Release once tracked work has stopped for a quiet period:
// Busy reports how much work is running or waiting; when it falls to
// zero a timer starts, and new work before it fires stops it. Each node
// has its own.
type Idle struct {
	quiet time.Duration
	// release is Release (a test may count calls instead).
	release func()

	mu    sync.Mutex
	timer *time.Timer
}

// NewIdle returns an Idle that releases after quiet without work.
func NewIdle(quiet time.Duration) *Idle {
	return &Idle{quiet: quiet, release: Release}
}

// Busy tells the Idle how much tracked work is running or waiting now.
func (i *Idle) Busy(depth int) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.timer != nil {
		i.timer.Stop()
		i.timer = nil
	}
	if depth > 0 {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(i.quiet, func() {
		i.mu.Lock()
		if i.timer != t {
			i.mu.Unlock()
			return // work came back meanwhile
		}
		i.timer = nil
		i.mu.Unlock()
		i.release()
	})
	i.timer = t
}

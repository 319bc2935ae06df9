package imagecodec

import (
	"math/bits"
	"sync"
)

// Pixel buffers for decoded JPEGs are recycled per Budget: a 640x480
// request otherwise allocates (and the runtime zeroes) a fresh 1.2 MB
// buffer that libjpeg overwrites entirely, and the garbage collector runs
// for it every few requests. Buffers come in power-of-two size classes
// from 1<<minPooledShift to 1<<maxPooledShift bytes; larger images get their own
// allocation, so one big photo is not kept alive by the pool. A
// sync.Pool drops what it holds over two collections, so an idle node
// returns the memory.
const (
	minPooledShift = 18 // 256 KiB: 256x256 RGBA
	maxPooledShift = 23 // 8 MiB: 1920x1080 RGBA fits
)

// pixelPool hands out byte buffers of at least the asked length, with
// stale contents: callers overwrite every byte they use.
type pixelPool struct {
	classes [maxPooledShift - minPooledShift + 1]sync.Pool
}

// poolClass is the index of the size class holding n bytes, or -1 when n is
// outside the pooled range.
func poolClass(n int) int {
	if n <= 0 || n > 1<<maxPooledShift {
		return -1
	}
	shift := bits.Len(uint(n - 1))
	return max(shift, minPooledShift) - minPooledShift
}

// get returns a buffer of length n; its contents are not zeroed when it
// comes from the pool. A nil pool allocates.
func (p *pixelPool) get(n int) []byte {
	c := poolClass(n)
	if p == nil || c < 0 {
		return make([]byte, n)
	}
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, 1<<(c+minPooledShift))
}

// put gives b back for reuse; the caller no longer holds any slice of it.
// Buffers that did not come from get's size classes are dropped.
func (p *pixelPool) put(b []byte) {
	c := poolClass(cap(b))
	if p == nil || c < 0 || cap(b) != 1<<(c+minPooledShift) {
		return
	}
	b = b[:0]
	p.classes[c].Put(&b)
}

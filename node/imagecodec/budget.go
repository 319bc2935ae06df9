package imagecodec

import (
	"context"
	"image"
	"runtime/debug"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// Budget bounds the memory that decoded images hold across one node's
// requests. A request reserves its image's cost, read from the file header
// before any pixel is decoded, and waits (within its context) while other
// requests hold the budget, so concurrent large images queue instead of
// adding up. Each node has its own Budget.
type Budget struct {
	sem *semaphore.Weighted
	max int64

	mu        sync.Mutex
	lastFree  time.Time
	freeEvery time.Duration

	// pixels recycles decoded JPEG buffers between this node's requests.
	pixels pixelPool
}

// DefaultBudget is the decoded-image memory a node allows by default.
const DefaultBudget = 1 << 30

// bigRelease is the reservation size after whose release the heap is
// returned to the operating system (at most once per freeEvery).
const bigRelease = 64 << 20

// NewBudget returns a budget of max bytes (DefaultBudget when <= 0).
func NewBudget(max int64) *Budget {
	if max <= 0 {
		max = DefaultBudget
	}
	return &Budget{sem: semaphore.NewWeighted(max), max: max, freeEvery: 2 * time.Second}
}

// Cost is what decoding, preparing and answering a w×h image may hold: the
// decoded pixels at up to 8 bytes each (16-bit PNG), one RGBA working copy
// for resizing and tensor filling, and one RGBA result of the same size.
func Cost(w, h int) int64 { return int64(w) * int64(h) * (8 + 4 + 4) }

func (b *Budget) acquire(ctx context.Context, cost int64) (func(), error) {
	if cost > b.max {
		return nil, inputErr("image needs %d MiB to decode, more than this node's %d MiB image budget", cost>>20, b.max>>20)
	}
	if err := b.sem.Acquire(ctx, cost); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			b.sem.Release(cost)
			if cost >= bigRelease {
				b.returnMemory()
			}
		})
	}, nil
}

// returnMemory gives freed heap back to the operating system after a large
// image, so one big request does not leave the node's RSS high for good.
func (b *Budget) returnMemory() {
	b.mu.Lock()
	now := time.Now()
	if now.Sub(b.lastFree) < b.freeEvery {
		b.mu.Unlock()
		return
	}
	b.lastFree = now
	b.mu.Unlock()
	go debug.FreeOSMemory()
}

// DecodeBudgeted decodes s, plain base64 (standard or URL alphabet, padded
// or not) or a `data:image/...;base64,` URL, holding a PNG, JPEG, GIF or
// WebP image within opts' limits, under a Budget: after the header is
// read, the image's Cost is reserved (waiting while ctx allows) before its
// pixels are decoded. The caller calls release when it no longer holds the
// image or anything derived from it (a decoded JPEG's pixels are then
// reused by a later request). A nil budget reserves nothing.
// Caller mistakes are returned as *engine.InputError for "image".
func DecodeBudgeted(ctx context.Context, s string, opts Options, b *Budget) (img image.Image, release func(), err error) {
	opts = opts.withDefaults()
	payload, err := base64Payload(s)
	if err != nil {
		return nil, nil, err
	}
	data, err := decodeBase64(payload, opts.MaxBytes)
	if err != nil {
		return nil, nil, err
	}
	release = func() {}
	var pool *pixelPool
	if b != nil {
		pool = &b.pixels
	}
	img, pooled, err := decodeImageWith(data, opts.MaxPixels, func(w, h int) error {
		if opts.Check != nil {
			if err := opts.Check(w, h); err != nil {
				return err
			}
		}
		if b == nil {
			return nil
		}
		r, err := b.acquire(ctx, Cost(w, h))
		if err != nil {
			return err
		}
		release = r
		return nil
	}, pool, opts.Stream)
	if err != nil {
		release()
		return nil, nil, err
	}
	if pooled != nil {
		// The pixels go back to the pool before the reservation: once
		// the reservation is released, another request may decode. A
		// stream's decode may still be writing them, or never have run.
		reserved := release
		st, _ := img.(*Streamed)
		var once sync.Once
		release = func() {
			once.Do(func() {
				if st != nil {
					st.abandon()
				}
				pool.put(pooled)
				reserved()
			})
		}
	}
	return img, release, nil
}

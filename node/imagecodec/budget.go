package imagecodec

import (
	"context"
	"image"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/infermesh/infermesh/node/memtrim"
)

// Budget bounds the memory that decoded images hold across one node's
// requests. A request reserves its image's cost, read from the file header
// before any pixel is decoded, and waits (within its context) while other
// requests hold the budget, so concurrent large images queue instead of
// adding up. Each node has its own Budget.
type Budget struct {
	sem *semaphore.Weighted
	max int64

	// big counts the reservations of at least bigRelease bytes held now;
	// idle returns the memory once none has been held for a moment.
	mu   sync.Mutex
	big  int
	idle *memtrim.Idle

	// pixels recycles decoded JPEG buffers between this node's requests.
	pixels pixelPool
}

// DefaultBudget is the decoded-image memory a node allows by default.
const DefaultBudget = 1 << 30

// bigRelease is the reservation size after whose release the freed
// memory is returned to the operating system, once no such reservation
// has been held for bigQuiet: after the request's answer is written, and
// once after a burst rather than after each image.
const (
	bigRelease = 64 << 20
	bigQuiet   = 2 * time.Second
)

// NewBudget returns a budget of max bytes (DefaultBudget when <= 0).
func NewBudget(max int64) *Budget {
	if max <= 0 {
		max = DefaultBudget
	}
	return &Budget{sem: semaphore.NewWeighted(max), max: max, idle: memtrim.NewIdle(bigQuiet)}
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
	if cost >= bigRelease {
		b.bigHeld(+1)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			b.sem.Release(cost)
			if cost >= bigRelease {
				b.bigHeld(-1)
			}
		})
	}, nil
}

// bigHeld counts a large reservation taken (+1) or released (-1): once
// none has been held for bigQuiet, the freed memory (Go heap and C heap:
// memtrim) goes back to the operating system, so large images do not
// leave the node's RSS high for good.
func (b *Budget) bigHeld(d int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.big += d
	b.idle.Busy(b.big)
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

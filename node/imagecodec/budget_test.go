package imagecodec

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"image"
	"image/png"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

func pngBase64(t *testing.T, w, h int) string {
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

// A second image waits while the first holds the budget (its context ends
// the wait), and decodes once the first is released.
func TestBudgetQueuesImages(t *testing.T) {
	img := pngBase64(t, 100, 100)
	b := NewBudget(Cost(100, 100) + Cost(10, 10))
	_, release, err := DecodeBudgeted(context.Background(), img, Options{}, b)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := DecodeBudgeted(ctx, img, Options{}, b); !errors.Is(err, context.Canceled) {
		t.Fatalf("second image while the budget is held: %v, want to wait until its context ends", err)
	}
	// A small one still fits beside it.
	_, rsmall, err := DecodeBudgeted(context.Background(), pngBase64(t, 10, 10), Options{}, b)
	if err != nil {
		t.Fatalf("small image beside the big one: %v", err)
	}
	rsmall()
	release()
	release() // idempotent
	_, r2, err := DecodeBudgeted(context.Background(), img, Options{}, b)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	r2()
	// An image that could never fit is a caller error, at once.
	if _, _, err := DecodeBudgeted(context.Background(), pngBase64(t, 200, 200), Options{}, b); !errors.Is(err, engine.ErrInvalidInput) {
		t.Fatalf("image over the whole budget: %v, want an input error", err)
	}
	// A broken file reserves nothing.
	if _, _, err := DecodeBudgeted(context.Background(), "aGVsbG8=", Options{}, b); !errors.Is(err, engine.ErrInvalidInput) {
		t.Fatalf("not an image: %v", err)
	}
	if !b.sem.TryAcquire(b.max) {
		t.Fatal("budget not whole after every release")
	}
}

//go:build cgo && !nolibjpeg

package imagecodec

import (
	"bytes"
	"context"
	"encoding/base64"
	"image"
	"testing"
)

func TestPoolClass(t *testing.T) {
	for _, c := range []struct{ n, class int }{
		{-1, -1}, {0, -1}, {1, 0}, {1 << 18, 0}, {1<<18 + 1, 1}, {640 * 480 * 4, 3},
		{1920 * 1080 * 4, 5}, {1 << 23, 5}, {1<<23 + 1, -1},
	} {
		if got := poolClass(c.n); got != c.class {
			t.Errorf("poolClass(%d) = %d, want %d", c.n, got, c.class)
		}
	}
	var p pixelPool
	if b := p.get(1000); len(b) != 1000 || cap(b) != 1<<18 {
		t.Errorf("get(1000): len %d cap %d, want 1000 and the class size", len(b), cap(b))
	}
	if b := p.get(1<<23 + 1); len(b) != 1<<23+1 {
		t.Errorf("get above the classes: len %d", len(b))
	}
	// A buffer not made by get (its capacity is no class size) is dropped.
	p.put(make([]byte, 1000))
	if b := p.get(1000); cap(b) != 1<<18 {
		t.Errorf("a foreign buffer came back from the pool: cap %d", cap(b))
	}
	var nilPool *pixelPool
	nilPool.put(nilPool.get(100))
}

// TestDecodeIntoDirtyBuffer: a JPEG decoded into a recycled buffer full of
// another image's bytes has exactly the pixels of a decode into a fresh
// one: libjpeg writes every byte, so nothing of an earlier request shows.
func TestDecodeIntoDirtyBuffer(t *testing.T) {
	recycled := 0
	for name, data := range turboCases(t) {
		fresh, _, err := decodeImageWith(data, 1<<26, nil, nil, false)
		if err != nil {
			continue
		}
		var p pixelPool
		b := fresh.Bounds()
		dirty := p.get(b.Dx() * b.Dy() * 4)
		for i := range dirty {
			dirty[i] = byte(i*7 + 3)
		}
		p.put(dirty)
		got, pooled, err := decodeImageWith(data, 1<<26, nil, &p, false)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		fr, ok1 := fresh.(*image.RGBA)
		gr, ok2 := got.(*image.RGBA)
		if ok1 != ok2 || (ok1 && !bytes.Equal(fr.Pix, gr.Pix)) {
			t.Errorf("%s: decode into a recycled buffer differs from a fresh decode", name)
		}
		if pooled != nil && (!ok2 || &pooled[0] != &gr.Pix[0]) {
			t.Errorf("%s: the pool buffer reported is not the image's pixels", name)
		}
		if pooled != nil {
			recycled++
		}
		p.put(pooled)
	}
	if recycled == 0 {
		t.Error("no JPEG was decoded into a pool buffer")
	}
}

// TestBudgetedReleaseRecycles: releasing a budgeted JPEG hands its pixels
// back once, however often release is called.
func TestBudgetedReleaseRecycles(t *testing.T) {
	bud := NewBudget(0)
	s := base64.StdEncoding.EncodeToString(plainJPEG(t))
	for range 3 {
		img, release, err := DecodeBudgeted(context.Background(), s, Options{}, bud)
		if err != nil {
			t.Fatal(err)
		}
		if img.Bounds().Empty() {
			t.Fatal("empty image")
		}
		release()
		release()
	}
	budgetReturned(t, bud)
}

// plainJPEG is a 4:2:0 test JPEG that libjpeg decodes.
func plainJPEG(t *testing.T) []byte {
	t.Helper()
	d := turboCases(t)["video-001.q50.420.jpeg"]
	if d == nil {
		t.Fatal("testdata/video-001.q50.420.jpeg is missing")
	}
	return d
}

// budgetReturned fails t unless every byte of bud is free.
func budgetReturned(t *testing.T, bud *Budget) {
	t.Helper()
	if err := bud.sem.Acquire(context.Background(), bud.max); err != nil {
		t.Fatalf("the budget was not fully returned: %v", err)
	}
	bud.sem.Release(bud.max)
}

//go:build cgo && !nolibjpeg

package imagecodec

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"image"
	"image/draw"
	"testing"
)

// asRGBA copies img into a new RGBA with its origin at (0, 0).
func asRGBA(img image.Image) *image.RGBA {
	b := img.Bounds()
	out := image.NewRGBA(image.Rect(0, 0, b.Dx(), b.Dy()))
	draw.Draw(out, out.Rect, img, b.Min, draw.Src)
	return out
}

// decodeStreamed decodes s as a stream (when DecodeBudgeted streams it)
// on the calling goroutine and returns a copy of the picture.
func decodeStreamed(t *testing.T, s string, opts Options, bud *Budget) (image.Image, *Streamed, error) {
	t.Helper()
	opts.Stream = true
	img, release, err := DecodeBudgeted(context.Background(), s, opts, bud)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	st, ok := img.(*Streamed)
	if !ok {
		return asRGBA(img), nil, nil
	}
	final, redone, err := st.Decode()
	if err != nil {
		return nil, st, err
	}
	if redone == (final == image.Image(st.Buffer())) {
		t.Fatalf("redone %v, but the picture is the buffer: %v", redone, !redone)
	}
	if !redone && !st.Rows(st.Bounds().Dy()) {
		t.Fatal("a clean decode does not report its rows")
	}
	if redone && st.Rows(st.Bounds().Dy()) {
		t.Fatal("a refused decode reports its rows as final")
	}
	return asRGBA(final), st, nil
}

// TestStreamedMatchesDecode: every test JPEG decodes as a stream to the
// pixels (or the error) of a decode at once, including the files libjpeg
// leaves to image/jpeg (CMYK, Adobe RGB: Decode reports redone) and a
// truncated one (the error is image/jpeg's).
func TestStreamedMatchesDecode(t *testing.T) {
	bud := NewBudget(0)
	streamed := 0
	for name, data := range turboCases(t) {
		s := base64.StdEncoding.EncodeToString(data)
		want, wantErr := decodeOpts(s, Options{})
		got, st, err := decodeStreamed(t, s, Options{}, bud)
		if st != nil {
			streamed++
		}
		switch {
		case (err == nil) != (wantErr == nil):
			t.Errorf("%s: streamed error %v, at once %v", name, err, wantErr)
		case err != nil:
			if err.Error() != wantErr.Error() {
				t.Errorf("%s: streamed error %q, at once %q", name, err, wantErr)
			}
		case !bytes.Equal(got.(*image.RGBA).Pix, asRGBA(want).Pix):
			t.Errorf("%s: streamed pixels differ from a decode at once", name)
		}
	}
	if streamed == 0 {
		t.Fatal("no file was streamed")
	}
	budgetReturned(t, bud)
}

// TestStreamedRowsWhileDecoding: a reader on another goroutine copies each
// band of rows as Rows reports it decoded; what it copied is the final
// picture.
func TestStreamedRowsWhileDecoding(t *testing.T) {
	for name, data := range turboCases(t) {
		opts := Options{Stream: true}
		img, release, err := DecodeBudgeted(context.Background(), base64.StdEncoding.EncodeToString(data), opts, NewBudget(0))
		if err != nil {
			continue
		}
		st, ok := img.(*Streamed)
		if !ok {
			release()
			continue
		}
		buf := st.Buffer()
		h := buf.Rect.Dy()
		copied := make([]byte, len(buf.Pix))
		got := make(chan int)
		go func() {
			n := 0
			for ; n < h; n = min(n+7, h) {
				if !st.Rows(n) {
					break
				}
				copy(copied[:n*buf.Stride], buf.Pix[:n*buf.Stride])
			}
			if n == h && st.Rows(h) {
				copy(copied, buf.Pix)
			} else {
				n = -1
			}
			got <- n
		}()
		final, redone, err := st.Decode()
		n := <-got
		switch {
		case err != nil || redone:
			if n != -1 {
				t.Errorf("%s: the reader got all rows of a decode that was redone or failed", name)
			}
		case n != h:
			t.Errorf("%s: the reader stopped at row %d of %d", name, n, h)
		case !bytes.Equal(copied, asRGBA(final).Pix):
			t.Errorf("%s: rows read during the decode differ from the picture", name)
		}
		release()
	}
}

// TestStreamedReleasedUndecoded: a stream released before anyone decodes
// it gives its buffer and budget back, and then reports an error instead
// of decoding into a buffer it no longer owns.
func TestStreamedReleasedUndecoded(t *testing.T) {
	bud := NewBudget(0)
	img, release, err := DecodeBudgeted(context.Background(), base64.StdEncoding.EncodeToString(plainJPEG(t)), Options{Stream: true}, bud)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := img.(*Streamed)
	if !ok {
		t.Fatalf("%T, want a stream", img)
	}
	release()
	if _, _, err := st.Decode(); err == nil {
		t.Fatal("a released stream decoded")
	}
	if st.Rows(1) {
		t.Fatal("a released stream reports rows")
	}
	budgetReturned(t, bud)
}

// TestStreamOnlyWhenAsked: without Options.Stream, or without a budget (no
// pool), or for a file needing EXIF rotation, the picture comes decoded.
func TestStreamOnlyWhenAsked(t *testing.T) {
	small := encodeJPEG(t, testImage(12, 9))
	rotated := withSegments(small, exifSegment(6, binary.LittleEndian))
	for _, c := range []struct {
		name string
		data []byte
		opts Options
		bud  *Budget
	}{
		{"no Stream", small, Options{}, NewBudget(0)},
		{"no budget", small, Options{Stream: true}, nil},
		{"EXIF rotation", rotated, Options{Stream: true}, NewBudget(0)},
	} {
		img, release, err := DecodeBudgeted(context.Background(), base64.StdEncoding.EncodeToString(c.data), c.opts, c.bud)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if _, ok := img.(*Streamed); ok {
			t.Errorf("%s: streamed", c.name)
		}
		release()
	}
}

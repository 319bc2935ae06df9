package vision

import (
	"bytes"
	"context"
	"encoding/base64"
	"image"
	"image/jpeg"
	"os"
	"testing"

	"github.com/infermesh/infermesh/node/imagecodec"
)

// TestResampleImageStreamed: the letterbox (BlazeFace) and the stretch
// (CenterNet) computed by resampleImage while a JPEG is decoded are
// bit for bit resampleWindow's on the picture decoded at once, for a
// file libjpeg decodes, one it leaves to image/jpeg (CMYK: everything is
// computed again from image/jpeg's picture), and a truncated file (the
// error is the one a decode at once reports).
func TestResampleImageStreamed(t *testing.T) {
	var photo bytes.Buffer
	if err := jpeg.Encode(&photo, testPattern(640, 480), &jpeg.Options{Quality: 90}); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"pattern": photo.Bytes()}
	for _, name := range []string{"video-001.cmyk.jpeg", "video-001.progressive.truncated.jpeg", "video-001.q50.420.jpeg"} {
		d, err := os.ReadFile("../../imagecodec/testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = d
	}
	bud := imagecodec.NewBudget(0)
	for name, data := range files {
		s := base64.StdEncoding.EncodeToString(data)
		whole, releaseWhole, wantErr := imagecodec.DecodeBudgeted(context.Background(), s, imagecodec.Options{}, nil)
		for _, c := range []struct {
			kind           string
			size           int
			x0, y0, sw, sh func(w, h float64) float64
			mul, add       float32
		}{
			{"letterbox", 128, func(w, h float64) float64 { return (w - max(w, h)) / 2 }, func(w, h float64) float64 { return (h - max(w, h)) / 2 },
				func(w, h float64) float64 { return max(w, h) }, func(w, h float64) float64 { return max(w, h) }, 1 / 127.5, -1},
			{"stretch", 96, func(w, h float64) float64 { return 0 }, func(w, h float64) float64 { return 0 },
				func(w, h float64) float64 { return w }, func(w, h float64) float64 { return h }, 1, 0},
		} {
			img, release, err := imagecodec.DecodeBudgeted(context.Background(), s, imagecodec.Options{Stream: true}, bud)
			if err != nil {
				if wantErr == nil || err.Error() != wantErr.Error() {
					t.Fatalf("%s: %v, at once %v", name, err, wantErr)
				}
				continue
			}
			if _, ok := img.(*imagecodec.Streamed); !ok {
				t.Fatalf("%s: not streamed (%T)", name, img)
			}
			b := img.Bounds()
			w, h := float64(b.Dx()), float64(b.Dy())
			got := make([]float32, c.size*c.size*3)
			src, err := resampleImage(img, c.x0(w, h), c.y0(w, h), c.sw(w, h), c.sh(w, h), c.size, c.size, got, c.mul, c.add)
			switch {
			case wantErr != nil:
				if err == nil || err.Error() != wantErr.Error() {
					t.Errorf("%s %s: error %v, at once %v", name, c.kind, err, wantErr)
				}
			case err != nil:
				t.Errorf("%s %s: %v", name, c.kind, err)
			default:
				ref := toRGBA(whole)
				want := make([]float32, len(got))
				resampleWindow(ref, c.x0(w, h), c.y0(w, h), c.sw(w, h), c.sh(w, h), c.size, c.size, want, c.mul, c.add)
				for i := range want {
					if got[i] != want[i] {
						t.Fatalf("%s %s: value %d is %v, at once %v", name, c.kind, i, got[i], want[i])
					}
				}
				if !bytes.Equal(src.Pix, ref.Pix) || src.Rect != ref.Rect {
					t.Errorf("%s %s: the picture returned differs from the one decoded at once", name, c.kind)
				}
			}
			release()
		}
		if releaseWhole != nil {
			releaseWhole()
		}
	}
}

// TestAcquireForDecodesWhenBusy: with a free run slot a stream comes back
// undecoded (the resize will run beside the decode); with every slot
// taken it is decoded while the caller waits, so the slot, once free, is
// held for the resize and the run only.
func TestAcquireForDecodesWhenBusy(t *testing.T) {
	f := loadFaces(t).(*faces)
	var photo bytes.Buffer
	if err := jpeg.Encode(&photo, testPattern(64, 48), &jpeg.Options{Quality: 90}); err != nil {
		t.Fatal(err)
	}
	stream := func() *imagecodec.Streamed {
		img, release, err := imagecodec.DecodeBudgeted(context.Background(), base64.StdEncoding.EncodeToString(photo.Bytes()),
			imagecodec.Options{Stream: true}, imagecodec.NewBudget(0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(release)
		return img.(*imagecodec.Streamed)
	}
	ctx := context.Background()

	st := stream()
	s, img, err := f.det.acquireFor(ctx, f.done, st)
	if err != nil {
		t.Fatal(err)
	}
	if img != image.Image(st) {
		t.Errorf("free slot: got %T, want the stream itself", img)
	}
	f.det.release(s)

	held, err := f.det.acquire(ctx, f.done)
	if err != nil {
		t.Fatal(err)
	}
	st = stream()
	type result struct {
		s   *slot
		img image.Image
		err error
	}
	got := make(chan result, 1)
	go func() {
		s, img, err := f.det.acquireFor(ctx, f.done, st)
		got <- result{s, img, err}
	}()
	// Rows reports the whole picture once the waiting caller has decoded
	// it; the slot is still taken.
	if !st.Rows(48) {
		t.Fatal("the stream was not decoded while its caller waited for a slot")
	}
	select {
	case r := <-got:
		t.Fatalf("acquireFor returned while every slot was taken: %v", r.err)
	default:
	}
	f.det.release(held)
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if _, ok := r.img.(*image.RGBA); !ok {
		t.Errorf("busy: got %T, want the decoded picture", r.img)
	}
	f.det.release(r.s)
}

// The engines the API streams JPEGs to say so.
var (
	_ interface{ TakesStreamedImages() bool } = (*faces)(nil)
	_ interface{ TakesStreamedImages() bool } = (*detector)(nil)
	_ rowStream                               = (*imagecodec.Streamed)(nil)
	_ image.Image                             = (*imagecodec.Streamed)(nil)
)

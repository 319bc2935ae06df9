package onnx_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"image"
	"image/color"
	"image/png"
	"strings"
	"sync"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
	"github.com/infermesh/infermesh/node/imagecodec"
)

func isnetSpec(t testing.TB, options map[string]string) engine.Spec {
	t.Helper()
	return engine.Spec{
		ID:      "onnx/isnet/small",
		Task:    engine.TaskBackgroundRemoval,
		Dir:     onnxtest.AssetDir(t, "isnet", "model.onnx"),
		Files:   map[string]string{"model": "model.onnx"},
		Options: options,
	}
}

func loadISNet(t testing.TB, rt *onnx.Runtime, options map[string]string) engine.BackgroundRemover {
	t.Helper()
	br, err := rt.LoadBackgroundRemover(isnetSpec(t, options))
	if err != nil {
		t.Fatalf("LoadBackgroundRemover: %v", err)
	}
	t.Cleanup(func() {
		if err := br.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return br
}

func photo(t testing.TB) image.Image {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(onnxtest.GoTestdata(t, "video-001.png")))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// meanAlpha is the mean alpha of img over r, in [0, 1].
func meanAlpha(img *image.NRGBA, r image.Rectangle) float64 {
	var sum, n float64
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			sum += float64(img.NRGBAAt(x, y).A)
			n++
		}
	}
	return sum / n / 255
}

// checkMask asserts out has src's size and RGB (within rgbTolerance) and
// that the background regions are transparent and the people opaque.
func checkMask(t *testing.T, src image.Image, out *image.NRGBA, rgbTolerance int) {
	t.Helper()
	if got, want := out.Bounds().Size(), src.Bounds().Size(); got != want {
		t.Fatalf("output is %v, input %v", got, want)
	}
	sb, ob := src.Bounds(), out.Bounds()
	for y := range sb.Dy() {
		for x := range sb.Dx() {
			s := color.NRGBAModel.Convert(src.At(sb.Min.X+x, sb.Min.Y+y)).(color.NRGBA)
			o := out.NRGBAAt(ob.Min.X+x, ob.Min.Y+y)
			if o.A == 0 {
				continue // PNG may not keep colour under zero alpha
			}
			for _, d := range []int{int(s.R) - int(o.R), int(s.G) - int(o.G), int(s.B) - int(o.B)} {
				if d > rgbTolerance || -d > rgbTolerance {
					t.Fatalf("pixel (%d,%d): RGB %v, input %v", x, y, o, s)
				}
			}
		}
	}
	background, foreground := onnxtest.PhotoRegions()
	for _, r := range background {
		a := meanAlpha(out, r.Add(ob.Min))
		t.Logf("background %v: mean alpha %.3f", r, a)
		if a >= 0.2 {
			t.Errorf("background %v: mean alpha %.3f, want < 0.2", r, a)
		}
	}
	for _, r := range foreground {
		a := meanAlpha(out, r.Add(ob.Min))
		t.Logf("foreground %v: mean alpha %.3f", r, a)
		if a <= 0.8 {
			t.Errorf("foreground %v: mean alpha %.3f, want > 0.8", r, a)
		}
	}
}

// cancelOnRead wraps an image and cancels a context the first time its
// pixels are read, i.e. after RemoveBackground has accepted the call.
type cancelOnRead struct {
	image.Image
	once   sync.Once
	cancel context.CancelFunc
}

func (c *cancelOnRead) At(x, y int) color.Color {
	c.once.Do(c.cancel)
	return c.Image.At(x, y)
}

func TestISNet(t *testing.T) {
	rt := onnxtest.Runtime(t)
	br := loadISNet(t, rt, nil)
	if br.ID() != "onnx/isnet/small" {
		t.Fatalf("ID %q", br.ID())
	}
	src := photo(t)

	var reference *image.NRGBA
	t.Run("png", func(t *testing.T) {
		out, err := br.RemoveBackground(context.Background(), src)
		if err != nil {
			t.Fatal(err)
		}
		checkMask(t, src, out, 0)
		reference = out
	})

	t.Run("jpeg round trip", func(t *testing.T) {
		jpegData := onnxtest.GoTestdata(t, "video-001.jpeg")
		img, _, err := imagecodec.DecodeBudgeted(context.Background(), "data:image/jpeg;base64,"+base64.StdEncoding.EncodeToString(jpegData), imagecodec.Options{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		out, err := br.RemoveBackground(context.Background(), img)
		if err != nil {
			t.Fatal(err)
		}
		url, err := imagecodec.EncodePNGDataURL(out)
		if err != nil {
			t.Fatal(err)
		}
		back, _, err := imagecodec.DecodeBudgeted(context.Background(), url, imagecodec.Options{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		nrgba, ok := back.(*image.NRGBA)
		if !ok {
			t.Fatalf("decoded PNG is %T, want *image.NRGBA", back)
		}
		// The JPEG's colours differ from the PNG's by compression only; the
		// data URL round trip itself is lossless.
		checkMask(t, img, nrgba, 1)
	})

	t.Run("sub-image", func(t *testing.T) {
		// A sub-image keeps its parent's coordinates; the result must still
		// be the photo's right half with the same mask there.
		r := image.Rect(75, 0, 150, 103)
		sub := src.(interface {
			SubImage(image.Rectangle) image.Image
		}).SubImage(r)
		out, err := br.RemoveBackground(context.Background(), sub)
		if err != nil {
			t.Fatal(err)
		}
		if out.Bounds().Size() != r.Size() {
			t.Fatalf("output is %v, want %v", out.Bounds().Size(), r.Size())
		}
		_, foreground := onnxtest.PhotoRegions()
		a := meanAlpha(out, foreground[3].Sub(r.Min).Add(out.Bounds().Min))
		b := meanAlpha(out, image.Rect(0, 0, 20, 50).Add(out.Bounds().Min))
		if a <= 0.8 || b >= 0.2 {
			t.Fatalf("right presenter alpha %.3f (want > 0.8), wall alpha %.3f (want < 0.2)", a, b)
		}
	})

	t.Run("cancelled before the call", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		out, err := br.RemoveBackground(ctx, src)
		if !errors.Is(err, context.Canceled) || out != nil {
			t.Fatalf("got %v, %v; want context.Canceled", out, err)
		}
	})

	t.Run("cancelled during the call", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		out, err := br.RemoveBackground(ctx, &cancelOnRead{Image: src, cancel: cancel})
		if !errors.Is(err, context.Canceled) || out != nil {
			t.Fatalf("got %v, %v; want context.Canceled", out, err)
		}
	})

	t.Run("empty image", func(t *testing.T) {
		for _, img := range []image.Image{nil, image.NewNRGBA(image.Rect(0, 0, 0, 7))} {
			_, err := br.RemoveBackground(context.Background(), img)
			var ie *engine.InputError
			if !errors.As(err, &ie) || ie.Param != "image" {
				t.Fatalf("got %v, want an InputError on image", err)
			}
		}
	})

	t.Run("concurrent callers", func(t *testing.T) {
		if reference == nil {
			t.Fatal("no serial result to compare with: the png subtest failed")
		}
		br2 := loadISNet(t, rt, map[string]string{"concurrency": "2"})
		const callers = 3
		outs := make([]*image.NRGBA, callers)
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() { outs[i], errs[i] = br2.RemoveBackground(context.Background(), src) })
		}
		wg.Wait()
		for i := range callers {
			if errs[i] != nil {
				t.Fatalf("caller %d: %v", i, errs[i])
			}
			if d := maxAlphaDiff(reference, outs[i]); d > 2 {
				t.Fatalf("caller %d: alpha differs from the serial result by up to %d", i, d)
			}
		}
	})
}

func maxAlphaDiff(a, b *image.NRGBA) int {
	m := 0
	for i := 3; i < len(a.Pix); i += 4 {
		d := int(a.Pix[i]) - int(b.Pix[i])
		m = max(m, d, -d)
	}
	return m
}

func TestISNetClose(t *testing.T) {
	rt := onnxtest.Runtime(t)
	br, err := rt.LoadBackgroundRemover(isnetSpec(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if err := br.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := br.RemoveBackground(context.Background(), image.NewNRGBA(image.Rect(0, 0, 4, 4))); err == nil {
		t.Fatal("closed engine ran")
	}
}

func TestISNetLoadErrors(t *testing.T) {
	rt := onnxtest.Runtime(t)
	cases := []struct {
		name string
		edit func(*engine.Spec)
		msg  string
	}{
		{"no model file named", func(s *engine.Spec) { s.Files = nil }, `no "model" file`},
		{"missing model file", func(s *engine.Spec) { s.Files = map[string]string{"model": "absent.onnx"} }, "absent.onnx"},
		{"input_size not a number", func(s *engine.Spec) { s.Options = map[string]string{"input_size": "big"} }, "input_size"},
		{"input_size out of range", func(s *engine.Spec) { s.Options = map[string]string{"input_size": "8"} }, "input_size"},
		{"input_size against a static model", func(s *engine.Spec) { s.Options = map[string]string{"input_size": "512"} }, "input_size is 512"},
		{"concurrency zero", func(s *engine.Spec) { s.Options = map[string]string{"concurrency": "0"} }, "concurrency"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := isnetSpec(t, nil)
			c.edit(&spec)
			br, err := rt.LoadBackgroundRemover(spec)
			if err == nil {
				br.Close()
				t.Fatal("loaded")
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q does not mention %q", err, c.msg)
			}
		})
	}
}

// BenchmarkISNet measures one background removal of video-001.png (150x103
// upscaled to the model's 1024x1024), pre- and post-processing included.
func BenchmarkISNet(b *testing.B) {
	rt := onnxtest.Runtime(b)
	br := loadISNet(b, rt, nil)
	src := photo(b)
	ctx := context.Background()
	for b.Loop() {
		if _, err := br.RemoveBackground(ctx, src); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/op")
}

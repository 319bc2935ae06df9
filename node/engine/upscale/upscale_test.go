package upscale

import (
	"context"
	"errors"
	"image"
	"image/color"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
	xdraw "golang.org/x/image/draw"
)

// TestConverterParity runs the converted x2 and x4 models on a 12×12 crop
// and compares with testdata/ref_x*.f32, computed by the numpy
// re-implementation of the Keras layers in testdata/keras_ref.py.
func TestConverterParity(t *testing.T) {
	e := loadThick(t, nil)
	in := readF32(t, "ref_input.f32")
	for _, s := range []int{2, 4} {
		want := readF32(t, "ref_x"+string(rune('0'+s))+".f32")
		got, err := e.run(context.Background(), e.models[s], in, 12, 12)
		if err != nil {
			t.Fatalf("x%d: %v", s, err)
		}
		if len(got) != len(want) {
			t.Fatalf("x%d: %d values, want %d", s, len(got), len(want))
		}
		var worst float64
		for i := range got {
			worst = max(worst, math.Abs(float64(got[i]-want[i])))
		}
		t.Logf("x%d: max |onnx - numpy| = %.2e (0..1 scale)", s, worst)
		if worst > 1e-4 {
			t.Errorf("x%d: converted model differs from the Keras reference by %.2e", s, worst)
		}
	}
}

// TestBeatsBicubic shrinks a 256×256 crop of the astronaut's face by 2 and
// by 4 (box filter), upscales it back and compares with the original.
func TestBeatsBicubic(t *testing.T) {
	e := loadThick(t, nil)
	hr := readPhoto(t, image.Rect(128, 40, 384, 296))
	for _, s := range []int{2, 4} {
		lr := boxDown(hr, s)
		sr, err := e.Upscale(context.Background(), lr, s)
		if err != nil {
			t.Fatalf("x%d: %v", s, err)
		}
		if sr.Rect.Size() != hr.Rect.Size() {
			t.Fatalf("x%d: output %v, want %v", s, sr.Rect.Size(), hr.Rect.Size())
		}
		pm, pb := psnr(t, sr, hr), psnr(t, bicubic(lr, 256, 256), hr)
		t.Logf("x%d: PSNR model %.2f dB, bicubic %.2f dB", s, pm, pb)
		if pm <= pb {
			t.Errorf("x%d: model PSNR %.2f dB is not above bicubic's %.2f dB", s, pm, pb)
		}
	}
}

// TestTiledMatchesUntiled forces 40-pixel tiles (2×2 tiles, 16 overlap) on
// a 64×64 input at x4 and compares with the single-tile run.
func TestTiledMatchesUntiled(t *testing.T) {
	e := loadThick(t, nil)
	lr := boxDown(readPhoto(t, image.Rect(128, 40, 384, 296)), 4)
	m := e.models[4]
	whole, err := e.upscale(context.Background(), m, lr, 64)
	if err != nil {
		t.Fatal(err)
	}
	tiled, err := e.upscale(context.Background(), m, lr, 40)
	if err != nil {
		t.Fatal(err)
	}
	maxd, mean := diff(t, whole, tiled)
	t.Logf("x4 tiled (40px, overlap 16) vs whole: max |diff| %d, mean %.3f (0..255)", maxd, mean)
	if maxd > 4 || mean > 0.1 {
		t.Errorf("tiled output differs from the whole-image run: max %d, mean %.3f", maxd, mean)
	}
	// No seam: along the blended band the tiled image is as close to
	// the whole-image run as elsewhere (no line of larger error).
	band := seamError(whole, tiled, 24*4, 40*4)
	t.Logf("mean |diff| inside the overlap band: %.3f", band)
	if band > 0.3 {
		t.Errorf("seam: mean |diff| %.3f in the overlap band", band)
	}
}

// seamError is the mean absolute RGB difference over columns [x0, x1).
func seamError(a, b *image.NRGBA, x0, x1 int) float64 {
	sum, n := 0, 0
	for y := range a.Rect.Dy() {
		for x := x0; x < x1; x++ {
			for c := range 3 {
				d := int(a.Pix[y*a.Stride+4*x+c]) - int(b.Pix[y*b.Stride+4*x+c])
				sum += max(d, -d)
				n++
			}
		}
	}
	return float64(sum) / float64(n)
}

// tinySpec is the Real-ESRGAN style stand-in testdata/tiny_nchw_x2.onnx
// ([1,3,H,W] → [1,3,2H,2W], out = nearest(x)²), loaded as a user's export
// would be: one "model" file with the option scale.
func tinySpec(opts map[string]string) engine.Spec {
	dir, _ := filepath.Abs("testdata")
	o := map[string]string{"scale": "2"}
	for k, v := range opts {
		o[k] = v
	}
	return engine.Spec{ID: "onnx/tiny/nchw-x2", Task: engine.TaskImageUpscale, Dir: dir,
		Files: map[string]string{"model": "tiny_nchw_x2.onnx"}, Options: o}
}

func randomImage(w, h int, seed uint64) *image.NRGBA {
	r := rand.New(rand.NewPCG(seed, 7))
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = uint8(r.IntN(256))
	}
	for y := range h {
		for x := range w {
			img.Pix[y*img.Stride+4*x+3] = uint8(255 * x / (w - 1))
		}
	}
	return img
}

// TestRealESRGANLayout checks the NCHW path end to end against the known
// function of the stand-in model, untiled and tiled, in both input ranges,
// and that the alpha channel is the bicubic upscale of the input's.
func TestRealESRGANLayout(t *testing.T) {
	rt := onnxtest.Runtime(t)
	src := randomImage(37, 23, 1)
	for _, tc := range []struct {
		rng  string
		tile string
		want func(v float64) float64
	}{
		{"1", "128", func(v float64) float64 { return v * v / 255 }},
		{"1", "16", func(v float64) float64 { return v * v / 255 }},
		{"1", "12", func(v float64) float64 { return v * v / 255 }},
		{"255", "128", func(v float64) float64 { return math.Min(v*v, 255) }},
	} {
		e, err := LoadUpscaler(rt, tinySpec(map[string]string{"input_range": tc.rng, "tile": tc.tile, "overlap": "4"}))
		if err != nil {
			t.Fatal(err)
		}
		if s := e.Scales(); len(s) != 1 || s[0] != 2 {
			t.Fatalf("scales %v, want [2]", s)
		}
		out, err := e.Upscale(context.Background(), src, 2)
		if err != nil {
			t.Fatal(err)
		}
		if out.Rect.Dx() != 74 || out.Rect.Dy() != 46 {
			t.Fatalf("output %v, want 74x46", out.Rect)
		}
		bad := 0
		for y := range 46 {
			for x := range 74 {
				for c := range 3 {
					v := float64(src.Pix[(y/2)*src.Stride+4*(x/2)+c])
					got := float64(out.Pix[y*out.Stride+4*x+c])
					if math.Abs(got-tc.want(v)) > 1 {
						bad++
					}
				}
			}
		}
		if bad > 0 {
			t.Errorf("range %s tile %s: %d channel values differ from the model's function", tc.rng, tc.tile, bad)
		}
		alpha := bicubic(alphaOnly(src), 74, 46)
		for i := 3; i < len(out.Pix); i += 4 {
			if out.Pix[i] != alpha.Pix[i-3] {
				t.Fatalf("alpha at byte %d is %d, want the bicubic %d", i, out.Pix[i], alpha.Pix[i-3])
			}
		}
		_ = e.Close()
	}
}

// alphaOnly returns an opaque image whose red channel is src's alpha.
func alphaOnly(src *image.NRGBA) *image.NRGBA {
	a := image.NewNRGBA(src.Rect)
	for i := 0; i < len(src.Pix); i += 4 {
		a.Pix[i], a.Pix[i+3] = src.Pix[i+3], 255
	}
	return a
}

// TestErrors covers the caller errors and cancellation.
func TestErrors(t *testing.T) {
	e, err := LoadUpscaler(onnxtest.Runtime(t), tinySpec(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	small := image.NewNRGBA(image.Rect(0, 0, 8, 8))
	var ie *engine.InputError
	if _, err := e.Upscale(context.Background(), small, 4); !errors.As(err, &ie) || ie.Param != "upscale_factor" {
		t.Errorf("scale 4 on an x2 model: %v, want an InputError on upscale_factor", err)
	}
	big := image.NewUniform(color.White)
	if _, err := e.Upscale(context.Background(), &bounded{big, image.Rect(0, 0, MaxOutputSide/2+1, 10)}, 2); !errors.As(err, &ie) || ie.Param != "image" {
		t.Errorf("oversized image: %v, want an InputError on image", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.Upscale(ctx, small, 2); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want context.Canceled", err)
	}
	if _, err := LoadUpscaler(onnxtest.Runtime(t), engine.Spec{ID: "x", Task: engine.TaskEmbeddings}); err == nil {
		t.Error("a spec of another task loaded")
	}
}

// bounded gives an image.Image of any bounds without allocating pixels.
type bounded struct {
	image.Image
	r image.Rectangle
}

func (b *bounded) Bounds() image.Rectangle { return b.r }

// TestSpans checks the tile plan: coverage, minimum overlap, even spread.
func TestSpans(t *testing.T) {
	for _, c := range []struct{ n, tile, ov int }{{64, 64, 16}, {65, 64, 16}, {500, 128, 16}, {129, 128, 16}, {1000, 40, 16}} {
		s := spans(c.n, c.tile, c.ov)
		if s[0] != 0 || s[len(s)-1]+min(c.tile, c.n) != c.n {
			t.Errorf("%v: spans %v do not cover", c, s)
		}
		for i := 1; i < len(s); i++ {
			if s[i-1]+c.tile-s[i] < c.ov {
				t.Errorf("%v: spans %v overlap less than %d", c, s, c.ov)
			}
		}
	}
}

// bicubic returns img resized to w×h with Catmull-Rom (bicubic)
// resampling: the baseline an upscaling model should beat.
func bicubic(img image.Image, w, h int) *image.NRGBA {
	dst := image.NewNRGBA(image.Rect(0, 0, w, h))
	xdraw.CatmullRom.Scale(dst, dst.Rect, img, img.Bounds(), xdraw.Src, nil)
	return dst
}

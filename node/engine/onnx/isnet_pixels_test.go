package onnx

import (
	"image"
	"image/color"
	"image/color/palette"
	"image/draw"
	"math"
	"testing"
)

// sample is a small image with varied colours and alpha, origin off (0,0).
func pixelSample() *image.NRGBA {
	img := image.NewNRGBA(image.Rect(3, -2, 3+17, -2+11))
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			i := (x - b.Min.X) + (y-b.Min.Y)*b.Dx()
			img.SetNRGBA(x, y, color.NRGBA{uint8(i * 7), uint8(i * 13), uint8(255 - i*3), uint8(i*37 + 1)})
		}
	}
	return img
}

func opaqueCopy(src *image.NRGBA) *image.NRGBA {
	o := image.NewNRGBA(src.Bounds())
	copy(o.Pix, src.Pix)
	for i := 3; i < len(o.Pix); i += 4 {
		o.Pix[i] = 0xff
	}
	return o
}

func TestToNRGBA(t *testing.T) {
	src := pixelSample()
	b := src.Bounds()
	rgba := image.NewRGBA(b)
	draw.Draw(rgba, b, src, b.Min, draw.Src)
	ycc := image.NewYCbCr(b, image.YCbCrSubsampleRatio420)
	gray := image.NewGray(b)
	pal := image.NewPaletted(b, palette.WebSafe)
	n64 := image.NewNRGBA64(b)
	cmyk := image.NewCMYK(b)
	op := opaqueCopy(src)
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			c := op.NRGBAAt(x, y)
			yy, cb, cr := color.RGBToYCbCr(c.R, c.G, c.B)
			ycc.Y[ycc.YOffset(x, y)] = yy
			ycc.Cb[ycc.COffset(x, y)] = cb
			ycc.Cr[ycc.COffset(x, y)] = cr
			gray.Set(x, y, c)
			pal.Set(x, y, c)
			n64.Set(x, y, src.At(x, y))
			cmyk.Set(x, y, c)
		}
	}
	sub := image.Rect(b.Min.X+2, b.Min.Y+3, b.Max.X-1, b.Max.Y-2)
	cases := []struct {
		name      string
		img       image.Image
		tolerance int
	}{
		{"nrgba", src, 0},
		{"nrgba sub-image", src.SubImage(sub), 0},
		{"rgba", rgba, 1},
		{"rgba sub-image", rgba.SubImage(sub), 1},
		{"ycbcr 4:2:0", ycc, 1},
		{"ycbcr sub-image", ycc.SubImage(sub), 1},
		{"gray", gray, 0},
		{"paletted", pal, 0},
		{"paletted sub-image", pal.SubImage(sub), 0},
		{"nrgba64 (generic path)", n64, 0},
		{"cmyk (generic path)", cmyk, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := toNRGBA(c.img)
			ib := c.img.Bounds()
			if got.Rect != image.Rect(0, 0, ib.Dx(), ib.Dy()) {
				t.Fatalf("rect %v, want %v at the origin", got.Rect, ib.Size())
			}
			for y := range ib.Dy() {
				for x := range ib.Dx() {
					want := color.NRGBAModel.Convert(c.img.At(ib.Min.X+x, ib.Min.Y+y)).(color.NRGBA)
					g := got.NRGBAAt(x, y)
					if g.A != want.A {
						t.Fatalf("(%d,%d): alpha %d, want %d", x, y, g.A, want.A)
					}
					if want.A == 0 {
						continue
					}
					for _, d := range []int{int(g.R) - int(want.R), int(g.G) - int(want.G), int(g.B) - int(want.B)} {
						if d > c.tolerance || -d > c.tolerance {
							t.Fatalf("(%d,%d): %v, want %v (tolerance %d)", x, y, g, want, c.tolerance)
						}
					}
				}
			}
		})
	}
}

func TestBilinearAxis(t *testing.T) {
	cases := []struct {
		dst, src int
		i0, i1   []int
		w        []float32
	}{
		{4, 4, []int{0, 1, 2, 3}, []int{1, 2, 3, 3}, []float32{0, 0, 0, 0}},
		{2, 4, []int{0, 2}, []int{1, 3}, []float32{0.5, 0.5}},
		{4, 2, []int{0, 0, 0, 1}, []int{1, 1, 1, 1}, []float32{0, 0.25, 0.75, 0}},
		{3, 1, []int{0, 0, 0}, []int{0, 0, 0}, []float32{0, 0, 0}},
	}
	for _, c := range cases {
		a := bilinearAxis(c.dst, c.src)
		for i := range c.dst {
			if a.i0[i] != c.i0[i] || a.i1[i] != c.i1[i] || a.w[i] != c.w[i] {
				t.Fatalf("bilinearAxis(%d, %d)[%d] = (%d, %d, %g), want (%d, %d, %g)",
					c.dst, c.src, i, a.i0[i], a.i1[i], a.w[i], c.i0[i], c.i1[i], c.w[i])
			}
		}
	}
}

func isnetNorm(v float64) float32 { return float32((v - 128) / 256) }

func TestResizeToCHW(t *testing.T) {
	t.Run("same size is a planar copy", func(t *testing.T) {
		src := toNRGBA(pixelSample().SubImage(image.Rect(3, -2, 14, 9)))
		const s = 11
		dst := make([]float32, 3*s*s)
		resizeToCHW(src, s, dst)
		for y := range s {
			for x := range s {
				c := src.NRGBAAt(x, y)
				for ch, v := range []uint8{c.R, c.G, c.B} {
					if got := dst[ch*s*s+y*s+x]; got != isnetNorm(float64(v)) {
						t.Fatalf("(%d,%d) channel %d: %g, want %g", x, y, ch, got, isnetNorm(float64(v)))
					}
				}
			}
		}
	})
	t.Run("upscale interpolates between pixel centres", func(t *testing.T) {
		src := image.NewNRGBA(image.Rect(0, 0, 2, 2))
		// Red varies along x, green along y, blue is constant.
		src.SetNRGBA(0, 0, color.NRGBA{0, 0, 40, 255})
		src.SetNRGBA(1, 0, color.NRGBA{255, 0, 40, 255})
		src.SetNRGBA(0, 1, color.NRGBA{0, 200, 40, 255})
		src.SetNRGBA(1, 1, color.NRGBA{255, 200, 40, 255})
		const s = 4
		dst := make([]float32, 3*s*s)
		resizeToCHW(src, s, dst)
		ramp := []float64{0, 0.25, 0.75, 1}
		for y := range s {
			for x := range s {
				want := [3]float32{isnetNorm(255 * ramp[x]), isnetNorm(200 * ramp[y]), isnetNorm(40)}
				for ch := range 3 {
					if got := dst[ch*s*s+y*s+x]; math.Abs(float64(got-want[ch])) > 1e-6 {
						t.Fatalf("(%d,%d) channel %d: %g, want %g", x, y, ch, got, want[ch])
					}
				}
			}
		}
	})
}

func TestApplyMask(t *testing.T) {
	t.Run("same size scales alpha and clamps", func(t *testing.T) {
		img := image.NewNRGBA(image.Rect(0, 0, 2, 2))
		for i := range img.Pix {
			img.Pix[i] = 0xff
		}
		img.Pix[4*3+3] = 128 // bottom-right pixel half transparent already
		applyMask(img, []float32{-0.5, 1.5, 0.5, 1}, 2)
		want := []uint8{0, 255, 128, 128}
		for i, w := range want {
			if got := img.Pix[4*i+3]; got != w {
				t.Fatalf("pixel %d alpha %d, want %d", i, got, w)
			}
			if img.Pix[4*i] != 0xff || img.Pix[4*i+1] != 0xff || img.Pix[4*i+2] != 0xff {
				t.Fatalf("pixel %d colour changed: %v", i, img.Pix[4*i:4*i+3])
			}
		}
	})
	t.Run("downscale averages", func(t *testing.T) {
		img := image.NewNRGBA(image.Rect(0, 0, 1, 2))
		for i := range img.Pix {
			img.Pix[i] = 0xff
		}
		// 2x2 mask onto 1x2: each output samples the middle of a mask row.
		applyMask(img, []float32{0, 1, 0.2, 0.6}, 2)
		if a, b := img.Pix[3], img.Pix[7]; a != 128 || b != 102 {
			t.Fatalf("alphas %d, %d; want 128, 102", a, b)
		}
	})
}

func bigTestPhoto(w, h int) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = uint8(i * 31)
	}
	return img
}

// BenchmarkResizeToCHW measures preprocessing of a 12 MP photo.
func BenchmarkResizeToCHW(b *testing.B) {
	src := bigTestPhoto(4000, 3000)
	dst := make([]float32, 3*1024*1024)
	for b.Loop() {
		resizeToCHW(src, 1024, dst)
	}
}

// BenchmarkApplyMask measures resizing a mask back onto a 12 MP photo.
func BenchmarkApplyMask(b *testing.B) {
	img := bigTestPhoto(4000, 3000)
	mask := make([]float32, 1024*1024)
	for i := range mask {
		mask[i] = float32(i%1024) / 1024
	}
	for b.Loop() {
		applyMask(img, mask, 1024)
	}
}

// BenchmarkToNRGBAYCbCr measures converting a 12 MP JPEG-decoded image.
func BenchmarkToNRGBAYCbCr(b *testing.B) {
	img := image.NewYCbCr(image.Rect(0, 0, 4000, 3000), image.YCbCrSubsampleRatio420)
	for b.Loop() {
		toNRGBA(img)
	}
}

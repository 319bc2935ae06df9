package vision

import (
	"image"
	"image/color"
	"math"
	"runtime"
	"sort"
	"sync/atomic"
	"testing"
)

// testPattern is a w x h RGBA image with distinct, smooth-ish channel values.
func testPattern(w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.SetRGBA(x, y, color.RGBA{uint8(x * 7 % 256), uint8(y * 5 % 256), uint8((x + y) * 3 % 256), 255})
		}
	}
	return img
}

func TestResampleWindowIdentityAndScale(t *testing.T) {
	img := testPattern(13, 9)
	dst := make([]float32, 13*9*3)
	resampleWindow(img, 0, 0, 13, 9, 13, 9, dst, 2, -1)
	for y := range 9 {
		for x := range 13 {
			c := img.RGBAAt(x, y)
			for k, v := range []uint8{c.R, c.G, c.B} {
				if got, want := dst[(y*13+x)*3+k], float32(v)*2-1; math.Abs(float64(got-want)) > 1e-3 {
					t.Fatalf("(%d,%d,%d) = %v, want %v", x, y, k, got, want)
				}
			}
		}
	}
	// Shrinking a uniform image keeps its value; shrinking 2:1 averages pairs.
	flat := image.NewRGBA(image.Rect(0, 0, 40, 30))
	for i := range flat.Pix {
		flat.Pix[i] = 200
	}
	small := make([]float32, 7*5*3)
	resampleWindow(flat, 0, 0, 40, 30, 7, 5, small, 1, 0)
	for i, v := range small {
		if math.Abs(float64(v-200)) > 1e-3 {
			t.Fatalf("uniform shrink: value %d = %v, want 200", i, v)
		}
	}
	stripes := image.NewRGBA(image.Rect(0, 0, 8, 1))
	for x := range 8 {
		v := uint8(0)
		if x%2 == 1 {
			v = 100
		}
		stripes.SetRGBA(x, 0, color.RGBA{v, v, v, 255})
	}
	half := make([]float32, 4*1*3)
	resampleWindow(stripes, 0, 0, 8, 1, 4, 1, half, 1, 0)
	// Inner pixels average their four taps to exactly 50 (plain bilinear
	// sampling would alias to 0 or 100); the edge pixels lose a tap outside
	// the image and renormalise (43 and 57).
	for i, v := range half {
		want, tol := 50.0, 1e-3
		if i < 3 || i >= 9 {
			tol = 8
		}
		if math.Abs(float64(v)-want) > tol {
			t.Fatalf("2:1 shrink of 0/100 stripes: value %d = %v, want %v +- %v", i, v, want, tol)
		}
	}
}

func TestResampleWindowLetterbox(t *testing.T) {
	// A 4x2 white image letterboxed into a 4x4 square: the top and bottom
	// rows are black bars, the middle rows white.
	img := image.NewRGBA(image.Rect(0, 0, 4, 2))
	for i := range img.Pix {
		img.Pix[i] = 255
	}
	dst := make([]float32, 4*4*3)
	resampleWindow(img, 0, -1, 4, 4, 4, 4, dst, 1/127.5, -1)
	for y := range 4 {
		want := float32(1)
		if y == 0 || y == 3 {
			want = -1
		}
		for x := range 4 {
			if got := dst[(y*4+x)*3]; math.Abs(float64(got-want)) > 1e-4 {
				t.Errorf("row %d col %d = %v, want %v", y, x, got, want)
			}
		}
	}
}

func TestRotatedCrop(t *testing.T) {
	img := testPattern(6, 6)
	same := make([]float32, 6*6*3)
	rotatedCrop(img, 3, 3, 6, 0, 6, same, 1, 0)
	turned := make([]float32, 6*6*3)
	rotatedCrop(img, 3, 3, 6, math.Pi, 6, turned, 1, 0)
	for y := range 6 {
		for x := range 6 {
			c := img.RGBAAt(x, y)
			if got := same[(y*6+x)*3]; math.Abs(float64(got)-float64(c.R)) > 1e-3 {
				t.Fatalf("angle 0 at (%d,%d): %v, want %v", x, y, got, c.R)
			}
			// A half turn maps (x, y) to (5-x, 5-y).
			if got := turned[((5-y)*6+5-x)*3+1]; math.Abs(float64(got)-float64(c.G)) > 1e-3 {
				t.Fatalf("angle pi at (%d,%d): %v, want %v", 5-x, 5-y, got, c.G)
			}
		}
	}
	// Outside the image is black.
	out := make([]float32, 2*2*3)
	rotatedCrop(img, -10, -10, 2, 0.3, 2, out, 1, 0)
	for _, v := range out {
		if v != 0 {
			t.Fatalf("crop outside the image: %v, want black", out)
		}
	}
}

func TestNMS(t *testing.T) {
	cands := []candidate{
		{class: 0, score: 0.9, box: [4]float32{0, 0, 10, 10}},
		{class: 0, score: 0.8, box: [4]float32{1, 1, 11, 11}},  // same class, IoU 0.68: dropped
		{class: 1, score: 0.7, box: [4]float32{1, 1, 11, 11}},  // other class: kept
		{class: 0, score: 0.6, box: [4]float32{20, 0, 30, 10}}, // apart: kept
	}
	keep := nmsClasswise(cands, 0.4, 10)
	if len(keep) != 3 || keep[0].score != 0.9 || keep[1].class != 1 || keep[2].score != 0.6 {
		t.Errorf("nmsClasswise = %+v", keep)
	}
	if got := nmsClasswise(cands, 0.4, 2); len(got) != 2 {
		t.Errorf("limit 2: %d kept", len(got))
	}
	faces := []rawFace{
		{score: 0.9, box: [4]float32{0, 0, 1, 1}},
		{score: 0.3, box: [4]float32{0.1, 0.1, 1.1, 1.1}},
		{score: 0.2, box: [4]float32{5, 5, 6, 6}},
	}
	merged := weightedNMS(faces, 0.3, 10)
	if len(merged) != 2 || merged[0].score != 0.9 || merged[1].score != 0.2 {
		t.Fatalf("weightedNMS = %+v", merged)
	}
	// Weighted mean: (0.9*0 + 0.3*0.1) / 1.2 = 0.025.
	if math.Abs(float64(merged[0].box[0])-0.025) > 1e-6 || math.Abs(float64(merged[0].box[2])-1.025) > 1e-6 {
		t.Errorf("merged box %v, want x from 0.025 to 1.025", merged[0].box)
	}
	if got := weightedNMS(faces, 0.3, 1); len(got) != 1 {
		t.Errorf("limit 1: %d faces", len(got))
	}
}

// TestResampleWindowMatchesReference: the banded C resampler gives
// bit-identical output to the plain two-pass Go one, for shrinking,
// enlarging, letterbox windows reaching outside the image and sub-images.
func TestResampleWindowMatchesReference(t *testing.T) {
	big := testPattern(640, 480)
	for _, c := range []struct {
		src            *image.RGBA
		x0, y0, sw, sh float64
		dw, dh         int
	}{
		{big, 0, 0, 640, 480, 512, 512},
		{big, 0, -80, 640, 640, 128, 128},
		{big, 0, -80, 640, 640, 256, 256},
		{big, 0, 0, 640, 480, 960, 720},
		{big, 100.5, 50.25, 33, 47, 48, 200},
		{big, -700, 0, 300, 300, 16, 16}, // window wholly off the image
		{testPattern(13, 9), 0, 0, 13, 9, 13, 9},
		{toRGBA(big.SubImage(image.Rect(17, 33, 400, 300))), 0, 0, 383, 267, 200, 300},
	} {
		got := make([]float32, c.dw*c.dh*3)
		want := make([]float32, c.dw*c.dh*3)
		resampleWindow(c.src, c.x0, c.y0, c.sw, c.sh, c.dw, c.dh, got, 1/127.5, -1)
		refResampleWindow(c.src, c.x0, c.y0, c.sw, c.sh, c.dw, c.dh, want, 1/127.5, -1)
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%v %v,%v %vx%v -> %dx%d: value %d = %v, want %v", c.src.Rect, c.x0, c.y0, c.sw, c.sh, c.dw, c.dh, i, got[i], want[i])
			}
		}
	}
}

// TestToRGBAView: an RGBA sub-image is read in place with its origin moved
// to (0, 0); other types are converted with premultiplied alpha.
func TestToRGBAView(t *testing.T) {
	img := testPattern(20, 10)
	sub := img.SubImage(image.Rect(5, 3, 15, 9)).(*image.RGBA)
	v := toRGBA(sub)
	if v.Rect != image.Rect(0, 0, 10, 6) || &v.Pix[0] != &img.Pix[img.PixOffset(5, 3)] {
		t.Fatalf("view %v is not in place", v.Rect)
	}
	if v.RGBAAt(2, 1) != img.RGBAAt(7, 4) {
		t.Fatalf("view pixel %v, want %v", v.RGBAAt(2, 1), img.RGBAAt(7, 4))
	}
	n := image.NewNRGBA(image.Rect(0, 0, 300, 300))
	for i := 0; i < len(n.Pix); i += 4 {
		n.Pix[i], n.Pix[i+1], n.Pix[i+2], n.Pix[i+3] = 200, 100, 50, 128
	}
	c := toRGBA(n)
	if got := c.RGBAAt(299, 299); got != (color.RGBA{100, 50, 25, 128}) {
		t.Fatalf("converted NRGBA pixel %v", got)
	}
}

// refTaps and refResampleWindow are the straightforward resampler the
// optimised one must match exactly.
//
// refTaps holds, for each output index along one axis, the first source
// index and the weights of the source pixels it reads (stride n).
type refTaps struct {
	first []int
	w     []float32
	n     int
}

// refTriangleTaps maps dstLen output pixels onto the source window [x0, x0 +
// span) of an axis with srcLen pixels: output pixel i's centre falls on
// source coordinate x0 + (i + 0.5) * span / dstLen. The filter is a
// triangle (bilinear) whose support widens with the down-scaling factor, as
// PIL's BILINEAR resize does, so shrinking averages every source pixel
// instead of aliasing. The window is a canvas holding the image: taps
// outside the window are dropped and the rest renormalised (as at the edges
// of any resize), while taps inside the window but outside [0, srcLen) are
// black canvas: their weight stays in the normalisation but they add
// nothing.
func refTriangleTaps(dstLen, srcLen int, x0, span float64) refTaps {
	scale := span / float64(dstLen)
	support := math.Max(scale, 1)
	n := int(math.Ceil(support))*2 + 1
	t := refTaps{first: make([]int, dstLen), w: make([]float32, dstLen*n), n: n}
	ws := make([]float64, n)
	for i := range dstLen {
		c := x0 + (float64(i)+0.5)*scale
		lo := int(math.Floor(c - support))
		var total float64
		for k := range n {
			ws[k] = 0
			centre := float64(lo+k) + 0.5
			if centre < x0 || centre >= x0+span {
				continue
			}
			if d := math.Abs(centre-c) / support; d < 1 {
				ws[k] = 1 - d
				total += ws[k]
			}
		}
		// Keep the in-image taps, normalised by the whole canvas total.
		first := max(lo, 0)
		t.first[i] = first
		for k := range n {
			j := lo + k
			if j < 0 || j >= srcLen || total == 0 {
				continue
			}
			t.w[i*n+j-first] = float32(ws[k] / total)
		}
	}
	return t
}

// refResampleWindow resamples the source window (x0, y0, width sw, height sh;
// it may reach outside the image, where pixels are black) of src to dw x dh
// pixels, and writes them to dst as interleaved RGB (NHWC) float32 values
// v*mul + add, with v the 0..255 pixel value. Vertical pass first: for
// each output row, every source column is filtered over the rows the row
// reads, then each output pixel over the columns it reads; taps in
// increasing order, each product and sum rounded to float32 on its own
// (the explicit conversions keep Go from fusing multiply-adds where the
// CPU has them).
func refResampleWindow(src *image.RGBA, x0, y0, sw, sh float64, dw, dh int, dst []float32, mul, add float32) {
	w, h := src.Rect.Dx(), src.Rect.Dy()
	xt := refTriangleTaps(dw, w, x0, sw)
	yt := refTriangleTaps(dh, h, y0, sh)
	col := make([]float32, 3*w)
	for j := range dh {
		f := yt.first[j]
		for x := range w {
			for c := range 3 {
				var s float32
				for k, wt := range yt.w[j*yt.n : (j+1)*yt.n] {
					if wt == 0 || f+k >= h {
						continue
					}
					s += float32(wt * float32(src.Pix[(f+k)*src.Stride+4*x+c]))
				}
				col[3*x+c] = s
			}
		}
		for i := range dw {
			f := xt.first[i]
			for c := range 3 {
				var s float32
				for k, wt := range xt.w[i*xt.n : (i+1)*xt.n] {
					if wt == 0 || f+k >= w {
						continue
					}
					s += float32(wt * col[3*(f+k)+c])
				}
				dst[(j*dw+i)*3+c] = float32(s*mul) + add
			}
		}
	}
}

// TestFillLetterboxMatchesReference: writing the resized image straight
// into the planes and painting only the margins gives the same tensor as
// painting the canvas and copying an interleaved resize into it, for
// Ultralytics' centred letterbox and SCRFD's top-left one.
func TestFillLetterboxMatchesReference(t *testing.T) {
	for _, c := range []struct {
		w, h, size int
		lb         letterbox
		pad, mul   float32
	}{
		{640, 480, 640, ultralyticsLetterbox(640, 480, 640), 114, 1.0 / 255},
		{300, 500, 320, ultralyticsLetterbox(300, 500, 320), 114, 1.0 / 255},
		{640, 480, 640, letterbox{r: 1, newW: 640, newH: 480}, 0, 1},
		{200, 100, 64, letterbox{r: 0.32, left: -3, top: 50, newW: 64, newH: 32}, 7, 2},
	} {
		src := testPattern(c.w, c.h)
		got := make([]float32, 3*c.size*c.size)
		want := make([]float32, 3*c.size*c.size)
		for i := range got {
			got[i] = -99 // every value must be written
		}
		fillLetterbox(src, c.lb, c.size, c.pad, c.mul, got)
		refFillLetterbox(src, c.lb, c.size, c.pad, c.mul, want)
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%dx%d in %d (%+v): value %d = %v, want %v", c.w, c.h, c.size, c.lb, i, got[i], want[i])
			}
		}
	}
}

// refFillLetterbox is the letterbox writer the direct one must match:
// it writes src letterboxed into dst, planar RGB (NCHW) of a
// size x size canvas, as v*mul with v the 0..255 value; pad is the canvas
// colour.
func refFillLetterbox(src *image.RGBA, lb letterbox, size int, pad, mul float32, dst []float32) {
	plane := size * size
	for i := range dst[:3*plane] {
		dst[i] = pad * mul
	}
	rgb := make([]float32, lb.newW*lb.newH*3)
	refResampleWindow(src, 0, 0, float64(src.Rect.Dx()), float64(src.Rect.Dy()), lb.newW, lb.newH, rgb, 1, 0)
	for y := range lb.newH {
		ty := y + lb.top
		if ty < 0 || ty >= size {
			continue
		}
		for x := range lb.newW {
			tx := x + lb.left
			if tx < 0 || tx >= size {
				continue
			}
			o, s := ty*size+tx, 3*(y*lb.newW+x)
			dst[o], dst[plane+o], dst[2*plane+o] = rgb[s]*mul, rgb[s+1]*mul, rgb[s+2]*mul
		}
	}
}

// TestByScoreDesc: the index sort orders as a stable sort by descending
// score does, ties included.
func TestByScoreDesc(t *testing.T) {
	xs := make([]candidate, 5000)
	for i := range xs {
		xs[i] = candidate{class: i, score: float32((i*7919)%97) / 97}
	}
	want := append([]candidate(nil), xs...)
	sort.SliceStable(want, func(a, b int) bool { return want[a].score > want[b].score })
	byScoreDesc(xs, func(c candidate) float32 { return c.score })
	for i := range xs {
		if xs[i] != want[i] {
			t.Fatalf("position %d: %+v, want %+v", i, xs[i], want[i])
		}
	}
}

// TestParallelRowsBands: the bands cover every row once, and band i starts
// at floor(rows*i/n), whose ceiling-inverse recovers i (as peaks uses).
func TestParallelRowsBands(t *testing.T) {
	for _, rows := range []int{1, 2, 3, 5, 7, 128, 131} {
		n := min(runtime.GOMAXPROCS(0), rows)
		seen := make([]int32, rows)
		starts := make(chan int, n)
		parallelRows(rows, 1<<30, func(y0, y1 int) {
			for y := y0; y < y1; y++ {
				atomic.AddInt32(&seen[y], 1)
			}
			starts <- y0
		})
		close(starts)
		for y0 := range starts {
			if i := (y0*n + rows - 1) / rows; rows*i/n != y0 {
				t.Errorf("rows %d: band at %d maps to %d", rows, y0, i)
			}
		}
		for y, c := range seen {
			if c != 1 {
				t.Fatalf("rows %d: row %d covered %d times", rows, y, c)
			}
		}
	}
}

// refRotatedCrop is rotatedCrop computed the plain way (every sample
// through the bounds-checked read, coordinates from scratch): the
// reference the fast path must match bit for bit.
func refRotatedCrop(src *image.RGBA, cx, cy, side, angle float64, size int, dst []float32, mul, add float32) {
	step := side / float64(size)
	k := max(1, int(math.Ceil(step)))
	cos, sin := math.Cos(angle), math.Sin(angle)
	w, h := src.Rect.Dx(), src.Rect.Dy()
	inv := 1 / float32(k*k)
	at := func(x, y int) (float32, float32, float32) {
		if x < 0 || y < 0 || x >= w || y >= h {
			return 0, 0, 0
		}
		p := src.Pix[y*src.Stride+4*x:]
		return float32(p[0]), float32(p[1]), float32(p[2])
	}
	for j := range size {
		for i := range size {
			var r, g, b float32
			for sj := range k {
				for si := range k {
					u := float64((float64(i)+(float64(si)+0.5)/float64(k))*step) - side/2
					v := float64((float64(j)+(float64(sj)+0.5)/float64(k))*step) - side/2
					x := cx + float64(u*cos) - float64(v*sin) - 0.5
					y := cy + float64(u*sin) + float64(v*cos) - 0.5
					x0, y0 := int(math.Floor(x)), int(math.Floor(y))
					fx, fy := float32(x-float64(x0)), float32(y-float64(y0))
					r00, g00, b00 := at(x0, y0)
					r10, g10, b10 := at(x0+1, y0)
					r01, g01, b01 := at(x0, y0+1)
					r11, g11, b11 := at(x0+1, y0+1)
					r += refBilerp(r00, r10, r01, r11, fx, fy)
					g += refBilerp(g00, g10, g01, g11, fx, fy)
					b += refBilerp(b00, b10, b01, b11, fx, fy)
				}
			}
			o := dst[(j*size+i)*3:]
			o[0] = float32(float32(r*inv)*mul) + add
			o[1] = float32(float32(g*inv)*mul) + add
			o[2] = float32(float32(b*inv)*mul) + add
		}
	}
}

// refBilerp is bilerp with every product rounded on its own.
func refBilerp(tl, tr, bl, br, fx, fy float32) float32 {
	top := tl + float32((tr-tl)*fx)
	bot := bl + float32((br-bl)*fx)
	return top + float32((bot-top)*fy)
}

// TestRotatedCropMatchesReference: the fast path (direct reads inside the
// image, precomputed offsets, bands on every core) gives exactly the
// reference's values, for crops inside, across the edge of and outside a
// photo, shrinking (supersampled) and enlarging, at several angles.
func TestRotatedCropMatchesReference(t *testing.T) {
	src := toRGBA(photo(t, "astronaut.png"))
	for _, c := range []struct{ cx, cy, side, angle float64 }{
		{260, 150, 200, 0}, {260, 150, 200, 0.05}, {260, 150, 420, -0.4}, {256.3, 140.7, 90, 2.5},
		{10, 500, 300, 0.3}, {-300, -300, 100, 1}, {500, 20, 700, math.Pi},
	} {
		got := make([]float32, faceResSize*faceResSize*3)
		want := make([]float32, faceResSize*faceResSize*3)
		rotatedCrop(src, c.cx, c.cy, c.side, c.angle, faceResSize, got, 1/127.5, -1)
		refRotatedCrop(src, c.cx, c.cy, c.side, c.angle, faceResSize, want, 1/127.5, -1)
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%+v: value %d = %v, want %v", c, i, got[i], want[i])
			}
		}
	}
}

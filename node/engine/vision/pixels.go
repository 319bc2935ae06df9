package vision

import (
	"image"
	"image/draw"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
)

// toRGBA returns img as an RGBA image with its origin at (0, 0). Alpha is
// premultiplied, so transparent pixels read as black: a transparent image is
// seen as composited over black. An *image.RGBA is used in place (a view of
// its pixels, no copy; the pipelines only read it); other types are
// converted, in bands on every core for very large images, with image/draw's fast
// paths for the decoders' outputs (YCbCr, Gray, NRGBA, Paletted).
func toRGBA(img image.Image) *image.RGBA {
	b := img.Bounds()
	if m, ok := img.(*image.RGBA); ok {
		if b.Empty() {
			return &image.RGBA{Rect: image.Rect(0, 0, b.Dx(), b.Dy())}
		}
		return &image.RGBA{Pix: m.Pix[m.PixOffset(b.Min.X, b.Min.Y):], Stride: m.Stride, Rect: image.Rect(0, 0, b.Dx(), b.Dy())}
	}
	dst := image.NewRGBA(image.Rect(0, 0, b.Dx(), b.Dy()))
	parallelRows(b.Dy(), b.Dx()*b.Dy(), func(y0, y1 int) {
		draw.Draw(dst, image.Rect(0, y0, b.Dx(), y1), img, image.Pt(b.Min.X, b.Min.Y+y0), draw.Src)
	})
	return dst
}

// parallelWork is the number of pixels below which parallelRows does not
// start goroutines. Bands on other cores cost the model run that follows
// them: with the 640x480 letterbox and face crop split over two cores, the
// BlazeFace run after them took 6.5-7.7 ms at the median against 5.4-6.0 ms
// back to back, and with them on the calling goroutine alone 6.0 against
// 6.0 (the C kernels take 0.3-0.4 ms on one core). Requests through the
// API went from 0.79-0.80 of the bare runs to 0.84-0.90 (faces) and from
// 0.86-0.89 to 0.89-0.96 (CenterNet; BenchmarkAPI*640, ratio-median). So only
// work the size of a multi-megapixel photo, where halving the kernels
// saves more than that, is split.
const parallelWork = 4 << 20

// parallelRows calls fn on consecutive bands [y0, y1) covering [0, rows),
// one band per available core when work (a pixel count) is large enough to
// pay for the goroutines (see parallelWork), and waits for them.
func parallelRows(rows, work int, fn func(y0, y1 int)) {
	n := min(runtime.GOMAXPROCS(0), rows)
	if n <= 1 || work < parallelWork {
		fn(0, rows)
		return
	}
	var wg sync.WaitGroup
	for i := range n {
		y0, y1 := rows*i/n, rows*(i+1)/n
		if i == n-1 {
			fn(y0, y1)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(y0, y1)
		}()
	}
	wg.Wait()
}

// filterTaps holds, for each output index along one axis, the first source
// index and the weights of the source pixels it reads: weights i*n to
// i*n+count[i] apply to source indices first[i], first[i]+1, ... (every one
// inside the image; zero weights at the ends are trimmed).
type filterTaps struct {
	first []int32
	count []int32
	w     []float32
	n     int
}

// span returns the source indices [lo, hi) some output index reads
// (lo == hi when none does).
func (t filterTaps) span() (lo, hi int) {
	lo, hi = math.MaxInt, 0
	for i, c := range t.count {
		if c > 0 {
			lo, hi = min(lo, int(t.first[i])), max(hi, int(t.first[i]+c))
		}
	}
	if lo >= hi {
		return 0, 0
	}
	return lo, hi
}

// triangleTaps maps dstLen output pixels onto the source window [x0, x0 +
// span) of an axis with srcLen pixels: output pixel i's centre falls on
// source coordinate x0 + (i + 0.5) * span / dstLen. The filter is a
// triangle (bilinear) whose support widens with the down-scaling factor, as
// PIL's BILINEAR resize does, so shrinking averages every source pixel
// instead of aliasing. The window is a canvas holding the image: taps
// outside the window are dropped and the rest renormalised (as at the edges
// of any resize), while taps inside the window but outside [0, srcLen) are
// black canvas: their weight stays in the normalisation but they add
// nothing.
func triangleTaps(dstLen, srcLen int, x0, span float64) filterTaps {
	scale := span / float64(dstLen)
	support := math.Max(scale, 1)
	n := int(math.Ceil(support))*2 + 1
	t := filterTaps{first: make([]int32, dstLen), count: make([]int32, dstLen), w: make([]float32, dstLen*n), n: n}
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
		// Keep the in-image taps with a weight, normalised by the whole
		// canvas total.
		first, last := -1, -1
		for k := range n {
			if j := lo + k; j >= 0 && j < srcLen && ws[k] > 0 && total > 0 {
				if first < 0 {
					first = j
				}
				last = j
			}
		}
		if first < 0 {
			t.first[i] = int32(min(max(lo, 0), max(srcLen-1, 0)))
			continue
		}
		t.first[i], t.count[i] = int32(first), int32(last-first+1)
		for j := first; j <= last; j++ {
			t.w[i*n+j-first] = float32(ws[j-lo] / total)
		}
	}
	return t
}

// bestLevel asks the C kernels for the best vector code this CPU runs
// (SSE2 or AVX2 on x86-64, plain C loops elsewhere); every level gives the
// same bits.
const bestLevel = -1

// flushRows is how many output rows resampleRows fills per C call before
// handing them to its flush function.
const flushRows = 8

// resampleWindow resamples the source window (x0, y0, width sw, height sh;
// it may reach outside the image, where pixels are black) of src to dw x dh
// pixels, and writes them to dst as interleaved RGB (NHWC) float32 values
// v*mul + add, with v the 0..255 pixel value.
func resampleWindow(src *image.RGBA, x0, y0, sw, sh float64, dw, dh int, dst []float32, mul, add float32) {
	resampleRows(src, x0, y0, sw, sh, dw, dh, mul, add, bestLevel, dst, nil)
}

// resampleRows is resampleWindow at a given vector level (bestLevel, or 0
// plain C, 1 SSE2, 2 AVX2: the tests compare them) writing the output rows
// (interleaved RGB, dw*3 values each) into dst, or, with a flush function,
// into a scratch band that flush(j, row) then stores row by row (dst is
// unused).
//
// The filter is separable and computed vertical pass first, in C
// (pixels.c): for each output row, the weighted sum of the source rows it
// reads over all the RGBA bytes of the columns in use (contiguous memory,
// one vector of 8 bytes-as-float32 a step), then each output pixel's
// horizontal taps over that row, one 4-lane (RGBA) vector a tap. Each
// product and sum is rounded in float32 on its own, taps in increasing
// order, so the result is exactly refResampleWindow's (pixels_test.go).
// The filter is the one triangleTaps describes; only the order of the two
// passes (hence the rounding) differs from the horizontal-first resampler
// this package had before. Output rows are split into bands over the
// cores, one C call per band (or per flushRows rows with flush).
func resampleRows(src *image.RGBA, x0, y0, sw, sh float64, dw, dh int, mul, add float32, level int,
	dst []float32, flush func(j int, row []float32)) {
	if dw <= 0 || dh <= 0 {
		return
	}
	xt, yt, cx0, cx1 := resamplePlan(src, x0, y0, sw, sh, dw, dh)
	parallelRows(dh, dw*dh+(cx1-cx0)*src.Rect.Dy()/2, func(j0, j1 int) {
		vrow := vrowFor(cx0, cx1)
		if flush == nil {
			resampleBand(src, cx0, cx1, &xt, &yt, j0, j1, mul, add, dst[j0*dw*3:j1*dw*3], vrow, level)
			return
		}
		band := make([]float32, min(flushRows, j1-j0)*dw*3)
		for j := j0; j < j1; j += flushRows {
			e := min(j+flushRows, j1)
			resampleBand(src, cx0, cx1, &xt, &yt, j, e, mul, add, band[:(e-j)*dw*3], vrow, level)
			for r := j; r < e; r++ {
				flush(r, band[(r-j)*dw*3:(r-j+1)*dw*3])
			}
		}
	})
}

// vrowFor is the scratch row resampleBand's vertical pass fills for the
// columns [cx0, cx1) (RGBA floats, one vector of slack).
func vrowFor(cx0, cx1 int) []float32 { return make([]float32, 4*(cx1-cx0)+4) }

// resamplePlan is the filter taps of a resize of src's window (x0, y0, sw,
// sh) to dw x dh and the columns [cx0, cx1) they read.
func resamplePlan(src *image.RGBA, x0, y0, sw, sh float64, dw, dh int) (xt, yt filterTaps, cx0, cx1 int) {
	w, h := src.Rect.Dx(), src.Rect.Dy()
	xt = triangleTaps(dw, w, x0, sw)
	yt = triangleTaps(dh, h, y0, sh)
	cx0, cx1 = xt.span()
	_, ry1 := yt.span()
	if ry1 > 0 && cx1 > 0 {
		// Rows the taps read: the image must hold them.
		_ = src.Pix[(ry1-1)*src.Stride+4*cx1-1]
	}
	return xt, yt, cx0, cx1
}

// rowStream is a JPEG its consumer decodes (imagecodec.Streamed, which
// engines taking streamed images get from the API): Decode decodes it on
// the calling goroutine into Buffer, row by row, and returns the picture
// (redone: not Buffer, libjpeg gave up on the file) or its error; Rows(n),
// on another goroutine meanwhile, waits until Buffer's first n rows are
// decoded (false: they never will be).
type rowStream interface {
	image.Image
	Decode() (img image.Image, redone bool, err error)
	Buffer() *image.RGBA
	Rows(n int) bool
}

// streamRows is how many output rows make one band of resampleImage's
// work on a stream.
const streamRows = 16

// resampleImage is resampleWindow on any image, and returns the picture as
// RGBA for the work after the resize. A rowStream is decoded on the
// calling goroutine while a helper goroutine computes each band of output
// rows as soon as the source rows it reads are decoded; bands the helper
// has not taken when the decode ends are computed here. Everything is
// computed again from the final picture when the decoder that finished is
// not the one whose rows the helper read. The calling goroutine never
// blocks on the helper (a band it waits for is being computed), so it
// stays on its thread for the model run that follows.
func resampleImage(img image.Image, x0, y0, sw, sh float64, dw, dh int, dst []float32, mul, add float32) (*image.RGBA, error) {
	st, ok := img.(rowStream)
	if !ok {
		src := toRGBA(img)
		resampleWindow(src, x0, y0, sw, sh, dw, dh, dst, mul, add)
		return src, nil
	}
	if dw <= 0 || dh <= 0 {
		final, _, err := st.Decode()
		if err != nil {
			return nil, err
		}
		return toRGBA(final), nil
	}
	buf := st.Buffer()
	xt, yt, cx0, cx1 := resamplePlan(buf, x0, y0, sw, sh, dw, dh)
	bands := int32((dh + streamRows - 1) / streamRows)
	var next, settled atomic.Int32 // bands taken, bands finished or given up
	var incomplete atomic.Bool     // a band was given up
	band := func(k int32, vrow []float32) {
		j, e := int(k)*streamRows, min(int(k+1)*streamRows, dh)
		resampleBand(buf, cx0, cx1, &xt, &yt, j, e, mul, add, dst[j*dw*3:e*dw*3], vrow, bestLevel)
	}
	go func() {
		vrow := vrowFor(cx0, cx1)
		for k := next.Add(1) - 1; k < bands; k = next.Add(1) - 1 {
			// Taps move down with the output row: the band's last row
			// reads the lowest source rows.
			last := min(int(k+1)*streamRows, dh) - 1
			if st.Rows(int(yt.first[last] + yt.count[last])) {
				band(k, vrow)
			} else {
				incomplete.Store(true)
			}
			settled.Add(1)
		}
	}()
	final, redone, err := st.Decode()
	vrow := vrowFor(cx0, cx1)
	for k := next.Add(1) - 1; k < bands; k = next.Add(1) - 1 {
		if err == nil && !redone {
			band(k, vrow)
		} else {
			incomplete.Store(true)
		}
		settled.Add(1)
	}
	// What is left is a band the helper is computing (or about to find
	// its rows for): spin, yielding only if it takes long (with one P the
	// helper needs this goroutine to let it run).
	for i := 0; settled.Load() < bands; i++ {
		if i > 1000 {
			runtime.Gosched()
		}
	}
	if err != nil {
		return nil, err
	}
	src := toRGBA(final)
	if redone || incomplete.Load() {
		resampleWindow(src, x0, y0, sw, sh, dw, dh, dst, mul, add)
	}
	return src, nil
}

// rotatedCrop samples a size x size square of src centred on (cx, cy), side
// pixels wide, rotated by angle radians (the crop's x axis points along
// (cos angle, sin angle) in the image), into dst as interleaved RGB float32
// values v*mul + add. Pixels outside the image are black. Each output pixel
// averages k x k bilinear samples, k the down-scaling factor rounded up, so
// large faces are not aliased.
func rotatedCrop(src *image.RGBA, cx, cy, side, angle float64, size int, dst []float32, mul, add float32) {
	rotatedCropLevel(src, cx, cy, side, angle, size, dst, mul, add, bestLevel)
}

// rotatedCropLevel is rotatedCrop at a given vector level. The sampling
// runs in C (pixels.c) in bands of rows over the cores, with float64
// coordinates and float32 bilinear sums in the order of refRotatedCrop
// (pixels_test.go), which it matches bit for bit; samples whose four
// neighbours are inside the image read them straight from the pixels.
func rotatedCropLevel(src *image.RGBA, cx, cy, side, angle float64, size int, dst []float32, mul, add float32, level int) {
	if size <= 0 {
		return
	}
	_ = dst[size*size*3-1]
	if w, h := src.Rect.Dx(), src.Rect.Dy(); w > 0 && h > 0 {
		_ = src.Pix[(h-1)*src.Stride+4*w-1] // the C reads pixels inside the image only
	}
	step := side / float64(size)
	k := max(1, int(math.Ceil(step)))
	cos, sin := math.Cos(angle), math.Sin(angle)
	// offs[i*k+s] is sub-sample s of output column (or row) i, in source
	// pixels from the crop centre before rotation.
	offs := make([]float64, size*k)
	for i := range size {
		for s := range k {
			offs[i*k+s] = float64((float64(i)+(float64(s)+0.5)/float64(k))*step) - side/2
		}
	}
	parallelRows(size, 4*size*size*k*k, func(j0, j1 int) {
		rotatedBand(src, cx, cy, cos, sin, offs, k, size, j0, j1, dst, mul, add, level)
	})
}

func bilerp(tl, tr, bl, br, fx, fy float32) float32 {
	top := tl + (tr-tl)*fx
	bot := bl + (br-bl)*fx
	return top + (bot-top)*fy
}

package vision

import (
	"image"
	"image/draw"
	"math"
	"runtime"
	"sync"
)

// toRGBA returns img as an RGBA image with its origin at (0, 0). Alpha is
// premultiplied, so transparent pixels read as black: a transparent image is
// seen as composited over black. An *image.RGBA is used in place (a view of
// its pixels, no copy; the pipelines only read it); other types are
// converted, in bands on every core for large images, with image/draw's fast
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

// byteFloats returns the table of float32(v) for every byte v: a lookup
// gives the same value as the conversion, faster.
func byteFloats() *[256]float32 {
	t := new([256]float32)
	for i := range t {
		t[i] = float32(i)
	}
	return t
}

// parallelWork is the number of pixels below which parallelRows does not
// start goroutines.
const parallelWork = 64 * 1024

// parallelRows calls fn on consecutive bands [y0, y1) covering [0, rows),
// one band per available core when work (a pixel count) is large enough to
// pay for the goroutines, and waits for them. Pre- and post-processing run
// while the model's intra-op threads are idle, so spreading them over the
// cores shortens a request without taking time from inference.
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
	first []int
	count []int
	w     []float32
	n     int
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
	t := filterTaps{first: make([]int, dstLen), count: make([]int, dstLen), w: make([]float32, dstLen*n), n: n}
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
			t.first[i] = min(max(lo, 0), max(srcLen-1, 0))
			continue
		}
		t.first[i], t.count[i] = first, last-first+1
		for j := first; j <= last; j++ {
			t.w[i*n+j-first] = float32(ws[j-lo] / total)
		}
	}
	return t
}

// resampleWindow resamples the source window (x0, y0, width sw, height sh;
// it may reach outside the image, where pixels are black) of src to dw x dh
// pixels, and writes them to dst as interleaved RGB (NHWC) float32 values
// v*mul + add, with v the 0..255 pixel value.
func resampleWindow(src *image.RGBA, x0, y0, sw, sh float64, dw, dh int, dst []float32, mul, add float32) {
	resampleRows(src, x0, y0, sw, sh, dw, dh, mul, add, func(j int, _ []float32) []float32 { return dst[j*dw*3 : (j+1)*dw*3] }, nil)
}

// resampleRows is resampleWindow writing each output row (interleaved RGB,
// dw*3 values) where row(j, scratch) says: into dst directly, or into the
// band's scratch row, which flush(j, row) then stores (nil flush: nothing
// to do).
//
// The filter is separable: each source row an output row needs is filtered
// horizontally once, into a ring of as many rows as the vertical filter
// has taps (output rows read source rows in increasing order), and output
// rows are bands of work spread over the cores.
func resampleRows(src *image.RGBA, x0, y0, sw, sh float64, dw, dh int, mul, add float32,
	row func(j int, scratch []float32) []float32, flush func(j int, row []float32)) {
	w, h := src.Rect.Dx(), src.Rect.Dy()
	xt := triangleTaps(dw, w, x0, sw)
	yt := triangleTaps(dh, h, y0, sh)
	parallelRows(dh, dw*dh+w*h/2, func(j0, j1 int) {
		ring := make([]float32, yt.n*dw*3)
		held := make([]int, yt.n)
		for i := range held {
			held[i] = -1
		}
		var scratch []float32
		if flush != nil {
			scratch = make([]float32, dw*3)
		}
		// line holds one source row as float32 RGB: each pixel is
		// converted once, not once per tap that reads it, by a table
		// lookup (exact, and cheaper than the integer to float
		// conversion).
		line := make([]float32, 3*w)
		lut := byteFloats()
		hrow := func(y int) []float32 {
			r := ring[(y%yt.n)*dw*3 : (y%yt.n+1)*dw*3]
			if held[y%yt.n] == y {
				return r
			}
			held[y%yt.n] = y
			pix := src.Pix[y*src.Stride : y*src.Stride+4*w]
			for x := range w {
				p := pix[4*x : 4*x+3 : 4*x+3]
				l := line[3*x : 3*x+3 : 3*x+3]
				l[0], l[1], l[2] = lut[p[0]], lut[p[1]], lut[p[2]]
			}
			for i := range dw {
				f, c := xt.first[i], xt.count[i]
				ws := xt.w[i*xt.n : i*xt.n+c]
				px := line[3*f : 3*(f+c)]
				var rr, gg, bb float32
				// Two taps a step (same order of additions).
				for len(ws) >= 2 && len(px) >= 6 {
					w0, w1, p := ws[0], ws[1], px[:6:6]
					rr += w0 * p[0]
					gg += w0 * p[1]
					bb += w0 * p[2]
					rr += w1 * p[3]
					gg += w1 * p[4]
					bb += w1 * p[5]
					ws, px = ws[2:], px[6:]
				}
				if len(ws) == 1 && len(px) >= 3 {
					wt, p := ws[0], px[:3:3]
					rr += wt * p[0]
					gg += wt * p[1]
					bb += wt * p[2]
				}
				o := r[3*i : 3*i+3 : 3*i+3]
				o[0], o[1], o[2] = rr, gg, bb
			}
			return r
		}
		for j := j0; j < j1; j++ {
			o := row(j, scratch)[:dw*3]
			f, c := yt.first[j], yt.count[j]
			if c == 0 {
				for i := range o {
					o[i] = add
				}
			} else {
				// Source rows f..f+c-1 sit in distinct ring slots, so two
				// can be held at once: two taps a pass over the row, in
				// the same order of additions as one at a time.
				ws := yt.w[j*yt.n : j*yt.n+c]
				k := 1
				if r0, w0 := hrow(f)[:len(o)], ws[0]; c >= 2 {
					r1, w1 := hrow(f + 1)[:len(o)], ws[1]
					for i, v := range r0 {
						o[i] = w0*v + w1*r1[i]
					}
					k = 2
				} else {
					for i, v := range r0 {
						o[i] = w0 * v
					}
				}
				for ; k+1 < c; k += 2 {
					ra, rb, wa, wb := hrow(f + k)[:len(o)], hrow(f + k + 1)[:len(o)], ws[k], ws[k+1]
					for i, v := range ra {
						o[i] = o[i] + wa*v + wb*rb[i]
					}
				}
				if k < c {
					r, wt := hrow(f + k)[:len(o)], ws[k]
					for i, v := range r {
						o[i] += wt * v
					}
				}
				if mul != 1 || add != 0 {
					for i := range o {
						o[i] = o[i]*mul + add
					}
				}
			}
			if flush != nil {
				flush(j, o)
			}
		}
	})
}

// rotatedCrop samples a size x size square of src centred on (cx, cy), side
// pixels wide, rotated by angle radians (the crop's x axis points along
// (cos angle, sin angle) in the image), into dst as interleaved RGB float32
// values v*mul + add. Pixels outside the image are black. Each output pixel
// averages k x k bilinear samples, k the down-scaling factor rounded up, so
// large faces are not aliased.
func rotatedCrop(src *image.RGBA, cx, cy, side, angle float64, size int, dst []float32, mul, add float32) {
	step := side / float64(size)
	k := max(1, int(math.Ceil(step)))
	cos, sin := math.Cos(angle), math.Sin(angle)
	// offs[i*k+s] is sub-sample s of output column (or row) i, in source
	// pixels from the crop centre before rotation.
	offs := make([]float64, size*k)
	for i := range size {
		for s := range k {
			offs[i*k+s] = (float64(i)+(float64(s)+0.5)/float64(k))*step - side/2
		}
	}
	parallelRows(size, 4*size*size*k*k, func(j0, j1 int) {
		rotatedRows(src, cx, cy, cos, sin, offs, k, size, j0, j1, dst, mul, add)
	})
}

// rotatedRows computes rows [j0, j1) of rotatedCrop. Samples whose four
// neighbours are inside the image read them straight from the pixels;
// the others go through the bounds-checked path (black outside).
func rotatedRows(src *image.RGBA, cx, cy, cos, sin float64, offs []float64, k, size, j0, j1 int, dst []float32, mul, add float32) {
	w, h, stride := src.Rect.Dx(), src.Rect.Dy(), src.Stride
	inv := 1 / float32(k*k)
	lut := byteFloats()
	at := func(x, y int) (float32, float32, float32) {
		if x < 0 || y < 0 || x >= w || y >= h {
			return 0, 0, 0
		}
		p := src.Pix[y*stride+4*x:]
		return float32(p[0]), float32(p[1]), float32(p[2])
	}
	for j := j0; j < j1; j++ {
		for i := range size {
			var r, g, b float32
			for sj := range k {
				v := offs[j*k+sj]
				vsin, vcos := v*sin, v*cos
				for si := range k {
					u := offs[i*k+si]
					// Source coordinate; pixel centres sit at +0.5.
					x := cx + u*cos - vsin - 0.5
					y := cy + u*sin + vcos - 0.5
					x0, y0 := int(math.Floor(x)), int(math.Floor(y))
					fx, fy := float32(x-float64(x0)), float32(y-float64(y0))
					if x0 >= 0 && y0 >= 0 && x0+1 < w && y0+1 < h {
						o := y0*stride + 4*x0
						p := src.Pix[o : o+7 : o+7]
						q := src.Pix[o+stride : o+stride+7 : o+stride+7]
						r += bilerp(lut[p[0]], lut[p[4]], lut[q[0]], lut[q[4]], fx, fy)
						g += bilerp(lut[p[1]], lut[p[5]], lut[q[1]], lut[q[5]], fx, fy)
						b += bilerp(lut[p[2]], lut[p[6]], lut[q[2]], lut[q[6]], fx, fy)
						continue
					}
					r00, g00, b00 := at(x0, y0)
					r10, g10, b10 := at(x0+1, y0)
					r01, g01, b01 := at(x0, y0+1)
					r11, g11, b11 := at(x0+1, y0+1)
					r += bilerp(r00, r10, r01, r11, fx, fy)
					g += bilerp(g00, g10, g01, g11, fx, fy)
					b += bilerp(b00, b10, b01, b11, fx, fy)
				}
			}
			o := dst[(j*size+i)*3:]
			o[0], o[1], o[2] = r*inv*mul+add, g*inv*mul+add, b*inv*mul+add
		}
	}
}

func bilerp(tl, tr, bl, br, fx, fy float32) float32 {
	top := tl + (tr-tl)*fx
	bot := bl + (br-bl)*fx
	return top + (bot-top)*fy
}

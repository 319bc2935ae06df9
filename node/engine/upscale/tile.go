package upscale

import (
	"image"
	"image/draw"
	"math"

	xdraw "golang.org/x/image/draw"
)

// spans returns the start offsets of tiles of side tile covering length n
// with neighbours overlapping by at least overlap: one tile when n fits,
// else the fewest tiles, spread evenly from 0 to n-tile.
func spans(n, tile, overlap int) []int {
	if n <= tile {
		return []int{0}
	}
	step := tile - overlap
	k := (n-tile+step-1)/step + 1
	out := make([]int, k)
	for i := range out {
		out[i] = int(math.Round(float64(i) * float64(n-tile) / float64(k-1)))
	}
	return out
}

// weights are the feathered blending weights along one axis of a tile
// starting at p with length t (input pixels) in an image of length n, for
// the tile's t*s output pixels. Towards a side that borders another tile
// the weight is ~0 over the outer quarter of the overlap (where the
// model's padding shows) and ramps linearly to 1 over the next half; an
// image edge keeps weight 1. Overlapping tiles thus always have one tile
// at full weight, and the blend has no hard seam.
func weights(p, t, n, overlap, s int) []float32 {
	w := make([]float32, t*s)
	o := float64(overlap * s)
	margin, ramp := o/4, math.Max(o/2, 1)
	for i := range w {
		d := math.Inf(1)
		if p > 0 {
			d = float64(i)
		}
		if p+t < n {
			d = math.Min(d, float64(t*s-1-i))
		}
		v := (d + 0.5 - margin) / ramp
		w[i] = float32(min(max(v, 1e-4), 1))
	}
	return w
}

// toNRGBA returns img as a non-premultiplied RGBA image at origin (0, 0).
func toNRGBA(img image.Image) *image.NRGBA {
	if n, ok := img.(*image.NRGBA); ok && n.Rect.Min == (image.Point{}) {
		return n
	}
	b := img.Bounds()
	n := image.NewNRGBA(image.Rect(0, 0, b.Dx(), b.Dy()))
	draw.Draw(n, n.Rect, img, b.Min, draw.Src)
	return n
}

// planes splits src's RGB into three planes scaled to 0..rangeMax.
func planes(src *image.NRGBA, rangeMax float32) [3][]float32 {
	w, h := src.Rect.Dx(), src.Rect.Dy()
	var p [3][]float32
	for c := range p {
		p[c] = make([]float32, w*h)
	}
	k := rangeMax / 255
	for y := range h {
		row := src.Pix[y*src.Stride:]
		for x := range w {
			i := y*w + x
			p[0][i] = float32(row[4*x]) * k
			p[1][i] = float32(row[4*x+1]) * k
			p[2][i] = float32(row[4*x+2]) * k
		}
	}
	return p
}

// fillTile copies the tw×th tile at (x0, y0) of the planes (image w×h) into
// in, in NCHW or NHWC order.
func fillTile(in []float32, p [3][]float32, w, h, x0, y0, tw, th int, nchw bool) {
	_ = h
	for y := range th {
		for x := range tw {
			si := (y0+y)*w + x0 + x
			if nchw {
				for c := range 3 {
					in[c*tw*th+y*tw+x] = p[c][si]
				}
			} else {
				o := 3 * (y*tw + x)
				in[o], in[o+1], in[o+2] = p[0][si], p[1][si], p[2][si]
			}
		}
	}
}

// blend accumulates weighted tile outputs over a band of output rows
// [base, base+h): one tile row's height, so the float accumulators stay
// small however tall the image is. Rows above the next tile row are final
// and are written out by flush.
type blend struct {
	w, h, base int
	sum        [3][]float32
	wt         []float32
}

func newBlend(w, h int) *blend {
	b := &blend{w: w, h: h, wt: make([]float32, w*h)}
	for c := range b.sum {
		b.sum[c] = make([]float32, w*h)
	}
	return b
}

// add adds a tile's output (ow×oh at output (ox, oy), NCHW or NHWC) with
// the separable weights wx, wy; oy..oy+oh must lie in the band.
func (b *blend) add(out []float32, ox, oy, ow, oh int, nchw bool, wx, wy []float32) {
	for y := range oh {
		row := (oy-b.base+y)*b.w + ox
		for x := range ow {
			wgt := wx[x] * wy[y]
			i := row + x
			var r, g, bl float32
			if nchw {
				j := y*ow + x
				r, g, bl = out[j], out[ow*oh+j], out[2*ow*oh+j]
			} else {
				j := 3 * (y*ow + x)
				r, g, bl = out[j], out[j+1], out[j+2]
			}
			b.sum[0][i] += wgt * r
			b.sum[1][i] += wgt * g
			b.sum[2][i] += wgt * bl
			b.wt[i] += wgt
		}
	}
}

// flush writes the final rows [base, upto) into dst (dividing by the
// weights, scaling 0..rangeMax to 0..255, clamping, rounding, alpha 255)
// and moves the band down to start at upto.
func (b *blend) flush(dst *image.NRGBA, upto int, rangeMax float32) {
	n := upto - b.base
	k := 255 / rangeMax
	for y := range n {
		row := dst.Pix[(b.base+y)*dst.Stride:]
		for x := range b.w {
			i := y*b.w + x
			inv := k / b.wt[i]
			for c := range 3 {
				row[4*x+c] = toByte(b.sum[c][i] * inv)
			}
			row[4*x+3] = 255
		}
	}
	keep := (b.h - n) * b.w
	for _, p := range append(b.sum[:], b.wt) {
		copy(p, p[n*b.w:])
		clear(p[keep:])
	}
	b.base = upto
}

func toByte(v float32) uint8 {
	if !(v > 0) { // also NaN
		return 0
	}
	if v >= 255 {
		return 255
	}
	return uint8(v + 0.5)
}

// opaque reports whether every pixel of src has alpha 255.
func opaque(src *image.NRGBA) bool {
	w, h := src.Rect.Dx(), src.Rect.Dy()
	for y := range h {
		row := src.Pix[y*src.Stride:]
		for x := range w {
			if row[4*x+3] != 255 {
				return false
			}
		}
	}
	return true
}

// upscaleAlpha sets dst's alpha to src's alpha resampled to dst's size with
// Catmull-Rom (bicubic).
func upscaleAlpha(dst, src *image.NRGBA) {
	a := image.NewGray(src.Rect)
	for y := range src.Rect.Dy() {
		for x := range src.Rect.Dx() {
			a.Pix[y*a.Stride+x] = src.Pix[y*src.Stride+4*x+3]
		}
	}
	big := image.NewGray(dst.Rect)
	xdraw.CatmullRom.Scale(big, big.Rect, a, a.Rect, xdraw.Src, nil)
	for y := range dst.Rect.Dy() {
		for x := range dst.Rect.Dx() {
			dst.Pix[y*dst.Stride+4*x+3] = big.Pix[y*big.Stride+x]
		}
	}
}

package vision

import (
	"image"
	"image/draw"
	"math"
)

// toRGBA copies img into an RGBA image with its origin at (0, 0). Alpha is
// premultiplied, so transparent pixels read as black: a transparent image is
// seen as composited over black. image/draw has fast paths for the
// decoders' outputs (YCbCr, Gray, NRGBA, RGBA, Paletted).
func toRGBA(img image.Image) *image.RGBA {
	b := img.Bounds()
	dst := image.NewRGBA(image.Rect(0, 0, b.Dx(), b.Dy()))
	draw.Draw(dst, dst.Rect, img, b.Min, draw.Src)
	return dst
}

// filterTaps holds, for each output index along one axis, the first source
// index and the weights of the source pixels it reads (stride n).
type filterTaps struct {
	first []int
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
	t := filterTaps{first: make([]int, dstLen), w: make([]float32, dstLen*n), n: n}
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

// resampleWindow resamples the source window (x0, y0, width sw, height sh;
// it may reach outside the image, where pixels are black) of src to dw x dh
// pixels, and writes them to dst as interleaved RGB (NHWC) float32 values
// v*mul + add, with v the 0..255 pixel value.
func resampleWindow(src *image.RGBA, x0, y0, sw, sh float64, dw, dh int, dst []float32, mul, add float32) {
	w, h := src.Rect.Dx(), src.Rect.Dy()
	xt := triangleTaps(dw, w, x0, sw)
	yt := triangleTaps(dh, h, y0, sh)
	// Horizontal pass over every source row an output row reads.
	rowLo, rowHi := h, 0
	for i := range dh {
		lo := yt.first[i]
		hi := min(lo+yt.n, h)
		if lo < rowLo {
			rowLo = lo
		}
		if hi > rowHi {
			rowHi = hi
		}
	}
	var rows []float32
	if rowHi > rowLo {
		rows = make([]float32, (rowHi-rowLo)*dw*3)
		for y := rowLo; y < rowHi; y++ {
			line := src.Pix[y*src.Stride : y*src.Stride+4*w]
			out := rows[(y-rowLo)*dw*3 : (y-rowLo+1)*dw*3]
			for i := range dw {
				f := xt.first[i]
				var r, g, b float32
				for k, wt := range xt.w[i*xt.n : (i+1)*xt.n] {
					if wt == 0 || f+k >= w {
						continue
					}
					p := line[4*(f+k):]
					r += wt * float32(p[0])
					g += wt * float32(p[1])
					b += wt * float32(p[2])
				}
				out[3*i], out[3*i+1], out[3*i+2] = r, g, b
			}
		}
	}
	// Vertical pass.
	for j := range dh {
		f := yt.first[j]
		o := dst[j*dw*3 : (j+1)*dw*3]
		for i := range o {
			o[i] = 0
		}
		for k, wt := range yt.w[j*yt.n : (j+1)*yt.n] {
			if wt == 0 || f+k >= h {
				continue
			}
			row := rows[(f+k-rowLo)*dw*3 : (f+k-rowLo+1)*dw*3]
			for i, v := range row {
				o[i] += wt * v
			}
		}
		for i := range o {
			o[i] = o[i]*mul + add
		}
	}
}

// rotatedCrop samples a size x size square of src centred on (cx, cy), side
// pixels wide, rotated by angle radians (the crop's x axis points along
// (cos angle, sin angle) in the image), into dst as interleaved RGB float32
// values v*mul + add. Pixels outside the image are black. Each output pixel
// averages k x k bilinear samples, k the down-scaling factor rounded up, so
// large faces are not aliased.
func rotatedCrop(src *image.RGBA, cx, cy, side, angle float64, size int, dst []float32, mul, add float32) {
	w, h := src.Rect.Dx(), src.Rect.Dy()
	step := side / float64(size)
	k := max(1, int(math.Ceil(step)))
	cos, sin := math.Cos(angle), math.Sin(angle)
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
					// Offset from the crop centre, in source pixels, before rotation.
					u := (float64(i)+(float64(si)+0.5)/float64(k))*step - side/2
					v := (float64(j)+(float64(sj)+0.5)/float64(k))*step - side/2
					// Source coordinate; pixel centres sit at +0.5.
					x := cx + u*cos - v*sin - 0.5
					y := cy + u*sin + v*cos - 0.5
					x0, y0 := int(math.Floor(x)), int(math.Floor(y))
					fx, fy := float32(x-float64(x0)), float32(y-float64(y0))
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

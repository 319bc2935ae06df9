package onnx

import (
	"image"
	"image/color"
	"math"
)

// toNRGBA returns a copy of img as non-premultiplied RGBA with its origin at
// (0, 0). The common decoder outputs (NRGBA, RGBA, YCbCr, Gray, Paletted)
// are converted through their Pix slices; other models go through At.
func toNRGBA(img image.Image) *image.NRGBA {
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	dst := image.NewNRGBA(image.Rect(0, 0, w, h))
	switch src := img.(type) {
	case *image.NRGBA:
		for y := range h {
			i := src.PixOffset(b.Min.X, b.Min.Y+y)
			copy(dst.Pix[y*dst.Stride:y*dst.Stride+4*w], src.Pix[i:i+4*w])
		}
	case *image.RGBA:
		for y := range h {
			s := src.Pix[src.PixOffset(b.Min.X, b.Min.Y+y):]
			d := dst.Pix[y*dst.Stride:]
			for x := 0; x < 4*w; x += 4 {
				r, g, bl, a := s[x], s[x+1], s[x+2], s[x+3]
				switch a {
				case 0xff:
					d[x], d[x+1], d[x+2], d[x+3] = r, g, bl, a
				case 0:
					// Fully transparent: colour is undefined, leave zero.
				default:
					d[x] = uint8(uint32(r) * 0xff / uint32(a))
					d[x+1] = uint8(uint32(g) * 0xff / uint32(a))
					d[x+2] = uint8(uint32(bl) * 0xff / uint32(a))
					d[x+3] = a
				}
			}
		}
	case *image.YCbCr:
		// Chroma subsampling along x does not depend on y: tabulate each
		// column's chroma offset from the row's first one once.
		cx := make([]int, w)
		c0 := src.COffset(b.Min.X, b.Min.Y)
		for x := range w {
			cx[x] = src.COffset(b.Min.X+x, b.Min.Y) - c0
		}
		for y := range h {
			d := dst.Pix[y*dst.Stride : y*dst.Stride+4*w]
			ys := src.Y[src.YOffset(b.Min.X, b.Min.Y+y):]
			ci := src.COffset(b.Min.X, b.Min.Y+y)
			cbs, crs := src.Cb[ci:], src.Cr[ci:]
			for x := range w {
				r, g, bl := color.YCbCrToRGB(ys[x], cbs[cx[x]], crs[cx[x]])
				d[4*x], d[4*x+1], d[4*x+2], d[4*x+3] = r, g, bl, 0xff
			}
		}
	case *image.Gray:
		for y := range h {
			s := src.Pix[src.PixOffset(b.Min.X, b.Min.Y+y):]
			d := dst.Pix[y*dst.Stride:]
			for x := range w {
				v := s[x]
				d[4*x], d[4*x+1], d[4*x+2], d[4*x+3] = v, v, v, 0xff
			}
		}
	case *image.Paletted:
		// Indices past the palette (which decoders reject or pad) read as
		// transparent black; a palette cannot address more than 256 entries.
		var lut [256][4]uint8
		for i, c := range src.Palette[:min(len(src.Palette), len(lut))] {
			n := color.NRGBAModel.Convert(c).(color.NRGBA)
			lut[i] = [4]uint8{n.R, n.G, n.B, n.A}
		}
		for y := range h {
			s := src.Pix[src.PixOffset(b.Min.X, b.Min.Y+y):]
			d := dst.Pix[y*dst.Stride:]
			for x := range w {
				copy(d[4*x:4*x+4], lut[s[x]][:])
			}
		}
	default:
		for y := range h {
			d := dst.Pix[y*dst.Stride:]
			for x := range w {
				c := color.NRGBAModel.Convert(img.At(b.Min.X+x, b.Min.Y+y)).(color.NRGBA)
				d[4*x], d[4*x+1], d[4*x+2], d[4*x+3] = c.R, c.G, c.B, c.A
			}
		}
	}
	return dst
}

// axis holds, for each destination index along one axis, the two source
// indices a bilinear sample reads and the weight of the second.
type axis struct {
	i0, i1 []int
	w      []float32
}

// bilinearAxis maps dstLen pixel centres onto srcLen source pixels
// (half-pixel centres, clamped at the edges), as PIL and OpenCV do.
func bilinearAxis(dstLen, srcLen int) axis {
	a := axis{i0: make([]int, dstLen), i1: make([]int, dstLen), w: make([]float32, dstLen)}
	scale := float64(srcLen) / float64(dstLen)
	for i := range dstLen {
		f := (float64(i)+0.5)*scale - 0.5
		f = math.Max(0, math.Min(f, float64(srcLen-1)))
		i0 := int(f)
		a.i0[i] = i0
		a.i1[i] = min(i0+1, srcLen-1)
		a.w[i] = float32(f - float64(i0))
	}
	return a
}

// resizeToCHW resamples src (origin (0,0)) to size x size with bilinear
// filtering and writes it planar (R plane, G plane, B plane) into dst,
// normalised as ISNet expects: (v - 128) / 256.
func resizeToCHW(src *image.NRGBA, size int, dst []float32) {
	w, h := src.Rect.Dx(), src.Rect.Dy()
	xs := bilinearAxis(size, w)
	ys := bilinearAxis(size, h)
	// Byte offsets of the two source pixels per output column.
	x0 := make([]int, size)
	x1 := make([]int, size)
	for i := range size {
		x0[i], x1[i] = 4*xs.i0[i], 4*xs.i1[i]
	}
	plane := size * size
	rp, gp, bp := dst[:plane], dst[plane:2*plane], dst[2*plane:3*plane]
	for y := range size {
		r0 := src.Pix[ys.i0[y]*src.Stride : ys.i0[y]*src.Stride+4*w]
		r1 := src.Pix[ys.i1[y]*src.Stride : ys.i1[y]*src.Stride+4*w]
		wy := ys.w[y]
		row := y * size
		for x := range size {
			a, b, wx := x0[x], x1[x], xs.w[x]
			rp[row+x] = lerp2(r0[a], r0[b], r1[a], r1[b], wx, wy)
			gp[row+x] = lerp2(r0[a+1], r0[b+1], r1[a+1], r1[b+1], wx, wy)
			bp[row+x] = lerp2(r0[a+2], r0[b+2], r1[a+2], r1[b+2], wx, wy)
		}
	}
}

// lerp2 interpolates four 8-bit samples (top-left, top-right, bottom-left,
// bottom-right) and normalises the result to (v - 128) / 256.
func lerp2(tl, tr, bl, br uint8, wx, wy float32) float32 {
	top := float32(tl) + (float32(tr)-float32(tl))*wx
	bot := float32(bl) + (float32(br)-float32(bl))*wx
	return (top+(bot-top)*wy)*(1.0/256) - 0.5
}

// applyMask resamples the size x size mask to dst's size (bilinear) and
// multiplies dst's alpha by it, clamped to [0, 1].
func applyMask(dst *image.NRGBA, mask []float32, size int) {
	w, h := dst.Rect.Dx(), dst.Rect.Dy()
	xs := bilinearAxis(w, size)
	ys := bilinearAxis(h, size)
	for y := range h {
		m0 := mask[ys.i0[y]*size : ys.i0[y]*size+size]
		m1 := mask[ys.i1[y]*size : ys.i1[y]*size+size]
		wy := ys.w[y]
		d := dst.Pix[y*dst.Stride : y*dst.Stride+4*w]
		for x := range w {
			a, b, wx := xs.i0[x], xs.i1[x], xs.w[x]
			top := m0[a] + (m0[b]-m0[a])*wx
			bot := m1[a] + (m1[b]-m1[a])*wx
			m := top + (bot-top)*wy
			m = min(max(m, 0), 1)
			d[4*x+3] = uint8(m*float32(d[4*x+3]) + 0.5)
		}
	}
}

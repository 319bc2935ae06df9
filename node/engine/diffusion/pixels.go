package diffusion

import (
	"image"
	"image/draw"
	"math"

	xdraw "golang.org/x/image/draw"
)

// toNRGBA returns a copy of img as NRGBA with its origin at (0, 0).
func toNRGBA(img image.Image) *image.NRGBA {
	b := img.Bounds()
	dst := image.NewNRGBA(image.Rect(0, 0, b.Dx(), b.Dy()))
	draw.Draw(dst, dst.Rect, img, b.Min, draw.Src)
	return dst
}

// resize returns img scaled to w x h (Catmull-Rom; a copy when the size
// already matches).
func resize(img *image.NRGBA, w, h int) *image.NRGBA {
	if img.Rect.Dx() == w && img.Rect.Dy() == h {
		out := image.NewNRGBA(img.Rect)
		copy(out.Pix, img.Pix)
		return out
	}
	dst := image.NewNRGBA(image.Rect(0, 0, w, h))
	xdraw.CatmullRom.Scale(dst, dst.Rect, img, img.Rect, xdraw.Src, nil)
	return dst
}

// toCHW writes img's RGB planar into a new slice mapped to [lo, hi].
func toCHW(img *image.NRGBA, lo, hi float32) []float32 {
	w, h := img.Rect.Dx(), img.Rect.Dy()
	out := make([]float32, 3*w*h)
	k := (hi - lo) / 255
	for y := range h {
		row := img.Pix[y*img.Stride:]
		for x := range w {
			p := y*w + x
			out[p] = lo + k*float32(row[4*x])
			out[w*h+p] = lo + k*float32(row[4*x+1])
			out[2*w*h+p] = lo + k*float32(row[4*x+2])
		}
	}
	return out
}

// fromCHW turns a [3,h,w] image in [-1,1] into an opaque NRGBA.
func fromCHW(v []float32, w, h int) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		row := img.Pix[y*img.Stride:]
		for x := range w {
			p := y*w + x
			row[4*x] = unit8(v[p])
			row[4*x+1] = unit8(v[w*h+p])
			row[4*x+2] = unit8(v[2*w*h+p])
			row[4*x+3] = 0xff
		}
	}
	return img
}

// unit8 maps [-1,1] to 0..255, rounding and clamping (NaN reads as 0).
func unit8(v float32) uint8 {
	f := (float64(v) + 1) * 127.5
	if !(f > 0) {
		return 0
	}
	if f >= 255 {
		return 255
	}
	return uint8(math.Round(f))
}

// binaryMask returns, for each pixel of m (resized to w x h), 1 where its
// luma is at least half white, else 0.
func binaryMask(m image.Image, w, h int) []float32 {
	src := toNRGBA(m)
	if src.Rect.Dx() != w || src.Rect.Dy() != h {
		src = resize(src, w, h)
	}
	out := make([]float32, w*h)
	for y := range h {
		row := src.Pix[y*src.Stride:]
		for x := range w {
			r, g, b := float32(row[4*x]), float32(row[4*x+1]), float32(row[4*x+2])
			if 0.299*r+0.587*g+0.114*b >= 127.5 {
				out[y*w+x] = 1
			}
		}
	}
	return out
}

// latentMask shrinks a w x h pixel mask to the latent grid: a latent cell
// is repainted when any of its pixels is.
func latentMask(m []float32, w, h int) []float32 {
	lw, lh := w/vaeFactor, h/vaeFactor
	out := make([]float32, lw*lh)
	for y := range h {
		for x := range w {
			if m[y*w+x] > 0 {
				out[(y/vaeFactor)*lw+x/vaeFactor] = 1
			}
		}
	}
	return out
}

// composite keeps src where mask (w x h) is 0 and takes gen where it is 1;
// both images are w x h.
func composite(src, gen *image.NRGBA, mask []float32) *image.NRGBA {
	out := image.NewNRGBA(src.Rect)
	w, h := src.Rect.Dx(), src.Rect.Dy()
	for y := range h {
		for x := range w {
			from := src
			if mask[y*w+x] > 0 {
				from = gen
			}
			copy(out.Pix[y*out.Stride+4*x:y*out.Stride+4*x+4], from.Pix[y*from.Stride+4*x:y*from.Stride+4*x+4])
		}
	}
	return out
}

// grayPlanes returns v (h*w values in [0,1]) as a [3,h,w] image.
func grayPlanes(v []float32) []float32 {
	out := make([]float32, 3*len(v))
	copy(out, v)
	copy(out[len(v):], v)
	copy(out[2*len(v):], v)
	return out
}

// canny returns the edge map of img (w x h) as 0/1 values: Gaussian
// smoothing (sigma 1.4), Sobel gradients, non-maximum suppression and
// hysteresis between lo and hi (gradient magnitudes of the 0..255 luma;
// ControlNet's canny preprocessor uses 100 and 200).
func canny(img *image.NRGBA, lo, hi float64) []float32 {
	w, h := img.Rect.Dx(), img.Rect.Dy()
	lum := make([]float64, w*h)
	for y := range h {
		row := img.Pix[y*img.Stride:]
		for x := range w {
			lum[y*w+x] = 0.299*float64(row[4*x]) + 0.587*float64(row[4*x+1]) + 0.114*float64(row[4*x+2])
		}
	}
	at := func(v []float64, x, y int) float64 {
		x = min(max(x, 0), w-1)
		y = min(max(y, 0), h-1)
		return v[y*w+x]
	}
	// Separable 5-tap Gaussian.
	k := []float64{0.0545, 0.2442, 0.4026, 0.2442, 0.0545}
	tmp := make([]float64, w*h)
	for y := range h {
		for x := range w {
			var s float64
			for i, kv := range k {
				s += kv * at(lum, x+i-2, y)
			}
			tmp[y*w+x] = s
		}
	}
	sm := make([]float64, w*h)
	for y := range h {
		for x := range w {
			var s float64
			for i, kv := range k {
				s += kv * at(tmp, x, y+i-2)
			}
			sm[y*w+x] = s
		}
	}
	mag := make([]float64, w*h)
	dir := make([]uint8, w*h)
	for y := range h {
		for x := range w {
			gx := at(sm, x+1, y-1) + 2*at(sm, x+1, y) + at(sm, x+1, y+1) - at(sm, x-1, y-1) - 2*at(sm, x-1, y) - at(sm, x-1, y+1)
			gy := at(sm, x-1, y+1) + 2*at(sm, x, y+1) + at(sm, x+1, y+1) - at(sm, x-1, y-1) - 2*at(sm, x, y-1) - at(sm, x+1, y-1)
			mag[y*w+x] = math.Hypot(gx, gy)
			a := math.Atan2(gy, gx) * 180 / math.Pi
			if a < 0 {
				a += 180
			}
			switch {
			case a < 22.5 || a >= 157.5:
				dir[y*w+x] = 0
			case a < 67.5:
				dir[y*w+x] = 1
			case a < 112.5:
				dir[y*w+x] = 2
			default:
				dir[y*w+x] = 3
			}
		}
	}
	// Non-maximum suppression along the gradient direction.
	offs := [4][2]int{{1, 0}, {1, 1}, {0, 1}, {-1, 1}}
	nms := make([]float64, w*h)
	for y := range h {
		for x := range w {
			m := mag[y*w+x]
			o := offs[dir[y*w+x]]
			if m >= at(mag, x+o[0], y+o[1]) && m > at(mag, x-o[0], y-o[1]) {
				nms[y*w+x] = m
			}
		}
	}
	// Hysteresis: strong pixels, and weak ones connected to them.
	out := make([]float32, w*h)
	var stack []int
	for i, m := range nms {
		if m >= hi {
			out[i] = 1
			stack = append(stack, i)
		}
	}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		x, y := i%w, i/w
		for dy := -1; dy <= 1; dy++ {
			for dx := -1; dx <= 1; dx++ {
				nx, ny := x+dx, y+dy
				if nx < 0 || ny < 0 || nx >= w || ny >= h {
					continue
				}
				j := ny*w + nx
				if out[j] == 0 && nms[j] >= lo {
					out[j] = 1
					stack = append(stack, j)
				}
			}
		}
	}
	return out
}

// extendCanvas places img in the middle of a w x h canvas whose border
// repeats img's edge pixels, and returns it with the mask of the border
// (1) in canvas pixels. ox, oy is img's top-left corner on the canvas.
func extendCanvas(img *image.NRGBA, w, h, ox, oy int) (*image.NRGBA, []float32) {
	iw, ih := img.Rect.Dx(), img.Rect.Dy()
	out := image.NewNRGBA(image.Rect(0, 0, w, h))
	mask := make([]float32, w*h)
	for y := range h {
		sy := min(max(y-oy, 0), ih-1)
		for x := range w {
			sx := min(max(x-ox, 0), iw-1)
			copy(out.Pix[y*out.Stride+4*x:y*out.Stride+4*x+4], img.Pix[sy*img.Stride+4*sx:sy*img.Stride+4*sx+4])
			out.Pix[y*out.Stride+4*x+3] = 0xff
			if x-ox < 0 || x-ox >= iw || y-oy < 0 || y-oy >= ih {
				mask[y*w+x] = 1
			}
		}
	}
	return out, mask
}

// clipInput resizes img to 224 x 224 and normalises it with CLIP's mean
// and standard deviation, planar.
func clipInput(img *image.NRGBA) []float32 {
	mean := [3]float32{0.48145466, 0.4578275, 0.40821073}
	std := [3]float32{0.26862954, 0.26130258, 0.27577711}
	v := toCHW(resize(img, 224, 224), 0, 1)
	for c := range 3 {
		p := v[c*224*224 : (c+1)*224*224]
		for i := range p {
			p[i] = (p[i] - mean[c]) / std[c]
		}
	}
	return v
}

// imagenetInput resizes img to s x s and normalises it with ImageNet's
// mean and standard deviation, planar (depth estimators' input).
func imagenetInput(img *image.NRGBA, s int) []float32 {
	mean := [3]float32{0.485, 0.456, 0.406}
	std := [3]float32{0.229, 0.224, 0.225}
	v := toCHW(resize(img, s, s), 0, 1)
	for c := range 3 {
		p := v[c*s*s : (c+1)*s*s]
		for i := range p {
			p[i] = (p[i] - mean[c]) / std[c]
		}
	}
	return v
}

// hwc01 returns img as [h,w,3] values in [0,1] (the safety checker's
// images input).
func hwc01(img *image.NRGBA) []float32 {
	w, h := img.Rect.Dx(), img.Rect.Dy()
	out := make([]float32, 0, 3*w*h)
	for y := range h {
		row := img.Pix[y*img.Stride:]
		for x := range w {
			out = append(out, float32(row[4*x])/255, float32(row[4*x+1])/255, float32(row[4*x+2])/255)
		}
	}
	return out
}

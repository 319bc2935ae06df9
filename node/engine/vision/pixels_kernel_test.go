package vision

import (
	"image"
	"math"
	"math/rand/v2"
	"testing"
)

// kernelLevels are the C kernels' vector levels: plain C, SSE2, AVX2 (a
// level the CPU lacks runs as the best one it has).
var kernelLevels = []int{0, 1, 2}

// noisePattern is a w x h RGBA image of random bytes (alpha too: the
// resampler filters it along and must drop it).
func noisePattern(rng *rand.Rand, w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = uint8(rng.UintN(256))
	}
	return img
}

// checkResample compares resampleRows at every level, into dst and
// through flush, with refResampleWindow: they must be bit-equal.
func checkResample(t *testing.T, src *image.RGBA, x0, y0, sw, sh float64, dw, dh int, mul, add float32) {
	t.Helper()
	want := make([]float32, dw*dh*3)
	refResampleWindow(src, x0, y0, sw, sh, dw, dh, want, mul, add)
	got := make([]float32, dw*dh*3)
	for _, level := range kernelLevels {
		for _, flushed := range []bool{false, true} {
			for i := range got {
				got[i] = -99
			}
			if flushed {
				resampleRows(src, x0, y0, sw, sh, dw, dh, mul, add, level, nil, func(j int, row []float32) {
					copy(got[j*dw*3:(j+1)*dw*3], row)
				})
			} else {
				resampleRows(src, x0, y0, sw, sh, dw, dh, mul, add, level, got, nil)
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("level %d flush %v: %v window %v,%v %vx%v -> %dx%d (%v, %v): value %d = %v, want %v",
						level, flushed, src.Rect, x0, y0, sw, sh, dw, dh, mul, add, i, got[i], want[i])
				}
			}
		}
	}
}

// checkRotated compares rotatedCropLevel at every level with
// refRotatedCrop.
func checkRotated(t *testing.T, src *image.RGBA, cx, cy, side, angle float64, size int, mul, add float32) {
	t.Helper()
	want := make([]float32, size*size*3)
	refRotatedCrop(src, cx, cy, side, angle, size, want, mul, add)
	got := make([]float32, size*size*3)
	for _, level := range kernelLevels {
		rotatedCropLevel(src, cx, cy, side, angle, size, got, mul, add, level)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("level %d: %v crop (%v, %v) side %v angle %v size %d: value %d = %v, want %v",
					level, src.Rect, cx, cy, side, angle, size, i, got[i], want[i])
			}
		}
	}
}

// TestPixelKernelsRandom: on random images, windows (inside, across and
// outside the image, shrinking and enlarging), crops and angles, every
// vector level of the C kernels gives exactly the Go references' bits.
func TestPixelKernelsRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 640))
	for range 60 {
		w, h := 1+rng.IntN(200), 1+rng.IntN(200)
		src := noisePattern(rng, w, h)
		if rng.IntN(3) == 0 {
			// A view into a larger image: stride wider than the rows.
			big := noisePattern(rng, w+5, h+3)
			src = toRGBA(big.SubImage(image.Rect(3, 2, 3+w, 2+h)))
		}
		sw := (0.2 + 2*rng.Float64()) * float64(w)
		sh := (0.2 + 2*rng.Float64()) * float64(h)
		x0 := (rng.Float64() - 0.6) * float64(w)
		y0 := (rng.Float64() - 0.6) * float64(h)
		dw, dh := 1+rng.IntN(150), 1+rng.IntN(150)
		mul, add := float32(1), float32(0)
		if rng.IntN(2) == 0 {
			mul, add = 1/127.5, -1
		}
		checkResample(t, src, x0, y0, sw, sh, dw, dh, mul, add)
		cx, cy := (rng.Float64()*1.4-0.2)*float64(w), (rng.Float64()*1.4-0.2)*float64(h)
		side := 1 + rng.Float64()*2*float64(max(w, h))
		checkRotated(t, src, cx, cy, side, (rng.Float64()*2-1)*math.Pi, 1+rng.IntN(60), mul, add)
	}
}

// FuzzPixelKernels: the C resampler and rotated crop against the Go
// references on fuzzed sizes, windows and angles (bit-equal).
func FuzzPixelKernels(f *testing.F) {
	f.Add(uint8(64), uint8(48), uint8(32), uint8(32), int16(0), int16(-64), int16(512), int16(512), int16(200), int16(150), int16(300), uint16(500), uint64(1))
	f.Add(uint8(7), uint8(3), uint8(200), uint8(90), int16(-9), int16(5), int16(10), int16(7), int16(-40), int16(2), int16(8), uint16(40000), uint64(2))
	f.Fuzz(func(t *testing.T, w, h, dw, dh uint8, x0, y0, sw, sh, cx, cy, side int16, angle uint16, seed uint64) {
		if w == 0 || h == 0 || dw == 0 || dh == 0 || sw <= 0 || sh <= 0 || side <= 0 {
			return
		}
		rng := rand.New(rand.NewPCG(seed, 1))
		src := noisePattern(rng, int(w), int(h))
		checkResample(t, src, float64(x0)/8, float64(y0)/8, float64(sw)/8, float64(sh)/8, int(dw), int(dh), 1/127.5, -1)
		size := 1 + int(dh)%48
		checkRotated(t, src, float64(cx)/8, float64(cy)/8, float64(side)/16, float64(angle)/65536*2*math.Pi, size, 1, 0)
	})
}

// refPeaks is detector.peaks as one plain scan (before sorting).
func refPeaks(g, nc int, heat, sides []float32, thr float32) []candidate {
	var out []candidate
	for i, v := range heat[:g*g*nc] {
		if v < thr {
			continue
		}
		c, cell := i%nc, i/nc
		x, y := cell%g, cell/g
		peak := true
		for dy := -1; dy <= 1; dy++ {
			for dx := -1; dx <= 1; dx++ {
				xx, yy := x+dx, y+dy
				if (dx != 0 || dy != 0) && xx >= 0 && yy >= 0 && xx < g && yy < g && heat[(yy*g+xx)*nc+c] > v {
					peak = false
				}
			}
		}
		if peak {
			l, t, r, b := sides[4*cell], sides[4*cell+1], sides[4*cell+2], sides[4*cell+3]
			cx, cy := float32(x*centerNetStride), float32(y*centerNetStride)
			out = append(out, candidate{class: c, score: v, box: [4]float32{cx - l, cy - t, cx + r, cy + b}})
		}
	}
	byScoreDesc(out, func(c candidate) float32 { return c.score })
	return out[:min(len(out), maxCandidates)]
}

// TestPeaksMatchesReference: the C threshold scan and banded peak test
// give the plain scan's candidates in the same order, with ties
// (quantised scores), thresholds that let few or thousands through, and
// grids whose entries do not divide into vectors.
func TestPeaksMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(128, 90))
	for _, c := range []struct {
		g, nc int
		thr   float32
	}{{128, 80, 0.3}, {128, 80, 0.97}, {64, 80, 0.05}, {7, 3, 0.5}, {5, 1, 0}, {33, 5, 0.9}} {
		heat := make([]float32, c.g*c.g*c.nc)
		for i := range heat {
			heat[i] = float32(rng.IntN(40)) / 40 * rng.Float32()
		}
		sides := make([]float32, 4*c.g*c.g)
		for i := range sides {
			sides[i] = rng.Float32() * 30
		}
		d := &detector{grid: c.g, labels: make([]string, c.nc)}
		got := d.peaks(heat, sides, c.thr)
		want := refPeaks(c.g, c.nc, heat, sides, c.thr)
		if len(got) != len(want) {
			t.Fatalf("%+v: %d peaks, want %d", c, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%+v: peak %d = %+v, want %+v", c, i, got[i], want[i])
			}
		}
	}
}

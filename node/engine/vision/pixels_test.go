package vision

import (
	"image"
	"image/color"
	"math"
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

package vision

import (
	"context"
	"image"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

func loadSCRFDTest(t testing.TB) *scrfd {
	t.Helper()
	dir := t.TempDir()
	for _, m := range []string{"scrfd_planted.onnx", "arcface_pool.onnx"} {
		b, err := os.ReadFile(filepath.Join("testdata", m))
		if err != nil {
			t.Fatalf("generated model: %v (run testdata/gen_models.py)", err)
		}
		if err := os.WriteFile(filepath.Join(dir, m), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := LoadFaces(onnxtest.Runtime(t), engine.Spec{
		ID: "onnx/scrfd/test", Task: engine.TaskFaceDetection, Dir: dir,
		Files:   map[string]string{"detector": "scrfd_planted.onnx", "embedder": "arcface_pool.onnx"},
		Options: map[string]string{"format": "scrfd"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f.(*scrfd)
}

func near(a, b float32) bool { return math.Abs(float64(a-b)) < 1e-3 }

// TestSCRFDPlanted decodes the planted SCRFD outputs (testdata/gen_models.py
// SCRFD_PLANTED) for a 1280x720 image, which insightface scales by 0.5 to
// 640x360 at the canvas' top-left: the stride-16 anchor centred on (320,
// 160) with distances 3, 4, 5, 6 strides is the box x 272-400, y 96-256 of
// the input, so x 544-800, y 192-512 in the image; its keypoints are the
// centre plus the planted offsets times 16, divided by 0.5. The overlapping
// weaker face is suppressed and the 0.3 one is below the threshold.
func TestSCRFDPlanted(t *testing.T) {
	f := loadSCRFDTest(t)
	if f.EmbeddingDim() != 512 || len(f.strides) != 3 || f.anchorsPer != 2 || !f.kps {
		t.Fatalf("dim %d strides %v anchors %d kps %v", f.EmbeddingDim(), f.strides, f.anchorsPer, f.kps)
	}
	img := image.NewRGBA(image.Rect(0, 0, 1280, 720))
	got, err := f.Faces(context.Background(), engine.FaceRequest{Image: img, Embeddings: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("got %d faces, want 1: %+v", len(got), got)
	}
	face := got[0]
	wantBox := [4]float32{544, 192, 256, 320}
	wantKps := [][2]float32{{608, 288}, {672, 288}, {640, 320}, {614.4, 352}, {665.6, 352}}
	if !near(face.Confidence, 0.95) {
		t.Errorf("confidence %v, want 0.95", face.Confidence)
	}
	for i := range wantBox {
		if !near(face.Box[i], wantBox[i]) {
			t.Errorf("box %v, want %v", face.Box, wantBox)
			break
		}
	}
	if len(face.Landmarks) != 5 {
		t.Fatalf("landmarks %v", face.Landmarks)
	}
	for i, p := range wantKps {
		if !near(face.Landmarks[i][0], p[0]) || !near(face.Landmarks[i][1], p[1]) {
			t.Errorf("landmark %d = %v, want %v", i, face.Landmarks[i], p)
		}
	}
	if len(face.Embedding) != 512 {
		t.Errorf("embedding of %d values", len(face.Embedding))
	}
}

// pattern is a 112x112 picture in the ArcFace frame: red grows left to
// right, green top to bottom, blue is a checkerboard.
func pattern() *image.RGBA {
	p := image.NewRGBA(image.Rect(0, 0, arcSize, arcSize))
	for y := range arcSize {
		for x := range arcSize {
			o := p.PixOffset(x, y)
			p.Pix[o], p.Pix[o+1] = uint8(x*255/111), uint8(y*255/111)
			if (x/14+y/14)%2 == 0 {
				p.Pix[o+2] = 200
			}
			p.Pix[o+3] = 255
		}
	}
	return p
}

// TestArcFaceAlignment puts the pattern into a bigger picture turned by
// 25°, scaled by 1.7 and moved (sampled through the inverse transform);
// aligning it from the template points mapped the same way must give the
// pattern back, and the embedding (the pooled aligned crop) must match the
// pattern's own; keypoints off by a few pixels must not.
func TestArcFaceAlignment(t *testing.T) {
	f := loadSCRFDTest(t)
	p := pattern()
	const scale, angle, tx, ty = 1.7, 25 * math.Pi / 180, 150.0, 60.0
	c, s := scale*math.Cos(angle), scale*math.Sin(angle)
	fwd := func(x, y float64) (float64, float64) { return c*x - s*y + tx, s*x + c*y + ty }
	big := image.NewRGBA(image.Rect(0, 0, 400, 360))
	for y := range 360 {
		for x := range 400 {
			// Inverse transform, nearest pattern pixel.
			u, v := float64(x)-tx, float64(y)-ty
			px := (c*u + s*v) / (scale * scale)
			py := (-s*u + c*v) / (scale * scale)
			ix, iy := int(math.Round(px)), int(math.Round(py))
			if ix < 0 || iy < 0 || ix >= arcSize || iy >= arcSize {
				continue
			}
			copy(big.Pix[big.PixOffset(x, y):big.PixOffset(x, y)+4], p.Pix[p.PixOffset(ix, iy):])
		}
	}
	kps := make([][2]float32, 5)
	ident := make([][2]float32, 5)
	for i, q := range arcTemplate {
		x, y := fwd(q[0], q[1])
		kps[i] = [2]float32{float32(x), float32(y)}
		ident[i] = [2]float32{float32(q[0]), float32(q[1])}
	}
	crop := make([]float32, 3*arcSize*arcSize)
	alignFace(big, kps, crop)
	want := make([]float32, len(crop))
	alignFace(p, ident, want)
	var diff float64
	for i := range crop {
		diff += math.Abs(float64(crop[i] - want[i]))
	}
	diff /= float64(len(crop))
	t.Logf("aligned crop vs pattern: mean difference %.4f (of 2)", diff)
	if diff > 0.05 {
		t.Errorf("aligned crop differs from the pattern by %.3f on average", diff)
	}
	ctx := context.Background()
	embed := func(img *image.RGBA, k [][2]float32) []float32 {
		v, err := f.embed(ctx, img, []scrfdFace{{kps: k}})
		if err != nil {
			t.Fatal(err)
		}
		return v[0]
	}
	ref := embed(p, ident)
	dist := func(a, b []float32) float64 {
		var d float64
		for i := range a {
			d = math.Max(d, math.Abs(float64(a[i]-b[i])))
		}
		return d
	}
	good := dist(embed(big, kps), ref)
	off := make([][2]float32, 5)
	for i, k := range kps {
		off[i] = [2]float32{k[0] + 12, k[1] - 9}
	}
	bad := dist(embed(big, off), ref)
	t.Logf("embedding max difference: aligned %.4f, keypoints off by 15 px %.4f", good, bad)
	if good > 0.01 || bad < 3*good {
		t.Errorf("aligned embedding differs by %.4f (misaligned %.4f)", good, bad)
	}
}

// TestSimilarity checks the fitted transform on exact similar points.
func TestSimilarity(t *testing.T) {
	src := make([][2]float32, 5)
	for i, q := range arcTemplate {
		// dst = template; src = template scaled by 0.5, turned -30°, moved.
		a := -30 * math.Pi / 180
		x, y := q[0]*0.5, q[1]*0.5
		src[i] = [2]float32{float32(x*math.Cos(a) - y*math.Sin(a) + 10), float32(x*math.Sin(a) + y*math.Cos(a) - 4)}
	}
	m := similarity(src, arcTemplate)
	for i, p := range src {
		x := m[0]*float64(p[0]) + m[1]*float64(p[1]) + m[2]
		y := m[3]*float64(p[0]) + m[4]*float64(p[1]) + m[5]
		if math.Abs(x-arcTemplate[i][0]) > 1e-3 || math.Abs(y-arcTemplate[i][1]) > 1e-3 {
			t.Errorf("point %d maps to (%.4f, %.4f), want %v", i, x, y, arcTemplate[i])
		}
	}
}

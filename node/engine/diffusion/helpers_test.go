package diffusion

import (
	"encoding/json"
	"image"
	"image/color"
	"image/draw"
	"os"
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// loadTiny loads one generated pipeline from its manifest on rt.
func loadTiny(t testing.TB, rt *onnx.Runtime, name string) *Engine {
	t.Helper()
	dir := onnxtest.AssetDir(t, name, "manifest.json", "model_index.json")
	raw, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		ID      string            `json:"id"`
		Task    string            `json:"task"`
		Files   map[string]string `json:"files"`
		Options map[string]string `json:"options"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	e, err := Load(rt, engine.Spec{ID: m.ID, Task: engine.Task(m.Task), Dir: dir, Files: m.Files, Options: m.Options})
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// photo is a real photograph from Go's image/testdata (150x103).
func photo(t testing.TB) *image.NRGBA {
	t.Helper()
	img, err := decodePNG(onnxtest.GoTestdata(t, "video-001.png"))
	if err != nil {
		t.Fatal(err)
	}
	return toNRGBA(img)
}

// solid is a w x h picture of one colour.
func solid(w, h int, c color.NRGBA) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for i := 0; i < len(img.Pix); i += 4 {
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = c.R, c.G, c.B, c.A
	}
	return img
}

func seed(v int64) *int64 { return &v }

func f64(v float64) *float64 { return &v }

// sameImages reports whether two image lists are identical pixel for pixel.
func sameImages(a, b []*image.NRGBA) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Rect != b[i].Rect || string(a[i].Pix) != string(b[i].Pix) {
			return false
		}
	}
	return true
}

// maxDiff is the largest channel difference between two same-size images
// over the pixels where keep is true (all when keep is nil).
func maxDiff(a, b *image.NRGBA, keep func(x, y int) bool) int {
	m := 0
	for y := range a.Rect.Dy() {
		for x := range a.Rect.Dx() {
			if keep != nil && !keep(x, y) {
				continue
			}
			for c := range 4 {
				d := int(a.Pix[y*a.Stride+4*x+c]) - int(b.Pix[y*b.Stride+4*x+c])
				m = max(m, d, -d)
			}
		}
	}
	return m
}

// loadISNet loads the real ISNet background remover scripts/assets.sh
// installs.
func loadISNet(t testing.TB, rt *onnx.Runtime) engine.BackgroundRemover {
	t.Helper()
	dir := onnxtest.AssetDir(t, "isnet", "model.onnx")
	e, err := rt.LoadBackgroundRemover(engine.Spec{ID: "isnet", Task: engine.TaskBackgroundRemoval, Dir: dir,
		Files: map[string]string{"model": "model.onnx"}, Options: map[string]string{"input_size": "1024"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// drawOver composites l over dst (alpha "over").
func drawOver(dst *image.RGBA, l *image.NRGBA) {
	draw.Draw(dst, dst.Rect, l, l.Rect.Min, draw.Over)
}

package vision

import (
	"context"
	"fmt"
	"image"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// testModelDir copies the generated model testdata/model into a temporary
// folder with a labels file of n class names "class-0" ... and returns it.
func testModelDir(t testing.TB, model string, n int) string {
	t.Helper()
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join("testdata", model))
	if err != nil {
		t.Fatalf("generated model: %v (run testdata/gen_models.py)", err)
	}
	if err := os.WriteFile(filepath.Join(dir, model), b, 0o644); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := range n {
		names = append(names, fmt.Sprintf("class-%d", i))
	}
	if err := os.WriteFile(filepath.Join(dir, "labels.txt"), []byte(strings.Join(names, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func loadYOLOTest(t testing.TB, model string) engine.Detector {
	t.Helper()
	d, err := LoadDetector(onnxtest.Runtime(t), engine.Spec{
		ID: "onnx/yolo/test", Task: engine.TaskObjectDetection, Dir: testModelDir(t, model, 80),
		Files:   map[string]string{"model": model, "labels": "labels.txt"},
		Options: map[string]string{"format": "yolov8"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestYOLOPlanted decodes a model whose output0 holds three planted
// anchors (testdata/gen_models.py PLANTED) for a 1280x720 image: the
// letterbox scale is 0.5 with 140 grey rows above, so the planted box
// centre (320, 300) size 200x100 in input pixels is x 440-840, y 220-420
// in the image; the overlapping weaker box is suppressed and the third
// scores below the default threshold.
func TestYOLOPlanted(t *testing.T) {
	d := loadYOLOTest(t, "yolo_planted.onnx")
	img := image.NewRGBA(image.Rect(0, 0, 1280, 720))
	got, err := d.Detect(context.Background(), engine.DetectRequest{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	want := []engine.Detection{{Label: "class-16", Confidence: 0.9, Box: [4]float32{440, 220, 400, 200}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	got, err = d.Detect(context.Background(), engine.DetectRequest{Image: img, ConfidenceThreshold: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	// Centre (100, 200) size 50x50 in input pixels: x 75/0.5, y (175-140)/0.5.
	want = append(want, engine.Detection{Label: "class-2", Confidence: 0.2, Box: [4]float32{150, 70, 100, 100}})
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("threshold 0.1: got %+v, want %+v", got, want)
	}
}

// TestYOLOLetterbox checks the letterbox against Ultralytics' rule and the
// input the pipeline builds: grey 114 bars, the image in between.
func TestYOLOLetterbox(t *testing.T) {
	for _, tc := range []struct {
		w, h int
		want letterbox
	}{
		{1280, 720, letterbox{r: 0.5, left: 0, top: 140, newW: 640, newH: 360}},
		{512, 512, letterbox{r: 1.25, left: 0, top: 0, newW: 640, newH: 640}},
		{300, 641, letterbox{r: 640.0 / 641, left: 170, top: 0, newW: 300, newH: 640}},
	} {
		if got := ultralyticsLetterbox(tc.w, tc.h, 640); got != tc.want {
			t.Errorf("%dx%d: %+v, want %+v", tc.w, tc.h, got, tc.want)
		}
	}
	img := image.NewRGBA(image.Rect(0, 0, 1280, 720))
	for i := range img.Pix {
		img.Pix[i] = 255
	}
	in := make([]float32, 3*640*640)
	fillLetterbox(img, ultralyticsLetterbox(1280, 720, 640), 640, yoloPad, 1.0/255, in)
	for _, p := range []struct {
		x, y int
		want float32
	}{{0, 0, 114.0 / 255}, {639, 139, 114.0 / 255}, {0, 140, 1}, {639, 499, 1}, {320, 500, 114.0 / 255}} {
		for c := range 3 {
			if v := in[c*640*640+p.y*640+p.x]; v < p.want-1e-5 || v > p.want+1e-5 {
				t.Errorf("input (%d,%d) channel %d = %v, want %v", p.x, p.y, c, v, p.want)
			}
		}
	}
}

// TestYOLORandom runs a random-weight model of the real export's I/O on a
// photo: boxes inside the image, sorted, deterministic.
func TestYOLORandom(t *testing.T) {
	d := loadYOLOTest(t, "yolo_random.onnx")
	img := photo(t, "coffee.png")
	a, err := d.Detect(context.Background(), engine.DetectRequest{Image: img, ConfidenceThreshold: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if len(a) == 0 {
		t.Fatal("no detection from the random model")
	}
	for i, x := range a {
		checkInside(t, x.Label, x.Box, img.Bounds().Dx(), img.Bounds().Dy())
		if i > 0 && x.Confidence > a[i-1].Confidence {
			t.Errorf("not sorted: %v after %v", x.Confidence, a[i-1].Confidence)
		}
	}
	b, err := d.Detect(context.Background(), engine.DetectRequest{Image: img, ConfidenceThreshold: 0.5})
	if err != nil || !reflect.DeepEqual(a, b) {
		t.Errorf("second run differs (%v): %d vs %d detections", err, len(a), len(b))
	}
}

// TestCOCONames: a YOLO spec without a labels file uses the 80 COCO names
// in Ultralytics' order.
func TestCOCONames(t *testing.T) {
	n := cocoNames()
	if len(n) != 80 || n[0] != "person" || n[3] != "motorcycle" || n[9] != "traffic light" || n[41] != "cup" || n[79] != "toothbrush" {
		t.Fatalf("%d names: %q", len(n), n)
	}
}

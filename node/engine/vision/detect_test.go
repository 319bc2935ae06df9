package vision

import (
	"context"
	"errors"
	"image"
	"math"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// rectIoU is the intersection over union of an x, y, w, h box and a
// rectangle.
func rectIoU(b [4]float32, r image.Rectangle) float64 {
	a := [4]float32{b[0], b[1], b[0] + b[2], b[1] + b[3]}
	return float64(boxIoU(a, [4]float32{float32(r.Min.X), float32(r.Min.Y), float32(r.Max.X), float32(r.Max.Y)}))
}

// checkInside fails t unless box is a finite, non-empty box inside a w x h
// image.
func checkInside(t *testing.T, what string, box [4]float32, w, h int) {
	t.Helper()
	for _, v := range box {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("%s: box %v is not finite", what, box)
		}
	}
	if box[0] < 0 || box[1] < 0 || box[2] <= 0 || box[3] <= 0 || box[0]+box[2] > float32(w) || box[1]+box[3] > float32(h) {
		t.Errorf("%s: box %v is not inside the %dx%d image", what, box, w, h)
	}
}

// TestDetectPhotos runs CenterNet on skimage photos. The expected regions
// were measured by drawing the boxes and these rectangles on the photos and
// looking at them: the whole astronaut (left edge to the helmet), the cup
// with its handle, the motorcycle from wheel to wheel, the horse silhouette.
func TestDetectPhotos(t *testing.T) {
	d := loadDetector(t)
	for _, tc := range []struct {
		photo, label string
		region       image.Rectangle
	}{
		{"astronaut.png", "person", image.Rect(0, 0, 365, 512)},
		{"coffee.png", "cup", image.Rect(160, 15, 410, 290)},
		{"motorcycle_left.png", "motorcycle", image.Rect(100, 50, 690, 455)},
		{"horse.png", "horse", image.Rect(15, 10, 390, 318)},
	} {
		t.Run(tc.photo, func(t *testing.T) {
			img := photo(t, tc.photo)
			dets, err := d.Detect(context.Background(), engine.DetectRequest{Image: img})
			if err != nil {
				t.Fatal(err)
			}
			var best *engine.Detection
			for i, x := range dets {
				checkInside(t, x.Label, x.Box, img.Bounds().Dx(), img.Bounds().Dy())
				if x.Confidence < DefaultDetectionThreshold || x.Confidence > 1 {
					t.Errorf("%s: confidence %v outside [%v, 1]", x.Label, x.Confidence, DefaultDetectionThreshold)
				}
				if i > 0 && x.Confidence > dets[i-1].Confidence {
					t.Errorf("detections not sorted by confidence: %v after %v", x.Confidence, dets[i-1].Confidence)
				}
				if x.Label == tc.label && best == nil {
					best = &dets[i]
				}
			}
			if best == nil {
				t.Fatalf("no %q among %+v", tc.label, dets)
			}
			iou := rectIoU(best.Box, tc.region)
			t.Logf("%s %.2f box %.0f, IoU with %v: %.2f", best.Label, best.Confidence, best.Box, tc.region, iou)
			if iou < 0.6 {
				t.Errorf("%s box %v has IoU %.2f with the expected region %v, want >= 0.6", tc.label, best.Box, iou, tc.region)
			}
		})
	}
}

// TestDetectOptions checks thresholds, result caps and caller errors.
func TestDetectOptions(t *testing.T) {
	d := loadDetector(t)
	img := photo(t, "coffee.png")
	ctx := context.Background()
	all, err := d.Detect(ctx, engine.DetectRequest{Image: img, ConfidenceThreshold: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) < 3 {
		t.Fatalf("threshold 0.05 gave %d detections, want several", len(all))
	}
	one, err := d.Detect(ctx, engine.DetectRequest{Image: img, ConfidenceThreshold: 0.05, MaxResults: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(one) != 1 || one[0] != all[0] {
		t.Errorf("max_results 1 gave %+v, want the best of %+v", one, all[0])
	}
	none, err := d.Detect(ctx, engine.DetectRequest{Image: img, ConfidenceThreshold: 0.99})
	if err != nil || len(none) != 0 {
		t.Errorf("threshold 0.99: %+v, %v; want nothing", none, err)
	}
	for _, bad := range []struct {
		req   engine.DetectRequest
		param string
	}{
		{engine.DetectRequest{}, "image"},
		{engine.DetectRequest{Image: image.NewRGBA(image.Rect(0, 0, 0, 5))}, "image"},
		{engine.DetectRequest{Image: img, ConfidenceThreshold: -0.1}, "confidence_threshold"},
		{engine.DetectRequest{Image: img, ConfidenceThreshold: 1.5}, "confidence_threshold"},
		{engine.DetectRequest{Image: img, MaxResults: -1}, "max_results"},
		{engine.DetectRequest{Image: img, MaxResults: engine.MaxResultsLimit + 1}, "max_results"},
	} {
		_, err := d.Detect(ctx, bad.req)
		var ie *engine.InputError
		if !errors.As(err, &ie) || ie.Param != bad.param || !errors.Is(err, engine.ErrInvalidInput) {
			t.Errorf("Detect(%+v) = %v, want an InputError for %q", bad.req, err, bad.param)
		}
	}
	// Any image type and origin works: a Gray sub-image.
	sub := toGray(photo(t, "astronaut.png")).SubImage(image.Rect(10, 20, 300, 500))
	dets, err := d.Detect(ctx, engine.DetectRequest{Image: sub})
	if err != nil {
		t.Fatal(err)
	}
	if len(dets) == 0 || dets[0].Label != "person" {
		t.Errorf("grey crop of the astronaut: %+v, want a person first", dets)
	}
	for _, x := range dets {
		checkInside(t, x.Label, x.Box, 290, 480)
	}
}

func toGray(img image.Image) *image.Gray {
	b := img.Bounds()
	g := image.NewGray(b)
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			g.Set(x, y, img.At(x, y))
		}
	}
	return g
}

// TestDetectCancelAndClose checks that a cancelled context and a closed
// engine stop calls.
func TestDetectCancelAndClose(t *testing.T) {
	d, err := LoadDetector(onnxtest.Runtime(t), centerNetSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	img := photo(t, "horse.png")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Detect(ctx, engine.DetectRequest{Image: img}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want context.Canceled", err)
	}
	// A deadline that may fall while the network runs: the call either
	// finishes first or stops with the deadline (ORT's terminate flag);
	// which one depends on the machine's speed, so both are accepted and
	// the mid-run path itself is tested in onnx.RunCancellable's tests.
	ctx, cancel = context.WithTimeout(context.Background(), 40*time.Millisecond)
	defer cancel()
	if _, err := d.Detect(ctx, engine.DetectRequest{Image: img}); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("deadline during the run: %v, want success or context.DeadlineExceeded", err)
	}
	// The slot is usable again after a terminated run.
	if dets, err := d.Detect(context.Background(), engine.DetectRequest{Image: img}); err != nil || len(dets) == 0 {
		t.Errorf("after a cancelled run: %v, %v", dets, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Detect(context.Background(), engine.DetectRequest{Image: img}); !errors.Is(err, errClosed) {
		t.Errorf("after Close: %v, want errClosed", err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestLoadDetectorErrors checks that bad specs fail to load.
func TestLoadDetectorErrors(t *testing.T) {
	rt := onnxtest.Runtime(t)
	good := centerNetSpec(t)
	for name, mut := range map[string]func(*engine.Spec){
		"task":      func(s *engine.Spec) { s.Task = engine.TaskFaceDetection },
		"no model":  func(s *engine.Spec) { s.Files = map[string]string{"labels": "coco-labels.txt"} },
		"no labels": func(s *engine.Spec) { s.Files = map[string]string{"model": "centernet.onnx"} },
		"size":      func(s *engine.Spec) { s.Options = map[string]string{"input_size": "640"} },
		"threshold": func(s *engine.Spec) { s.Options = map[string]string{"confidence_threshold": "2"} },
		"wrong net": func(s *engine.Spec) {
			s.Files = map[string]string{"model": "../blazeface/faceres.onnx", "labels": "coco-labels.txt"}
		},
	} {
		spec := good
		spec.Options = nil
		mut(&spec)
		if d, err := LoadDetector(rt, spec); err == nil {
			d.Close()
			t.Errorf("%s: loaded", name)
		}
	}
}

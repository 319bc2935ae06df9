package vision

import (
	"bytes"
	"context"
	"encoding/base64"
	"image"
	"image/jpeg"
	"math"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/imagecodec"
)

// Tolerances of TestFastDecodeMatchesImageJPEG. The API decodes JPEGs with
// libjpeg-turbo into RGBA; before, image/jpeg decoded them to YCbCr and the
// pipelines converted that to RGBA. The pixels differ by rounding only
// (imagecodec's test: at most a few levels, mean 0.2), and a resize
// averages them, so model inputs move by at most those few levels
// (measured: max 4, mean 0.24). On the photos below that moved detection
// scores by at most 0.005 (matched boxes' IoU >= 0.98), the astronaut's
// face score by 0.0005 (IoU 0.997) and its embedding's cosine stayed
// 0.9999.
const (
	equivMaxInput  = 6    // largest input-tensor difference, 0..255 levels
	equivMeanInput = 0.35 // mean input-tensor difference
	equivScore     = 0.02 // largest detection-score difference
	equivIoU       = 0.95 // smallest IoU of matched boxes
	equivCosine    = 0.995
)

// jpegBoth encodes img as a quality-90 JPEG and decodes it the API's way
// (imagecodec: libjpeg-turbo in cgo builds) and the old way (image/jpeg).
func jpegBoth(t *testing.T, img image.Image) (fast, old image.Image) {
	t.Helper()
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, img, &jpeg.Options{Quality: 90}); err != nil {
		t.Fatal(err)
	}
	fast, _, err := imagecodec.DecodeBudgeted(context.Background(), "data:image/jpeg;base64,"+base64.StdEncoding.EncodeToString(buf.Bytes()), imagecodec.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if old, err = jpeg.Decode(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	return fast, old
}

// TestFastDecodeMatchesImageJPEG: on the skimage photos, the API's JPEG
// decoding gives CenterNet inputs within a few levels of image/jpeg's,
// the same detections (every detection of the old path scoring at least
// 0.05 above the threshold is found with the same label, a score within
// 0.02 and a box of IoU >= 0.95, and the counts agree), and on the
// astronaut the same face with the same embedding.
func TestFastDecodeMatchesImageJPEG(t *testing.T) {
	d := loadDetector(t).(*detector)
	ctx := context.Background()
	for _, name := range []string{"astronaut.png", "coffee.png", "motorcycle_left.png", "horse.png", "chelsea.png"} {
		fast, old := jpegBoth(t, photo(t, name))
		a, b := toRGBA(fast), toRGBA(old)
		w, h := float64(a.Rect.Dx()), float64(a.Rect.Dy())
		ta, tb := make([]float32, d.size*d.size*3), make([]float32, d.size*d.size*3)
		resampleWindow(a, 0, 0, w, h, d.size, d.size, ta, 1, 0)
		resampleWindow(b, 0, 0, w, h, d.size, d.size, tb, 1, 0)
		var maxD, sum float64
		for i := range ta {
			diff := math.Abs(float64(ta[i] - tb[i]))
			maxD, sum = max(maxD, diff), sum+diff
		}
		t.Logf("%s: inputs max difference %.3f, mean %.4f", name, maxD, sum/float64(len(ta)))
		if mean := sum / float64(len(ta)); maxD > equivMaxInput || mean > equivMeanInput {
			t.Errorf("%s: CenterNet inputs differ by up to %.2f (mean %.3f), want <= %v (%v)", name, maxD, mean, equivMaxInput, equivMeanInput)
		}
		got, err := d.Detect(ctx, engine.DetectRequest{Image: fast})
		if err != nil {
			t.Fatal(err)
		}
		want, err := d.Detect(ctx, engine.DetectRequest{Image: old})
		if err != nil {
			t.Fatal(err)
		}
		if diff := len(got) - len(want); diff < -1 || diff > 1 {
			t.Errorf("%s: %d detections, image/jpeg's path %d", name, len(got), len(want))
		}
		for _, x := range want {
			if x.Confidence < DefaultDetectionThreshold+0.05 {
				continue
			}
			found := false
			bestS, bestIoU := 1.0, 0.0
			for _, y := range got {
				xb := [4]float32{x.Box[0], x.Box[1], x.Box[0] + x.Box[2], x.Box[1] + x.Box[3]}
				yb := [4]float32{y.Box[0], y.Box[1], y.Box[0] + y.Box[2], y.Box[1] + y.Box[3]}
				if y.Label == x.Label && boxIoU(xb, yb) > 0.5 {
					bestS, bestIoU = min(bestS, math.Abs(float64(y.Confidence-x.Confidence))), max(bestIoU, float64(boxIoU(xb, yb)))
				}
				if y.Label == x.Label && math.Abs(float64(y.Confidence-x.Confidence)) <= equivScore && boxIoU(xb, yb) >= equivIoU {
					found = true
					break
				}
			}
			t.Logf("%s: %s %.3f: score difference %.4f, IoU %.4f", name, x.Label, x.Confidence, bestS, bestIoU)
			if !found {
				t.Errorf("%s: %s %.3f %v of image/jpeg's path not among %+v", name, x.Label, x.Confidence, x.Box, got)
			}
		}
	}

	f := loadFaces(t)
	fast, old := jpegBoth(t, photo(t, "astronaut.png"))
	got, err := f.Faces(ctx, engine.FaceRequest{Image: fast, Embeddings: true})
	if err != nil {
		t.Fatal(err)
	}
	want, err := f.Faces(ctx, engine.FaceRequest{Image: old, Embeddings: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(want) != 1 {
		t.Fatalf("astronaut faces: %d, image/jpeg's path %d; want 1", len(got), len(want))
	}
	gb := [4]float32{got[0].Box[0], got[0].Box[1], got[0].Box[0] + got[0].Box[2], got[0].Box[1] + got[0].Box[3]}
	wb := [4]float32{want[0].Box[0], want[0].Box[1], want[0].Box[0] + want[0].Box[2], want[0].Box[1] + want[0].Box[3]}
	var cos float64
	for i, v := range got[0].Embedding {
		cos += float64(v * want[0].Embedding[i])
	}
	t.Logf("astronaut face: score %.4f vs %.4f, IoU %.4f, embedding cosine %.5f", got[0].Confidence, want[0].Confidence, boxIoU(gb, wb), cos)
	if boxIoU(gb, wb) < equivIoU || math.Abs(float64(got[0].Confidence-want[0].Confidence)) > equivScore || cos < equivCosine {
		t.Errorf("astronaut face differs: %+v vs %+v (cosine %.4f)", got[0].Box, want[0].Box, cos)
	}
}

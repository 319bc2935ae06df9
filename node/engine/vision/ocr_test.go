package vision

import (
	"context"
	"errors"
	"image"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// ocrSpec is the spec of the ppocr folder's manifest.
func ocrSpec(t testing.TB) engine.Spec {
	t.Helper()
	files := map[string]string{
		"detector":   "ch_PP-OCRv4_det_infer.onnx",
		"recognizer": "ch_PP-OCRv4_rec_infer.onnx",
		"dictionary": "ppocr_keys_v1.txt",
	}
	return engine.Spec{
		ID:    "onnx/ppocr/v4",
		Task:  engine.TaskTextRecognition,
		Dir:   onnxtest.AssetDir(t, "ppocr", files["detector"], files["recognizer"], files["dictionary"]),
		Files: files,
	}
}

func loadOCR(t testing.TB) engine.TextReader {
	t.Helper()
	o, err := LoadOCR(onnxtest.Runtime(t), ocrSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	return o
}

// TestOCRPage reads skimage's page.png, a photo of a printed page (384x191,
// grey). The expected words were read off the picture by eye: the heading
// "Region-based segmentation", then "Let us first determine markers of the
// coins and the", "background. These markers are pixels that we can label",
// "unambiguously as either object or background. Here,", "the markers are
// found at the two extreme parts of the", "histogram of grey values:" and
// the code line ">>> markers = np.zeros_like(coins)".
func TestOCRPage(t *testing.T) {
	o := loadOCR(t)
	img := photo(t, "page.png")
	lines, err := o.Read(context.Background(), img)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, l := range lines {
		t.Logf("%.2f %v %q", l.Confidence, l.Box, l.Text)
		checkInside(t, l.Text, l.Box, img.Bounds().Dx(), img.Bounds().Dy())
		if l.Confidence < DefaultOCRDropScore || l.Confidence > 1 {
			t.Errorf("%q: confidence %v outside [%v, 1]", l.Text, l.Confidence, DefaultOCRDropScore)
		}
		all = append(all, l.Text)
	}
	text := strings.Join(all, "\n")
	if len(lines) == 0 || !strings.Contains(strings.ReplaceAll(lines[0].Text, " ", ""), "Region-basedsegmentation") {
		t.Errorf("first line is not the heading \"Region-based segmentation\":\n%s", text)
	}
	words := []string{"Region-based", "segmentation", "first", "determine", "markers", "coins", "background", "pixels", "label", "object", "histogram", "values"}
	var missing []string
	for _, w := range words {
		if !strings.Contains(text, w) {
			missing = append(missing, w)
		}
	}
	if len(missing) > 2 {
		t.Errorf("words %q not read; text:\n%s", missing, text)
	}
}

// rotate90 turns img a quarter turn clockwise.
func rotate90(img image.Image) *image.RGBA {
	b := img.Bounds()
	out := image.NewRGBA(image.Rect(0, 0, b.Dy(), b.Dx()))
	for y := range b.Dy() {
		for x := range b.Dx() {
			out.Set(b.Dy()-1-y, x, img.At(b.Min.X+x, b.Min.Y+y))
		}
	}
	return out
}

// TestOCRVertical reads the page turned a quarter turn clockwise: the
// lines stand vertically, so each box is cut out turned back (PaddleOCR's
// rot90 of tall crops) and the heading must still be read.
func TestOCRVertical(t *testing.T) {
	o := loadOCR(t)
	lines, err := o.Read(context.Background(), rotate90(photo(t, "page.png")))
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, l := range lines {
		all = append(all, l.Text)
	}
	text := strings.ReplaceAll(strings.Join(all, "\n"), " ", "")
	t.Logf("%d lines:\n%s", len(lines), strings.Join(all, "\n"))
	for _, w := range []string{"Region-basedsegmentation", "markers"} {
		if !strings.Contains(text, w) {
			t.Errorf("%q not read from the turned page", w)
		}
	}
}

// TestOCRErrors checks caller errors, cancellation and a blank image.
func TestOCRErrors(t *testing.T) {
	o := loadOCR(t)
	var ie *engine.InputError
	if _, err := o.Read(context.Background(), nil); !errors.As(err, &ie) || ie.Param != "image" {
		t.Errorf("nil image: %v", err)
	}
	blank := image.NewRGBA(image.Rect(0, 0, 200, 100))
	for i := range blank.Pix {
		blank.Pix[i] = 255
	}
	lines, err := o.Read(context.Background(), blank)
	if err != nil || len(lines) != 0 {
		t.Errorf("blank image: %v, %v; want no lines", lines, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := o.Read(ctx, photo(t, "page.png")); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

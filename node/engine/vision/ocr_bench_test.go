package vision

import (
	"context"
	"image"
	"image/color"
	"image/draw"
	"testing"
	"time"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
)

// page640 is skimage's page photo centred on a white 640x480 canvas.
func page640(b *testing.B) image.Image {
	canvas := image.NewRGBA(image.Rect(0, 0, 640, 480))
	draw.Draw(canvas, canvas.Rect, image.NewUniform(color.White), image.Point{}, draw.Src)
	draw.Draw(canvas, image.Rect(128, 144, 512, 335), photo(b, "page.png"), image.Point{}, draw.Src)
	return canvas
}

// bareDyn times one run of m on a copy-free tensor over in with shape.
func bareDyn(b *testing.B, m *dynModel, done chan struct{}, in []float32, shape ...int64) time.Duration {
	t, err := ort.NewTensor(ort.NewShape(shape...), in)
	if err != nil {
		b.Fatal(err)
	}
	defer t.Destroy()
	t0 := time.Now()
	outs, err := m.run(context.Background(), done, []ort.Value{t})
	d := time.Since(t0)
	if err != nil {
		b.Fatal(err)
	}
	destroyAll(outs)
	return d
}

// ocrTensors builds the detector input and one recogniser input per line
// as the pipeline does, for the bare runs.
func ocrTensors(b *testing.B, o *ocr, img image.Image) (det []float32, dw, dh int, recs [][]float32, widths []int) {
	src := toRGBA(img)
	dw, dh = o.detSize(640, 480)
	rgb := make([]float32, dw*dh*3)
	resampleWindow(src, 0, 0, 640, 480, dw, dh, rgb, 1, 0)
	det = make([]float32, len(rgb))
	for i := range dw * dh {
		for c := range 3 {
			det[c*dw*dh+i] = (rgb[3*i+2-c]/255 - ocrMean[c]) / ocrStd[c]
		}
	}
	boxes, err := o.detect(context.Background(), src)
	if err != nil || len(boxes) == 0 {
		b.Fatalf("bench page: %d boxes, %v", len(boxes), err)
	}
	for _, q := range boxes {
		cw, ch := q.sides()
		w := max(ocrRecMinWidth, int(48*cw/ch)+1)
		buf := make([]float32, 3*48*w)
		quadCrop(src, q, w, 48, w, buf)
		recs = append(recs, buf)
		widths = append(widths, w)
	}
	return det, dw, dh, recs, widths
}

// BenchmarkOCR640 times Read on a 640x480 picture of a printed page (six
// lines) against bare runs of the detector and the recogniser (one per
// line) on the same preprocessed tensors.
func BenchmarkOCR640(b *testing.B) {
	o := loadOCR(b).(*ocr)
	img := page640(b)
	det, dw, dh, recs, widths := ocrTensors(b, o, img)
	ctx := context.Background()
	interleaved(b, func() time.Duration {
		return timed(b, func() error { _, err := o.Read(ctx, img); return err })
	}, func() time.Duration {
		t := bareDyn(b, o.det, o.done, det, 1, 3, int64(dh), int64(dw))
		for i, r := range recs {
			t += bareDyn(b, o.rec, o.done, r, 1, 3, 48, int64(widths[i]))
		}
		return t
	})
}

// BenchmarkDescribe640 times Describe (detail "more": objects, faces, text,
// colours; the components run concurrently) on the 640x480 astronaut
// picture against bare sequential runs of CenterNet, BlazeFace and the OCR
// detector on the same preprocessed tensors.
func BenchmarkDescribe640(b *testing.B) {
	d := loadDescriber(b).(*composed)
	img := bench640(b, true)
	det := d.det.(*detector)
	fc := d.faces.(*faces)
	o := d.ocr.(*ocr)
	src := toRGBA(img)
	cn := make([]float32, det.size*det.size*3)
	resampleWindow(src, 0, 0, 640, 480, det.size, det.size, cn, 1, 0)
	bf := make([]float32, fc.size*fc.size*3)
	resampleWindow(src, 0, -80, 640, 640, fc.size, fc.size, bf, 1/127.5, -1)
	ocrDet, dw, dh, _, _ := ocrTensorsNoRec(o, src)
	ctx := context.Background()
	interleaved(b, func() time.Duration {
		return timed(b, func() error {
			_, err := d.Describe(ctx, engine.DescribeRequest{Image: img, Detail: engine.DetailMore})
			return err
		})
	}, func() time.Duration {
		return bareSlot(b, det.m, cn) + bareSlot(b, fc.det, bf) + bareDyn(b, o.det, o.done, ocrDet, 1, 3, int64(dh), int64(dw))
	})
}

// ocrTensorsNoRec is the OCR detector input for src.
func ocrTensorsNoRec(o *ocr, src *image.RGBA) ([]float32, int, int, int, int) {
	w, h := src.Rect.Dx(), src.Rect.Dy()
	dw, dh := o.detSize(w, h)
	rgb := make([]float32, dw*dh*3)
	resampleWindow(src, 0, 0, float64(w), float64(h), dw, dh, rgb, 1, 0)
	det := make([]float32, len(rgb))
	for i := range dw * dh {
		for c := range 3 {
			det[c*dw*dh+i] = (rgb[3*i+2-c]/255 - ocrMean[c]) / ocrStd[c]
		}
	}
	return det, dw, dh, 0, 0
}

// BenchmarkYOLO640 times Detect with the random-weight YOLO test model (the
// real export's I/O; its compute is tiny, so this measures the pipeline's
// own cost: letterbox, 8400-anchor decoding, NMS) against a bare run.
func BenchmarkYOLO640(b *testing.B) {
	y := loadYOLOTest(b, "yolo_random.onnx").(*yolo)
	img := bench640(b, false)
	ctx := context.Background()
	src := toRGBA(img)
	in := make([]float32, 3*640*640)
	fillLetterbox(src, ultralyticsLetterbox(640, 480, 640), 640, yoloPad, 1.0/255, in)
	interleaved(b, func() time.Duration {
		return timed(b, func() error { _, err := y.Detect(ctx, engine.DetectRequest{Image: img}); return err })
	}, func() time.Duration { return bareSlot(b, y.m, in) })
}

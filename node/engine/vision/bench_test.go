package vision

import (
	"context"
	"image"
	"image/color"
	"image/draw"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// bench640 is a 640x480 photo: for detection the motorcycle photo's top-left
// 640x480 pixels, for faces the astronaut centred on a grey 640x480 canvas
// (her top 480 rows).
func bench640(b *testing.B, faces bool) image.Image {
	if !faces {
		return photo(b, "motorcycle_left.png").(interface {
			SubImage(image.Rectangle) image.Image
		}).SubImage(image.Rect(0, 0, 640, 480))
	}
	canvas := image.NewRGBA(image.Rect(0, 0, 640, 480))
	draw.Draw(canvas, canvas.Rect, image.NewUniform(color.RGBA{128, 128, 128, 255}), image.Point{}, draw.Src)
	draw.Draw(canvas, image.Rect(64, 0, 576, 480), photo(b, "astronaut.png"), image.Point{}, draw.Src)
	return canvas
}

// report records the mean pipeline and bare-run latencies and their ratio.
func report(b *testing.B, pipeline, bare time.Duration) {
	n := float64(b.N)
	b.ReportMetric(pipeline.Seconds()*1e3/n, "pipeline-ms/op")
	b.ReportMetric(bare.Seconds()*1e3/n, "bare-ms/op")
	b.ReportMetric(float64(pipeline)/float64(bare), "ratio")
}

// BenchmarkDetect640 times Detect on a 640x480 photo (decode excluded:
// conversion, resize, the run, peak search, NMS) against a bare ONNX
// Runtime run of the same session on the same preprocessed tensor, one of
// each per iteration.
func BenchmarkDetect640(b *testing.B) {
	d := loadDetector(b).(*detector)
	img := bench640(b, false)
	ctx := context.Background()
	s, err := d.m.acquire(ctx, d.done)
	if err != nil {
		b.Fatal(err)
	}
	src := toRGBA(img)
	resampleWindow(src, 0, 0, 640, 480, d.size, d.size, s.in[0], 1, 0)
	input := append([]float32(nil), s.in[0]...)
	d.m.release(s)
	var pipeline, bare time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, err := d.Detect(ctx, engine.DetectRequest{Image: img}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		s, _ := d.m.acquire(ctx, d.done)
		copy(s.in[0], input)
		t2 := time.Now()
		if err := d.m.run(ctx, s, 1); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		d.m.release(s)
		pipeline += t1.Sub(t0)
		bare += t3.Sub(t2)
	}
	report(b, pipeline, bare)
}

// BenchmarkFaces640 times Faces with embeddings on a 640x480 photo with one
// face against bare runs of the detector and the embedder on the same
// preprocessed tensors (the letterboxed image and the face crop).
func BenchmarkFaces640(b *testing.B) {
	f := loadFaces(b).(*faces)
	img := bench640(b, true)
	ctx := context.Background()
	got, err := f.Faces(ctx, engine.FaceRequest{Image: img, Embeddings: true})
	if err != nil || len(got) != 1 {
		b.Fatalf("bench photo: %d faces, %v", len(got), err)
	}
	// The same tensors the pipeline builds.
	src := toRGBA(img)
	det := make([]float32, f.size*f.size*3)
	resampleWindow(src, 0, -80, 640, 640, f.size, f.size, det, 1/127.5, -1)
	crop := make([]float32, faceResSize*faceResSize*3)
	rotatedCrop(src, 320, 240, 200, 0, faceResSize, crop, 1, 0)
	var pipeline, bare time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, err := f.Faces(ctx, engine.FaceRequest{Image: img, Embeddings: true}); err != nil {
			b.Fatal(err)
		}
		pipeline += time.Since(t0)
		for _, m := range []struct {
			m  *model
			in []float32
		}{{f.det, det}, {f.emb, crop}} {
			s, _ := m.m.acquire(ctx, f.done)
			copy(s.in[0], m.in)
			t := time.Now()
			if err := m.m.run(ctx, s, 1); err != nil {
				b.Fatal(err)
			}
			bare += time.Since(t)
			m.m.release(s)
		}
	}
	report(b, pipeline, bare)
}

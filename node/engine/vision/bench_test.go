package vision

import (
	"context"
	"image"
	"image/color"
	"image/draw"
	"math"
	"slices"
	"syscall"
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

// interleaved runs pipeline and bare once per iteration, in alternating
// order so that load on a shared machine falls on both alike; each returns
// the time it measured. It reports the mean times, ratio (bare time over
// pipeline time: 1 = no overhead, the target is at least 0.9),
// ratio-median (the median of the per-iteration ratios, which one
// disturbed iteration cannot move), ratio-of-medians (median bare time
// over median pipeline time), ratio-min (the fastest bare time
// over the fastest pipeline time: each side's least disturbed run, the
// steadiest wall-clock figure on a loaded machine) and cpu-ratio, the same
// ratio in process CPU time (every thread, ORT's included), which waiting
// for a core on a loaded machine does not inflate.
func interleaved(b *testing.B, pipeline, bare func() time.Duration) {
	b.Helper()
	pipeline() // warm up: first-run allocations
	bare()
	var pT, bT time.Duration
	pMin, bMin := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
	var pCPU, bCPU time.Duration
	withCPU := func(f func() time.Duration, acc *time.Duration) time.Duration {
		c0 := cpuTime()
		d := f()
		*acc += cpuTime() - c0
		return d
	}
	ratios := make([]float64, 0, b.N)
	pTimes, bTimes := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		var tp, tb time.Duration
		if i%2 == 0 {
			tp = withCPU(pipeline, &pCPU)
			tb = withCPU(bare, &bCPU)
		} else {
			tb = withCPU(bare, &bCPU)
			tp = withCPU(pipeline, &pCPU)
		}
		pT, bT = pT+tp, bT+tb
		pMin, bMin = min(pMin, tp), min(bMin, tb)
		ratios = append(ratios, float64(tb)/float64(tp))
		pTimes, bTimes = append(pTimes, tp), append(bTimes, tb)
	}
	n := float64(b.N)
	b.ReportMetric(pT.Seconds()*1e3/n, "pipeline-ms/op")
	b.ReportMetric(bT.Seconds()*1e3/n, "bare-ms/op")
	b.ReportMetric(float64(bT)/float64(pT), "ratio")
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "ratio-median")
	slices.Sort(pTimes)
	slices.Sort(bTimes)
	b.ReportMetric(float64(bTimes[len(bTimes)/2])/float64(pTimes[len(pTimes)/2]), "ratio-of-medians")
	b.ReportMetric(float64(bMin)/float64(pMin), "ratio-min")
	b.ReportMetric(float64(bCPU)/float64(pCPU), "cpu-ratio")
}

// cpuTime is the CPU time the process has used (user and system, all
// threads).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// timed returns how long f took.
func timed(b *testing.B, f func() error) time.Duration {
	t0 := time.Now()
	if err := f(); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}

// BenchmarkDetect640 times Detect on a 640x480 photo (decode excluded:
// conversion, resize, the run, peak search, NMS) against a bare ONNX
// Runtime run of the same session on the same preprocessed tensor.
func BenchmarkDetect640(b *testing.B) {
	d := loadDetector(b).(*detector)
	img := bench640(b, false)
	ctx := context.Background()
	input := make([]float32, d.size*d.size*3)
	resampleWindow(toRGBA(img), 0, 0, 640, 480, d.size, d.size, input, 1, 0)
	interleaved(b, func() time.Duration {
		return timed(b, func() error { _, err := d.Detect(ctx, engine.DetectRequest{Image: img}); return err })
	}, func() time.Duration { return bareSlot(b, d.m, input) })
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
	interleaved(b, func() time.Duration {
		return timed(b, func() error { _, err := f.Faces(ctx, engine.FaceRequest{Image: img, Embeddings: true}); return err })
	}, func() time.Duration { return bareSlot(b, f.det, det) + bareSlot(b, f.emb, crop) })
}

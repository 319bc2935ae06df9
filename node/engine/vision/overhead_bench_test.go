package vision

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/imagecodec"
)

// The overhead benchmarks split a request into its parts and time each
// part alone, many times, keeping the fastest: the API's decoding of the
// JPEG data URL, the pipeline's Go pre-processing (conversion, resize,
// normalisation into the input tensor), its Go post-processing (peak or
// anchor decoding, NMS, face crops, box mapping), and the bare ONNX Runtime
// run(s) on the same tensors. The fastest time of each part is what it
// costs when nothing else disturbs it, so on a loaded machine these
// figures are far steadier than the end-to-end comparisons: ratio is
// bare / (bare + pre + post), the pipeline's efficiency, and api-ratio
// bare / (bare + decode + pre + post).

// fastest runs f n times and returns its fastest time.
func fastest(n int, f func()) time.Duration {
	best := time.Duration(math.MaxInt64)
	for range n {
		t0 := time.Now()
		f()
		best = min(best, time.Since(t0))
	}
	return best
}

// reportParts reports each part in ms and the two ratios.
func reportParts(b *testing.B, decode, pre, post, bare time.Duration) {
	ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 }
	b.ReportMetric(ms(decode), "decode-ms")
	b.ReportMetric(ms(pre), "pre-ms")
	b.ReportMetric(ms(post), "post-ms")
	b.ReportMetric(ms(bare), "bare-ms")
	b.ReportMetric(float64(bare)/float64(bare+pre+post), "ratio")
	b.ReportMetric(float64(bare)/float64(bare+decode+pre+post), "api-ratio")
}

// decodeTime is the fastest decoding of url as the API does it.
func decodeTime(b *testing.B, n int, url string) time.Duration {
	return fastest(n, func() {
		if _, _, err := imagecodec.DecodeBudgeted(context.Background(), url, imagecodec.Options{MaxBytes: 20 << 20}, nil); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkOverheadDetect640 splits a CenterNet request on the 640x480
// motorcycle crop.
func BenchmarkOverheadDetect640(b *testing.B) {
	d := loadDetector(b).(*detector)
	url, img := jpeg640(b, bench640(b, false))
	ctx := context.Background()
	in := make([]float32, d.size*d.size*3)
	s, err := d.m.acquire(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	resampleWindow(toRGBA(img), 0, 0, 640, 480, d.size, d.size, s.in[0], 1, 0)
	copy(in, s.in[0])
	if err := d.m.run(ctx, s, 1); err != nil {
		b.Fatal(err)
	}
	heat, sides := append([]float32(nil), s.out[0]...), append([]float32(nil), s.out[1]...)
	d.m.release(s)
	for range b.N {
		n := 20
		pre := fastest(n, func() {
			src := toRGBA(img)
			resampleWindow(src, 0, 0, 640, 480, d.size, d.size, in, 1, 0)
		})
		post := fastest(n, func() {
			keep := nmsClasswise(d.peaks(heat, sides, d.threshold), d.nms, engine.DefaultMaxResults)
			for _, c := range keep {
				clipBox(c.box[0], c.box[1], c.box[2], c.box[3], 640, 480)
			}
		})
		bare := fastest(n, func() { bareSlot(b, d.m, in) })
		reportParts(b, decodeTime(b, n, url), pre, post, bare)
	}
}

// BenchmarkOverheadFaces640 splits a BlazeFace + FaceRes request (one
// face, with its embedding) on the astronaut on a grey 640x480 canvas.
func BenchmarkOverheadFaces640(b *testing.B) {
	f := loadFaces(b).(*faces)
	url, img := jpeg640(b, bench640(b, true))
	ctx := context.Background()
	src := toRGBA(img)
	det := make([]float32, f.size*f.size*3)
	resampleWindow(src, 0, -80, 640, 640, f.size, f.size, det, 1/127.5, -1)
	s, err := f.det.acquire(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	copy(s.in[0], det)
	if err := f.det.run(ctx, s, 1); err != nil {
		b.Fatal(err)
	}
	outs := make([][]float32, len(s.out))
	for i, o := range s.out {
		outs[i] = append([]float32(nil), o...)
	}
	f.det.release(s)
	crop := make([]float32, faceResSize*faceResSize*3)
	emb := make([]float32, faceResDim)
	for range b.N {
		n := 20
		pre := fastest(n, func() {
			src := toRGBA(img)
			resampleWindow(src, 0, -80, 640, 640, f.size, f.size, det, 1/127.5, -1)
		})
		post := fastest(n, func() {
			raw := weightedNMS(f.decode(outs, f.threshold), f.nms, engine.DefaultMaxResults)
			if len(raw) != 1 {
				b.Fatalf("%d faces", len(raw))
			}
			r := raw[0]
			side := f.size * 2
			rotatedCrop(src, float64(r.box[0]+r.box[2])*float64(side)/2, float64(r.box[1]+r.box[3])*float64(side)/2, 200, 0.05, faceResSize, crop, 1, 0)
			normalize(emb)
		})
		bare := fastest(n, func() { bareSlot(b, f.det, det); bareSlot(b, f.emb, crop) })
		reportParts(b, decodeTime(b, n, url), pre, post, bare)
	}
}

// BenchmarkOverheadYOLO640 splits a request to the random-weight YOLO test
// model (the real export's I/O; its network is tiny, and with random
// weights thousands of anchors pass the threshold, so post-processing is
// at its worst).
func BenchmarkOverheadYOLO640(b *testing.B) {
	y := loadYOLOTest(b, "yolo_random.onnx").(*yolo)
	url, img := jpeg640(b, bench640(b, false))
	ctx := context.Background()
	lb := ultralyticsLetterbox(640, 480, y.size)
	in := make([]float32, 3*y.size*y.size)
	fillLetterbox(toRGBA(img), lb, y.size, yoloPad, 1.0/255, in)
	s, err := y.m.acquire(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	copy(s.in[0], in)
	if err := y.m.run(ctx, s, 1); err != nil {
		b.Fatal(err)
	}
	out := append([]float32(nil), s.out[0]...)
	y.m.release(s)
	for range b.N {
		n := 20
		pre := fastest(n, func() { fillLetterbox(toRGBA(img), lb, y.size, yoloPad, 1.0/255, in) })
		post := fastest(n, func() {
			nmsClasswise(decodeYOLO(out, len(y.labels), y.anchors, y.threshold), y.nms, engine.DefaultMaxResults)
		})
		bare := fastest(n, func() { bareSlot(b, y.m, in) })
		reportParts(b, decodeTime(b, n, url), pre, post, bare)
	}
}

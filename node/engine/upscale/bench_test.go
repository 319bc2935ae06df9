package upscale

import (
	"context"
	"image"
	"testing"
	"time"
)

// BenchmarkUpscale measures the whole pipeline on a 96×96 crop of the test
// photo (2×2 tiles of 64 with overlap 16) at x2 and x4 in output
// megapixels per second, and the pipeline's time against bare ONNX Runtime
// runs of the same tiles (ratio: pipeline / bare; the two alternate so
// load changes on a shared machine hit both). Since that ratio is noisy,
// the pipeline's own work (tiling, blending, pixel conversion) is also
// timed alone on the bare runs' outputs: own-ms and (bare+own)/bare. One
// untimed warm-up run of each comes first (ONNX Runtime's first run on a
// shape is slower).
//
//	go test ./node/engine/upscale/ -run '^$' -bench Upscale -benchtime 1x
func BenchmarkUpscale(b *testing.B) {
	e := loadThick(b, map[string]string{"tile": "64", "overlap": "16"})
	lr := readPhoto(b, image.Rect(200, 80, 296, 176))
	for _, s := range []int{2, 4} {
		m := e.models[s]
		b.Run("x"+string(rune('0'+s)), func(b *testing.B) {
			ctx := context.Background()
			src := toNRGBA(lr)
			w, h := src.Rect.Dx(), src.Rect.Dy()
			rgb := planes(src, e.rangeMax)
			xs, ys := spans(w, e.tile, e.overlap), spans(h, e.tile, e.overlap)
			tw, th := min(w, e.tile), min(h, e.tile)
			var tiles [][]float32
			for _, y0 := range ys {
				for _, x0 := range xs {
					in := make([]float32, 3*tw*th)
					fillTile(in, rgb, w, h, x0, y0, tw, th, m.nchw)
					tiles = append(tiles, in)
				}
			}
			var pipe, bare, post time.Duration
			outs := make([][]float32, len(tiles))
			for i := range b.N + 1 {
				// Alternate the order so load changes hit both alike.
				var tp, tb time.Duration
				for k := range 2 {
					t0 := time.Now()
					if (i+k)%2 == 0 {
						if _, err := e.Upscale(ctx, lr, s); err != nil {
							b.Fatal(err)
						}
						tp = time.Since(t0)
						continue
					}
					for j, in := range tiles {
						o, err := e.run(ctx, m, in, tw, th)
						if err != nil {
							b.Fatal(err)
						}
						outs[j] = o
					}
					tb = time.Since(t0)
				}
				// The pipeline's own work: tiles in, blending, PNG-ready
				// pixels out, on the outputs of the bare runs.
				t0 := time.Now()
				dst := image.NewNRGBA(image.Rect(0, 0, w*s, h*s))
				acc := newBlend(w*s, th*s)
				in := make([]float32, 3*tw*th)
				j := 0
				for _, y0 := range ys {
					acc.flush(dst, y0*s, e.rangeMax)
					for _, x0 := range xs {
						fillTile(in, rgb, w, h, x0, y0, tw, th, m.nchw)
						acc.add(outs[j], x0*s, y0*s, tw*s, th*s, m.nchw, weights(x0, tw, w, e.overlap, s), weights(y0, th, h, e.overlap, s))
						j++
					}
				}
				acc.flush(dst, h*s, e.rangeMax)
				tpost := time.Since(t0)
				if i == 0 { // warm-up
					b.ResetTimer()
					continue
				}
				pipe, bare, post = pipe+tp, bare+tb, post+tpost
			}
			mp := float64(w*s*h*s) / 1e6
			b.ReportMetric(mp*float64(b.N)/pipe.Seconds(), "out-MP/s")
			b.ReportMetric(float64(w*h)/1e6*float64(b.N)/pipe.Seconds(), "in-MP/s")
			b.ReportMetric(pipe.Seconds()/bare.Seconds(), "pipeline/bare")
			b.ReportMetric((bare+post).Seconds()/bare.Seconds(), "(bare+own)/bare")
			b.ReportMetric(post.Seconds()*1e3/float64(b.N), "own-ms")
			b.ReportMetric(float64(len(tiles)), "tiles")
		})
	}
}

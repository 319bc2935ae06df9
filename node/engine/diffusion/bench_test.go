package diffusion

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// BenchmarkDenoiseStep measures one denoising step of the pipeline (the
// scheduler, classifier-free guidance, tensor filling and the UNet run)
// against a bare ONNX Runtime loop over the same UNet calls on the same
// tensors, at 512x512 (64x64 latents): s/step of each and bare/pipeline
// (1 = no overhead; the target is >= 0.95). The two alternate so load
// changes on a shared machine hit both alike. tiny-sd runs guidance
// (batch 2, float32), tiny-sd-turbo one branch in float16 with ControlNet
// inputs. A whole text-to-image job (3 steps, VAE decode) is timed too,
// as s/image.
//
//	go test ./node/engine/diffusion/ -run '^$' -bench DenoiseStep -benchtime 20x
func BenchmarkDenoiseStep(b *testing.B) {
	rt := onnxtest.Runtime(b)
	for _, name := range []string{"tiny-sd", "tiny-sd-turbo"} {
		e := loadTiny(b, rt, name)
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			ro, err := ort.NewRunOptions()
			if err != nil {
				b.Fatal(err)
			}
			defer ro.Destroy()
			const size = 512
			lw := size / vaeFactor
			cond, err := e.encodeText(ctx, ro, "a photo of a cat")
			if err != nil {
				b.Fatal(err)
			}
			branches := []branch{{emb: cond}}
			var combine func([][]float32, []float32)
			if e.guidance > 1 {
				branches = []branch{{emb: cond}, {emb: cond}}
				combine = cfg2(float32(e.guidance))
			}
			d, err := e.newDenoiser(ro, lw, lw, branches, nil, nil, 1)
			if err != nil {
				b.Fatal(err)
			}
			defer d.destroy()
			d.combine = combine
			const steps = 4
			rng := rand.New(rand.NewPCG(1, 2))
			x := make([]float32, e.latentCh*lw*lw)
			var pipe, bare time.Duration
			for i := range b.N + 1 {
				var tp, tb time.Duration
				for k := range 2 {
					t0 := time.Now()
					if (i+k)%2 == 0 {
						s, err := newSampler(e.sched, steps, 1, rng)
						if err != nil {
							b.Fatal(err)
						}
						for j := range x {
							x[j] = float32(rng.NormFloat64())
						}
						t0 = time.Now()
						if err := d.run(ctx, s, x); err != nil {
							b.Fatal(err)
						}
						tp = time.Since(t0)
						continue
					}
					for range steps {
						for _, g := range d.groups {
							if err := e.unet.run(ctx, ro, g.ins, g.outs); err != nil {
								b.Fatal(err)
							}
						}
					}
					tb = time.Since(t0)
				}
				if i == 0 { // warm-up
					b.ResetTimer()
					continue
				}
				pipe, bare = pipe+tp, bare+tb
			}
			n := float64(b.N * steps)
			b.ReportMetric(pipe.Seconds()/n, "s/step")
			b.ReportMetric(bare.Seconds()/n, "bare-s/step")
			b.ReportMetric(bare.Seconds()/pipe.Seconds(), "bare/pipeline")
			b.StopTimer()
			t0 := time.Now()
			if _, err := e.RunImages(ctx, engine.ImageJob{Prompt: "a cat", N: 1, Width: size, Height: size, Steps: 3, Seed: seed(1)}); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(time.Since(t0).Seconds(), "s/image")
		})
	}
}

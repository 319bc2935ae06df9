package diffusion

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// minRounds is the fewest rounds a step benchmark runs, whatever b.N
// (plain `-bench .` runs the bench-sd ones with b.N = 1).
const minRounds = 10

// benchModel is the benchmark-only pipeline with an SD-width UNet that
// gen_tiny_sd.py --bench writes on first use (not by make assets).
const benchModel = "bench-sd"

// BenchmarkDenoiseStep measures denoising steps of the pipeline (the
// scheduler with its noise draws, classifier-free guidance, filling the
// input tensors and the UNet run) against a bare ONNX Runtime loop over the
// same UNet calls on the same tensors, at 512x512 (64x64 latents).
//
// Every round runs the pipeline and the bare loop once each, in
// alternating order, so load on a shared machine hits both alike. Reported:
// s/step and bare-s/step (medians over rounds), bare/pipeline (the median
// of the rounds' ratios; 1 = no overhead, the target is >= 0.95) and
// overhead-ms/step (the median of the rounds' differences).
//
// tiny-sd (guidance, batch 2, float32, Euler ancestral) and tiny-sd-turbo
// (one branch, float16, LCM, ControlNet residual inputs) have UNets of a
// millisecond, so they show the fixed Go work per step; they also time a
// whole 3-step text-to-image job as s/image (rounds of 4 steps). bench-sd
// (rounds of one step, so the pairs are close in time) has a UNet of SD
// 1.5's channel widths (see gen_tiny_sd.py --bench) and shows the ratio a
// real model sees.
//
//	go test ./node/engine/diffusion/ -run '^$' -bench DenoiseStep -benchtime 10x
func BenchmarkDenoiseStep(b *testing.B) {
	rt := onnxtest.Runtime(b)
	for _, c := range []struct {
		model string
		steps int
	}{{"tiny-sd", 4}, {"tiny-sd-turbo", 4}, {benchModel, 1}} {
		if c.model == benchModel {
			genBenchModel(b)
		}
		e := loadTiny(b, rt, c.model)
		b.Run(c.model, func(b *testing.B) {
			ctx := context.Background()
			ro, err := ort.NewRunOptions()
			if err != nil {
				b.Fatal(err)
			}
			defer ro.Destroy()
			d := benchDenoiser(b, e, ro)
			defer d.destroy()
			rounds := max(b.N, minRounds)
			pipe, bare := make([]float64, rounds), make([]float64, rounds)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := -1; i < rounds; i++ { // round -1 warms up
				var tp, tb float64
				for k := range 2 {
					if (i+k)%2 == 0 {
						tp = timePipeline(b, d, c.steps, rng)
					} else {
						tb = timeBare(b, d, e.unet, c.steps)
					}
				}
				if i >= 0 {
					pipe[i], bare[i] = tp, tb
				}
			}
			reportSteps(b, "", pipe, bare, c.steps)
			if c.model == benchModel {
				return
			}
			b.StopTimer()
			t0 := time.Now()
			if _, err := e.RunImages(ctx, engine.ImageJob{Prompt: "a cat", N: 1, Width: 512, Height: 512, Steps: 3, Seed: seed(1)}); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(time.Since(t0).Seconds(), "s/image")
		})
	}
}

// BenchmarkSpinning compares the UNet session with ONNX Runtime's default
// intra-op spinning against one made with
// AddSessionConfigEntry("session.intra_op.allow_spinning", "0"), on the same
// tensors: each round runs either session in turn (alternating which goes
// first), each after an untimed call, with its pipeline and bare loop runs
// in alternating order. Metrics as BenchmarkDenoiseStep's, with a
// "spin-" or "nospin-" prefix; bare-spin/nospin and pipeline-spin/nospin
// are ratios of median times (< 1: spinning is faster), *-cores-busy the
// process's CPU seconds per wall second over all pipeline runs.
//
//	go test ./node/engine/diffusion/ -run '^$' -bench Spinning -benchtime 10x
func BenchmarkSpinning(b *testing.B) {
	rt := onnxtest.Runtime(b)
	genBenchModel(b)
	for _, c := range []struct {
		model string
		steps int
	}{{"tiny-sd", 4}, {benchModel, 1}} {
		e := loadTiny(b, rt, c.model)
		spin := e.unet
		nospin, err := openWithConfig(rt, spin, map[string]string{"session.intra_op.allow_spinning": "0"})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.model, func(b *testing.B) {
			defer func() { e.unet = spin }()
			ro, err := ort.NewRunOptions()
			if err != nil {
				b.Fatal(err)
			}
			defer ro.Destroy()
			d := benchDenoiser(b, e, ro)
			defer d.destroy()
			sessions := []*component{spin, nospin}
			var t [4][]float64 // pipeline spin, bare spin, pipeline nospin, bare nospin
			var cpu, wall [4]float64
			rng := rand.New(rand.NewPCG(1, 2))
			for i := -1; i < max(b.N, minRounds); i++ {
				for k := range 2 {
					si := (i + 1 + k) % 2
					e.unet = sessions[si]
					// An untimed call first: the other session's threads
					// may still be spinning after its last run, which would
					// land on whichever run comes first.
					timeBare(b, d, e.unet, 1)
					for j := range 2 {
						r := 2*si + (i+1+j+(i+1)/2)%2
						c0, w0 := cpuSeconds(b), time.Now()
						var v float64
						if r%2 == 0 {
							v = timePipeline(b, d, c.steps, rng)
						} else {
							v = timeBare(b, d, e.unet, c.steps)
						}
						if i >= 0 {
							t[r] = append(t[r], v)
							cpu[r] += cpuSeconds(b) - c0
							wall[r] += time.Since(w0).Seconds()
						}
					}
				}
			}
			reportSteps(b, "spin-", t[0], t[1], c.steps)
			reportSteps(b, "nospin-", t[2], t[3], c.steps)
			b.ReportMetric(median(t[1])/median(t[3]), "bare-spin/nospin")
			b.ReportMetric(median(t[0])/median(t[2]), "pipeline-spin/nospin")
			b.ReportMetric(cpu[0]/wall[0], "spin-cores-busy")
			b.ReportMetric(cpu[2]/wall[2], "nospin-cores-busy")
		})
		if err := nospin.close(); err != nil {
			b.Fatal(err)
		}
	}
}

// cpuSeconds is the process's user and system CPU time so far.
func cpuSeconds(b *testing.B) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// genBenchModel writes the bench-sd pipeline into the model cache unless
// it is there (gen_tiny_sd.py --bench does nothing when it is current).
func genBenchModel(b *testing.B) {
	b.Helper()
	dir := filepath.Join(onnxtest.CacheDir(b), "models")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	out, err := exec.Command("/usr/bin/python3", filepath.Join("..", "..", "..", "testdata", "models", "gen_tiny_sd.py"),
		"--bench", dir).CombinedOutput()
	if err != nil {
		b.Fatalf("gen_tiny_sd.py --bench: %v\n%s", err, out)
	}
}

// benchDenoiser makes the denoiser of a 512x512 text-to-image job, with
// guidance when the model uses it.
func benchDenoiser(b *testing.B, e *Engine, ro *ort.RunOptions) *denoiser {
	b.Helper()
	ctx := context.Background()
	const lw = 512 / vaeFactor
	cond, err := e.encodeText(ctx, ro, "a photo of a cat")
	if err != nil {
		b.Fatal(err)
	}
	branches := []branch{{emb: cond}}
	var combine func([][]float32, []float32)
	if e.guidance > 1 {
		uncond, err := e.encodeText(ctx, ro, "")
		if err != nil {
			b.Fatal(err)
		}
		branches = []branch{{emb: uncond}, {emb: cond}}
		combine = cfg2(float32(e.guidance))
	}
	d, err := e.newDenoiser(ro, lw, lw, branches, nil, nil, 1)
	if err != nil {
		b.Fatal(err)
	}
	d.combine = combine
	return d
}

// timePipeline times the denoiser over a fresh sampler of steps steps from
// fresh noise (the noise drawn before the clock starts), in seconds.
func timePipeline(b *testing.B, d *denoiser, steps int, rng *rand.Rand) float64 {
	s, err := newSampler(d.e.sched, steps, 1, rng)
	if err != nil {
		b.Fatal(err)
	}
	x := make([]float32, d.e.latentCh*d.lw*d.lh)
	k := float32(s.initSigma())
	for j := range x {
		x[j] = float32(rng.NormFloat64()) * k
	}
	t0 := time.Now()
	if err := d.run(context.Background(), s, x); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0).Seconds()
}

// timeBare times steps rounds of the bare UNet calls of d's groups on
// unet, in seconds.
func timeBare(b *testing.B, d *denoiser, unet *component, steps int) float64 {
	ctx := context.Background()
	t0 := time.Now()
	for range steps {
		for _, g := range d.groups {
			if err := unet.run(ctx, d.ro, g.ins, g.outs); err != nil {
				b.Fatal(err)
			}
		}
	}
	return time.Since(t0).Seconds()
}

// reportSteps reports the per-step medians of paired pipeline and bare
// rounds (seconds per round of steps steps).
func reportSteps(b *testing.B, prefix string, pipe, bare []float64, steps int) {
	ratio, over := make([]float64, len(pipe)), make([]float64, len(pipe))
	for i := range pipe {
		ratio[i] = bare[i] / pipe[i]
		over[i] = (pipe[i] - bare[i]) / float64(steps) * 1e3
	}
	b.ReportMetric(median(pipe)/float64(steps), prefix+"s/step")
	b.ReportMetric(median(bare)/float64(steps), prefix+"bare-s/step")
	b.ReportMetric(median(ratio), prefix+"bare/pipeline")
	b.ReportMetric(median(over), prefix+"overhead-ms/step")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// openWithConfig opens c's graph again with the runtime's session options
// plus session config entries.
func openWithConfig(rt *onnx.Runtime, c *component, cfg map[string]string) (*component, error) {
	opts, err := rt.SessionOptions()
	if err != nil {
		return nil, err
	}
	defer opts.Destroy()
	for k, v := range cfg {
		if err := opts.AddSessionConfigEntry(k, v); err != nil {
			return nil, err
		}
	}
	sess, err := ort.NewDynamicAdvancedSession(c.path, ioNames(c.ins), ioNames(c.outs), opts)
	if err != nil {
		return nil, err
	}
	return &component{name: c.name, path: c.path, sess: sess, ins: c.ins, outs: c.outs}, nil
}

// BenchmarkStepGoWork times the Go work of one denoising step without the
// UNet run, at 512x512: filling the inputs, reading the predictions,
// guidance, the fresh noise and the scheduler step ("after-ms/step"), and
// the same work as the loop did it before it was optimised (refRun in
// step_test.go: "before-ms/step"), alternating, as medians. tiny-sd's step
// does what an SD 1.5 export's does (float32, guidance, Euler ancestral),
// tiny-sd-turbo's what an fp16 turbo export's does (LCM, 4 steps).
//
//	go test ./node/engine/diffusion/ -run '^$' -bench StepGoWork -benchtime 2000x
func BenchmarkStepGoWork(b *testing.B) {
	rt := onnxtest.Runtime(b)
	for _, model := range []string{"tiny-sd", "tiny-sd-turbo"} {
		e := loadTiny(b, rt, model)
		b.Run(model, func(b *testing.B) {
			ro, err := ort.NewRunOptions()
			if err != nil {
				b.Fatal(err)
			}
			defer ro.Destroy()
			d := benchDenoiser(b, e, ro)
			defer d.destroy()
			n := e.latentCh * d.lw * d.lh
			s, err := newSampler(e.sched, 4, 1, rand.New(rand.NewPCG(1, 2)))
			if err != nil {
				b.Fatal(err)
			}
			x := make([]float32, n)
			for j := range x {
				x[j] = float32(s.rng.NormFloat64())
			}
			// Real predictions in the output tensors.
			if err := d.predict(context.Background(), d.ro, s.inputScale(0), s.ts[0], x); err != nil {
				b.Fatal(err)
			}
			scaled := make([]float32, n)
			preds := [][]float32{make([]float32, n), make([]float32, n)}
			var after, before []float64
			b.ResetTimer()
			for it := range b.N {
				i := it % (len(s.ts) - 1) // LCM's last step draws no noise
				if i == 0 {
					for j := range x {
						x[j] = float32(s.rng.NormFloat64())
					}
				}
				k, t := s.inputScale(i), s.ts[i]
				t0 := time.Now()
				for _, g := range d.groups {
					d.fill(g, k, t, x)
					d.read(g)
				}
				pred := d.preds[0]
				if d.combine != nil {
					d.combine(d.preds, d.pred)
					pred = d.pred
				}
				if s.freshNoise(i) {
					s.drawNoise(d.noise)
				}
				s.step(i, x, pred, d.noise)
				t1 := time.Now()
				for j, v := range x {
					scaled[j] = v * k
				}
				for _, g := range d.groups {
					for bi := range g.count {
						plane := e.inChannels * d.lw * d.lh
						buf := append(append(make([]float32, 0, plane), scaled...), d.branches[g.first+bi].extra...)
						refSetAt(g.sample, bi, buf)
					}
					refSetTS(g.ts, t)
					for bi := range g.count {
						refGetAt(g.out, bi, preds[g.first+bi])
					}
				}
				pred = preds[0]
				if d.combine != nil {
					d.combine(preds, d.pred)
					pred = d.pred
				}
				refStep(s, i, x, pred)
				after = append(after, t1.Sub(t0).Seconds()*1e3)
				before = append(before, time.Since(t1).Seconds()*1e3)
			}
			b.ReportMetric(median(after), "after-ms/step")
			b.ReportMetric(median(before), "before-ms/step")
		})
	}
}

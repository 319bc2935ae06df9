package diffusion

import (
	"context"
	"fmt"

	ort "github.com/yalue/onnxruntime_go"
)

// encodeText runs the text encoder on one prompt and returns its
// [seq, hidden] embedding.
func (e *Engine) encodeText(ctx context.Context, ro *ort.RunOptions, prompt string) ([]float32, error) {
	ids, _ := e.tok.encode(prompt)
	shape := ort.NewShape(1, int64(len(ids)))
	var in ort.Value
	if e.idsType == ort.TensorElementDataTypeInt64 {
		t, err := ort.NewTensor(shape, ids)
		if err != nil {
			return nil, err
		}
		defer t.Destroy()
		in = t
	} else {
		i32 := make([]int32, len(ids))
		for i, v := range ids {
			i32[i] = int32(v)
		}
		t, err := ort.NewTensor(shape, i32)
		if err != nil {
			return nil, err
		}
		defer t.Destroy()
		in = t
	}
	out, err := newFTensor(e.text.outs[0].DataType, ort.NewShape(1, int64(len(ids)), int64(e.hidden)))
	if err != nil {
		return nil, err
	}
	defer out.destroy()
	if err := e.text.run(ctx, ro, []ort.Value{in}, []ort.Value{out.value()}); err != nil {
		return nil, err
	}
	emb := make([]float32, out.n)
	out.get(emb)
	return emb, nil
}

// vaeEncode maps a [3,h,w] image in [-1,1] to its unscaled latent mean
// [latentCh, h/8, w/8] (an encoder that returns mean and log-variance is
// read for the mean).
func (e *Engine) vaeEncode(ctx context.Context, ro *ort.RunOptions, img []float32, w, h int) ([]float32, error) {
	in, _ := e.vaeEnc.input("sample")
	dt, err := floatType(e.vaeEnc, in)
	if err != nil {
		return nil, err
	}
	it, err := newFTensor(dt, ort.NewShape(1, 3, int64(h), int64(w)))
	if err != nil {
		return nil, err
	}
	defer it.destroy()
	it.set(img)
	ch := staticDim(e.vaeEnc.outs[0], 1)
	if ch == 0 {
		ch = e.latentCh
	}
	lh, lw := h/vaeFactor, w/vaeFactor
	ot, err := newFTensor(e.vaeEnc.outs[0].DataType, ort.NewShape(1, int64(ch), int64(lh), int64(lw)))
	if err != nil {
		return nil, err
	}
	defer ot.destroy()
	if err := e.vaeEnc.run(ctx, ro, []ort.Value{it.value()}, []ort.Value{ot.value()}); err != nil {
		return nil, err
	}
	out := make([]float32, ot.n)
	ot.get(out)
	return out[:e.latentCh*lh*lw], nil
}

// vaeDecode maps scaled latents [latentCh, h/8, w/8] to a [3,h,w] image
// in [-1,1].
func (e *Engine) vaeDecode(ctx context.Context, ro *ort.RunOptions, lat []float32, w, h int) ([]float32, error) {
	in, _ := e.vaeDec.input("latent_sample")
	dt, err := floatType(e.vaeDec, in)
	if err != nil {
		return nil, err
	}
	lh, lw := h/vaeFactor, w/vaeFactor
	it, err := newFTensor(dt, ort.NewShape(1, int64(e.latentCh), int64(lh), int64(lw)))
	if err != nil {
		return nil, err
	}
	defer it.destroy()
	scaled := make([]float32, len(lat))
	for i, v := range lat {
		scaled[i] = v / e.vaeScale
	}
	it.set(scaled)
	ot, err := newFTensor(e.vaeDec.outs[0].DataType, ort.NewShape(1, 3, int64(h), int64(w)))
	if err != nil {
		return nil, err
	}
	defer ot.destroy()
	if err := e.vaeDec.run(ctx, ro, []ort.Value{it.value()}, []ort.Value{ot.value()}); err != nil {
		return nil, err
	}
	out := make([]float32, ot.n)
	ot.get(out)
	return out, nil
}

// branch is one classifier-free guidance branch of the UNet batch: its
// text embedding and the channels appended to the latents (nil: none).
type branch struct {
	emb   []float32
	extra []float32
}

// denoiser runs the denoising loop of one image: the UNet (and ControlNet)
// tensors are made once and reused by every step. A step writes the scaled
// latents straight into the UNet's input tensor and reads float32
// predictions where the UNet wrote them; it allocates nothing.
type denoiser struct {
	e *Engine
	// ro runs the last step (it may shrink the arenas at its end: see
	// RunImages); steps, when set, the steps before it.
	ro, steps *ort.RunOptions
	lw, lh    int
	branches  []branch
	// combine turns the branches' predictions into one (nil: the single
	// branch's).
	combine func(preds [][]float32, dst []float32)
	groups  []*unetGroup
	// preds are the branches' predictions: views of a float32 UNet
	// output, else buffers the float16 output is widened into.
	preds [][]float32
	pred  []float32
	// noise holds a step's fresh noise (ancestral and LCM samplers).
	noise []float32
	// control, when set, runs before the UNet at every step.
	control *controlNet
	cond    []float32 // control image [3,H,W] in 0..1
	cscale  float32
	// blend, when set, is called after every step with the step index
	// reached (mask-blend inpainting).
	blend func(x []float32, next int)
}

// unetGroup is the tensors of one UNet call: all branches at once, or
// one branch when the UNet's batch is fixed at 1.
type unetGroup struct {
	first, count int // branches
	sample       *ftensor
	ts           *timestepTensor
	ehs          *ftensor
	out          *ftensor
	residuals    []*ftensor
	// ControlNet inputs.
	cSample *ftensor
	cTS     *timestepTensor
	cEHS    *ftensor
	cCond   *ftensor
	cScale  *ftensor
	ins     []ort.Value
	outs    []ort.Value
	cIns    []ort.Value
	cOuts   []ort.Value
}

func (g *unetGroup) destroy() {
	for _, t := range []*ftensor{g.sample, g.ehs, g.out, g.cSample, g.cEHS, g.cCond, g.cScale} {
		t.destroy()
	}
	for _, t := range g.residuals {
		t.destroy()
	}
	g.ts.destroy()
	g.cTS.destroy()
}

// newDenoiser allocates the per-step tensors for branches at latent size
// lw x lh, with ControlNet cn (nil: none; zero residuals are fed when the
// UNet takes them), and writes what stays the same at every step: the
// text embeddings, the branches' extra channels, the control image.
func (e *Engine) newDenoiser(ro *ort.RunOptions, lw, lh int, branches []branch, cn *controlNet, cond []float32, cscale float32) (*denoiser, error) {
	d := &denoiser{e: e, ro: ro, lw: lw, lh: lh, branches: branches, control: cn, cond: cond, cscale: cscale}
	if e.rt.ShrinksArena() {
		// The steps before the last keep the arena: shrinking it after
		// every step would allocate the activations again at each.
		steps, err := ort.NewRunOptions()
		if err != nil {
			return nil, err
		}
		d.steps = steps
	}
	n := e.latentCh * lw * lh
	plane := e.inChannels * lw * lh
	d.pred = make([]float32, n)
	d.noise = make([]float32, n)
	d.preds = make([][]float32, len(branches))
	per := len(branches)
	if e.unetBatch1 {
		per = 1
	}
	for first := 0; first < len(branches); first += per {
		g, err := e.newGroup(first, per, lw, lh, cn)
		if err != nil {
			d.destroy()
			return nil, err
		}
		d.groups = append(d.groups, g)
		for k := range per {
			br := branches[first+k]
			g.ehs.setAt(k, br.emb)
			if g.cEHS != nil {
				g.cEHS.setAt(k, br.emb)
			}
			if len(br.extra) > 0 {
				g.sample.put(k*plane+n, br.extra)
			}
			if out := g.out.data(); out != nil {
				d.preds[first+k] = out[k*n : (k+1)*n]
			} else {
				d.preds[first+k] = make([]float32, n)
			}
		}
		if cn != nil {
			for k := range per {
				g.cCond.setAt(k, cond)
			}
			if g.cScale != nil {
				g.cScale.set([]float32{cscale})
			}
		}
	}
	return d, nil
}

func (e *Engine) newGroup(first, b, lw, lh int, cn *controlNet) (*unetGroup, error) {
	g := &unetGroup{first: first, count: b}
	ok := false
	defer func() {
		if !ok {
			g.destroy()
		}
	}()
	B, W, H := int64(b), int64(lw), int64(lh)
	sample, _ := e.unet.input("sample")
	ehs, _ := e.unet.input("encoder_hidden_states")
	tsIn, _ := e.unet.input("timestep")
	var err error
	if g.sample, err = newFTensor(sample.DataType, ort.NewShape(B, int64(e.inChannels), H, W)); err != nil {
		return nil, err
	}
	if g.ts, err = newTimestep(tsIn, b); err != nil {
		return nil, fmt.Errorf("unet: %w", err)
	}
	if g.ehs, err = newFTensor(ehs.DataType, ort.NewShape(B, int64(e.seqLen), int64(e.hidden))); err != nil {
		return nil, err
	}
	if g.out, err = newFTensor(e.unet.outs[0].DataType, ort.NewShape(B, int64(e.latentCh), H, W)); err != nil {
		return nil, err
	}
	g.ins = []ort.Value{}
	var resIdx []int
	for _, in := range e.unet.ins {
		switch in.Name {
		case "sample":
			g.ins = append(g.ins, g.sample.value())
		case "timestep":
			g.ins = append(g.ins, g.ts.value())
		case "encoder_hidden_states":
			g.ins = append(g.ins, g.ehs.value())
		default:
			resIdx = append(resIdx, len(g.ins))
			g.ins = append(g.ins, nil)
		}
	}
	g.outs = []ort.Value{g.out.value()}
	if len(e.unetExtra) > 0 {
		// The residual inputs: a ControlNet's outputs, or zeros.
		ref := cn
		if ref == nil {
			for _, c := range e.controls {
				ref = c
				break
			}
		}
		for i, name := range e.unetExtra {
			in, _ := e.unet.input(name)
			dv := int64(ref.divisors[i])
			t, err := newFTensor(in.DataType, ort.NewShape(B, int64(ref.channels[i]), (H+dv-1)/dv, (W+dv-1)/dv))
			if err != nil {
				return nil, err
			}
			g.residuals = append(g.residuals, t)
			g.ins[resIdx[i]] = t.value()
			g.cOuts = append(g.cOuts, t.value())
		}
	}
	if cn != nil {
		if err := g.controlInputs(e, cn, b, lw, lh); err != nil {
			return nil, err
		}
	}
	ok = true
	return g, nil
}

// controlInputs allocates the ControlNet's input tensors; its outputs are
// the group's residual tensors.
func (g *unetGroup) controlInputs(e *Engine, cn *controlNet, b, lw, lh int) error {
	B := int64(b)
	var err error
	for _, in := range cn.c.ins {
		var v ort.Value
		switch in.Name {
		case "sample":
			if g.cSample, err = newFTensor(in.DataType, ort.NewShape(B, int64(e.latentCh), int64(lh), int64(lw))); err != nil {
				return err
			}
			v = g.cSample.value()
		case "timestep":
			if g.cTS, err = newTimestep(in, b); err != nil {
				return fmt.Errorf("%s: %w", cn.c.name, err)
			}
			v = g.cTS.value()
		case "encoder_hidden_states":
			if g.cEHS, err = newFTensor(in.DataType, ort.NewShape(B, int64(e.seqLen), int64(e.hidden))); err != nil {
				return err
			}
			v = g.cEHS.value()
		case "controlnet_cond":
			if g.cCond, err = newFTensor(in.DataType, ort.NewShape(B, 3, int64(lh*vaeFactor), int64(lw*vaeFactor))); err != nil {
				return err
			}
			v = g.cCond.value()
		case "conditioning_scale":
			shape := ort.NewShape()
			if len(in.Dimensions) > 0 {
				shape = ort.NewShape(1)
			}
			if g.cScale, err = newFTensor(in.DataType, shape); err != nil {
				return err
			}
			v = g.cScale.value()
		default:
			return fmt.Errorf("%s: input %q is not a ControlNet input", cn.c.name, in.Name)
		}
		g.cIns = append(g.cIns, v)
	}
	return nil
}

func (d *denoiser) destroy() {
	for _, g := range d.groups {
		g.destroy()
	}
	if d.steps != nil {
		d.steps.Destroy()
		d.steps = nil
	}
}

// run denoises x in place along the sampler's timesteps.
func (d *denoiser) run(ctx context.Context, s *sampler, x []float32) error {
	for i, t := range s.ts {
		if err := ctx.Err(); err != nil {
			return err
		}
		// The step's fresh noise, drawn before the UNet runs. (Drawing it
		// on another goroutine during the run measured slower on a loaded
		// 2-core machine: ONNX Runtime's threads already fill the cores.)
		if s.freshNoise(i) {
			s.drawNoise(d.noise)
		}
		ro := d.ro
		if d.steps != nil && i < len(s.ts)-1 {
			ro = d.steps
		}
		if err := d.predict(ctx, ro, s.inputScale(i), t, x); err != nil {
			return err
		}
		pred := d.preds[0]
		if d.combine != nil {
			d.combine(d.preds, d.pred)
			pred = d.pred
		}
		s.step(i, x, pred, d.noise)
		if d.blend != nil {
			d.blend(x, i+1)
		}
	}
	return nil
}

// predict runs the UNet (after the ControlNet, when set) of every group on
// the latents x scaled by k at timestep t with run options ro, leaving
// the predictions in d.preds.
func (d *denoiser) predict(ctx context.Context, ro *ort.RunOptions, k float32, t float64, x []float32) error {
	for _, g := range d.groups {
		d.fill(g, k, t, x)
		if d.control != nil {
			if err := d.control.c.run(ctx, ro, g.cIns, g.cOuts); err != nil {
				return err
			}
			if g.cScale == nil && d.cscale != 1 {
				for _, rt := range g.residuals {
					rt.scale(d.cscale)
				}
			}
		}
		if err := d.e.unet.run(ctx, ro, g.ins, g.outs); err != nil {
			return err
		}
		d.read(g)
	}
	return nil
}

// fill writes a group's inputs of one step: the latents x scaled by k into
// every branch's sample (and the ControlNet's) and timestep t.
func (d *denoiser) fill(g *unetGroup, k float32, t float64, x []float32) {
	n := len(x)
	plane := d.e.inChannels * d.lw * d.lh
	g.sample.setScaled(0, x, k)
	for b := 1; b < g.count; b++ {
		g.sample.copyFrom(b*plane, g.sample, 0, n)
	}
	g.ts.set(t)
	if d.control == nil {
		return
	}
	for b := range g.count {
		if g.cSample.sameType(g.sample) {
			g.cSample.copyFrom(b*n, g.sample, 0, n)
		} else {
			g.cSample.setScaled(b*n, x, k)
		}
	}
	g.cTS.set(t)
}

// read makes a group's predictions available in d.preds: float32 ones are
// there already, float16 ones are widened.
func (d *denoiser) read(g *unetGroup) {
	if g.out.f16 == nil {
		return
	}
	for b := range g.count {
		g.out.getAt(b, d.preds[g.first+b])
	}
}

// cfg2 is classifier-free guidance over [uncond, cond].
func cfg2(g float32) func(p [][]float32, dst []float32) {
	return func(p [][]float32, dst []float32) {
		u, c := p[0], p[1]
		for i := range dst {
			dst[i] = u[i] + g*(c[i]-u[i])
		}
	}
}

// cfg3 is InstructPix2Pix guidance over [text+image, image only, neither].
func cfg3(g, ig float32) func(p [][]float32, dst []float32) {
	return func(p [][]float32, dst []float32) {
		t, im, u := p[0], p[1], p[2]
		for i := range dst {
			dst[i] = u[i] + g*(t[i]-im[i]) + ig*(im[i]-u[i])
		}
	}
}

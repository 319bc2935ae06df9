package diffusion

import (
	"context"
	"errors"
	"image"
	"math"
	"math/rand/v2"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
)

// Canny hysteresis thresholds (ControlNet's canny preprocessor).
const cannyLow, cannyHigh = 100, 200

// geometry resolves a job's source picture and output size: src is the
// picture at the output size (nil for text to image), mask the pixels to
// repaint at that size (nil: none).
func (e *Engine) geometry(job *engine.ImageJob) (src *image.NRGBA, mask []float32, w, h int, err error) {
	switch job.Operation {
	case engine.OpGenerate:
		w, h = job.Width, job.Height
		if w == 0 {
			w, h = e.defSize, e.defSize
		}
		return nil, nil, e.roundSide(w), e.roundSide(h), nil
	case engine.OpOutpaint:
		img := toNRGBA(job.Image)
		p := job.OutpaintPercent
		if p == 0 {
			p = engine.DefaultOutpaintPercent
		}
		iw, ih := img.Rect.Dx(), img.Rect.Dy()
		dx, dy := int(math.Round(float64(iw)*p/100)), int(math.Round(float64(ih)*p/100))
		w, h = iw+2*dx, ih+2*dy
		if w > maxSide || h > maxSide {
			return nil, nil, 0, 0, inputErr("outpaint_percent", "Extending %dx%d by %g%% per side gives %dx%d, above %d pixels per side.", iw, ih, p, w, h, maxSide)
		}
		src, mask = extendCanvas(img, w, h, dx, dy)
		return src, mask, w, h, nil
	}
	src = toNRGBA(job.Image)
	w, h = src.Rect.Dx(), src.Rect.Dy()
	if job.Width > 0 {
		w, h = job.Width, job.Height
		src = resize(src, w, h)
	}
	if job.Operation == engine.OpInpaint {
		mask = binaryMask(job.Mask, w, h)
	}
	return src, mask, w, h, nil
}

// resizeMask resamples a 0/1 mask to w x h (nearest pixel).
func resizeMask(m []float32, sw, sh, w, h int) []float32 {
	if sw == w && sh == h {
		return m
	}
	out := make([]float32, w*h)
	for y := range h {
		sy := min((2*y+1)*sh/(2*h), sh-1)
		for x := range w {
			out[y*w+x] = m[sy*sw+min((2*x+1)*sw/(2*w), sw-1)]
		}
	}
	return out
}

// diffuse runs a denoising operation: text to image, img2img, variations,
// inpaint, outpaint or edit, with optional ControlNet guidance.
func (e *Engine) diffuse(ctx context.Context, ro *ort.RunOptions, job *engine.ImageJob, seed int64) ([]*image.NRGBA, error) {
	src, mask, outW, outH, err := e.geometry(job)
	if err != nil {
		return nil, err
	}
	mw, mh := e.roundSide(outW), e.roundSide(outH)
	lw, lh := mw/vaeFactor, mh/vaeFactor
	steps := e.steps
	if job.Steps > 0 {
		steps = job.Steps
	}
	g := e.guidance
	if job.GuidanceScale != nil {
		g = *job.GuidanceScale
	}
	ig := e.imgGuide
	if job.ImageGuidanceScale != nil {
		ig = *job.ImageGuidanceScale
	}
	op := job.Operation
	pix2pix := op == engine.OpEdit && e.inChannels == 8
	inpaint := op == engine.OpInpaint || op == engine.OpOutpaint
	strength := 1.0
	switch {
	case pix2pix || op == engine.OpGenerate:
	case inpaint:
		if job.Strength != nil {
			strength = *job.Strength
		}
	default:
		strength = engine.DefaultStrength
		if job.Strength != nil {
			strength = *job.Strength
		}
	}
	var in *image.NRGBA
	var mmask []float32
	if src != nil {
		in = resize(src, mw, mh)
	}
	if mask != nil {
		mmask = resizeMask(mask, outW, outH, mw, mh)
	}
	cfg := g > 1
	if pix2pix {
		cfg = g > 1 && ig >= 1
	}
	cond, err := e.encodeText(ctx, ro, job.Prompt)
	if err != nil {
		return nil, err
	}
	var uncond []float32
	if cfg {
		if uncond, err = e.encodeText(ctx, ro, job.NegativePrompt); err != nil {
			return nil, err
		}
	}
	// x0: the picture's scaled latents, where the operation starts from or
	// keeps them.
	var x0 []float32
	if in != nil && !pix2pix && (strength < 1 || (inpaint && e.inChannels == 4)) {
		if x0, err = e.vaeEncode(ctx, ro, toCHW(in, -1, 1), mw, mh); err != nil {
			return nil, err
		}
		for i := range x0 {
			x0[i] *= e.vaeScale
		}
	}
	n := e.latentCh * lw * lh
	var extra, zeros []float32
	var lmask []float32
	switch e.inChannels {
	case 9:
		// Inpainting UNet: the latent mask and the masked picture's latents.
		pm := mmask
		if pm == nil {
			pm = make([]float32, mw*mh)
			for i := range pm {
				pm[i] = 1
			}
		}
		masked := make([]float32, 3*mw*mh)
		if in != nil {
			pix := toCHW(in, -1, 1)
			for c := range 3 {
				for i, m := range pm {
					if m == 0 {
						masked[c*mw*mh+i] = pix[c*mw*mh+i]
					}
				}
			}
		}
		ml, err := e.vaeEncode(ctx, ro, masked, mw, mh)
		if err != nil {
			return nil, err
		}
		lmask = latentMask(pm, mw, mh)
		extra = append(append(extra, lmask...), ml...)
		for i := len(lmask); i < len(extra); i++ {
			extra[i] *= e.vaeScale
		}
	case 8:
		if extra, err = e.vaeEncode(ctx, ro, toCHW(in, -1, 1), mw, mh); err != nil {
			return nil, err
		}
		zeros = make([]float32, len(extra))
	default:
		if mmask != nil {
			lmask = latentMask(mmask, mw, mh)
		}
	}
	var branches []branch
	var combine func([][]float32, []float32)
	switch {
	case pix2pix && cfg:
		branches = []branch{{cond, extra}, {uncond, extra}, {uncond, zeros}}
		combine = cfg3(float32(g), float32(ig))
	case cfg:
		branches = []branch{{uncond, extra}, {cond, extra}}
		combine = cfg2(float32(g))
	default:
		branches = []branch{{cond, extra}}
	}
	var cn *controlNet
	var ctl []float32
	cscale := float32(1)
	if job.ControlType != "" {
		cn = e.controls[job.ControlType]
		if ctl, err = e.controlImage(ctx, ro, job, mw, mh); err != nil {
			return nil, err
		}
		if job.ControlScale != nil {
			cscale = float32(*job.ControlScale)
		}
	}
	d, err := e.newDenoiser(ro, lw, lh, branches, cn, ctl, cscale)
	if err != nil {
		return nil, err
	}
	defer d.destroy()
	d.combine = combine
	out := make([]*image.NRGBA, 0, job.N)
	for i := range job.N {
		rng := rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15+uint64(i)))
		noise := make([]float32, n)
		for k := range noise {
			noise[k] = float32(rng.NormFloat64())
		}
		s, err := newSampler(e.sched, steps, strength, rng)
		if errors.Is(err, errNoSteps) {
			return nil, inputErr("strength", "'strength' %g leaves no denoising step of %d; raise it.", strength, steps)
		}
		if err != nil {
			return nil, err
		}
		x := make([]float32, n)
		if x0 == nil || strength >= 1 {
			k := float32(s.initSigma())
			for j, v := range noise {
				x[j] = v * k
			}
		} else {
			s.addNoise(x, x0, noise, 0)
		}
		d.blend = nil
		if e.inChannels == 4 && lmask != nil {
			// Mask-blend inpainting: outside the mask, the picture itself
			// at the noise level of the step reached.
			plane := lw * lh
			keep := make([]float32, n)
			d.blend = func(x []float32, next int) {
				s.addNoise(keep, x0, noise, next)
				for j := range x {
					if lmask[j%plane] == 0 {
						x[j] = keep[j]
					}
				}
			}
		}
		if err := d.run(ctx, s, x); err != nil {
			return nil, err
		}
		pix, err := e.vaeDecode(ctx, ro, x, mw, mh)
		if err != nil {
			return nil, err
		}
		img := resize(fromCHW(pix, mw, mh), outW, outH)
		if mask != nil {
			img = composite(src, img, mask)
		}
		out = append(out, img)
	}
	return out, nil
}

// controlImage prepares the ControlNet condition at mw x mh as [3,h,w] in
// [0,1]: the canny edges or the depth map of the control image (else of
// the job's image).
func (e *Engine) controlImage(ctx context.Context, ro *ort.RunOptions, job *engine.ImageJob, mw, mh int) ([]float32, error) {
	src := job.ControlImage
	if src == nil {
		src = job.Image
	}
	img := resize(toNRGBA(src), mw, mh)
	if job.ControlType == engine.ControlCanny {
		return grayPlanes(canny(img, cannyLow, cannyHigh)), nil
	}
	s := e.depthSize
	in, err := newFTensor(e.depth.ins[0].DataType, ort.NewShape(1, 3, int64(s), int64(s)))
	if err != nil {
		return nil, err
	}
	defer in.destroy()
	in.set(imagenetInput(img, s))
	shape := ort.NewShape(1, int64(s), int64(s))
	if len(e.depth.outs[0].Dimensions) == 4 {
		shape = ort.NewShape(1, 1, int64(s), int64(s))
	}
	out, err := newFTensor(e.depth.outs[0].DataType, shape)
	if err != nil {
		return nil, err
	}
	defer out.destroy()
	if err := e.depth.run(ctx, ro, []ort.Value{in.value()}, []ort.Value{out.value()}); err != nil {
		return nil, err
	}
	dv := make([]float32, out.n)
	out.get(dv)
	lo, hi := dv[0], dv[0]
	for _, v := range dv {
		lo, hi = min(lo, v), max(hi, v)
	}
	gray := image.NewNRGBA(image.Rect(0, 0, s, s))
	for i, v := range dv {
		q := uint8(0)
		if hi > lo {
			q = uint8(math.Round(float64((v - lo) / (hi - lo) * 255)))
		}
		gray.Pix[4*i], gray.Pix[4*i+1], gray.Pix[4*i+2], gray.Pix[4*i+3] = q, q, q, 0xff
	}
	return toCHW(resize(gray, mw, mh), 0, 1), nil
}

package diffusion

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// TestStepMatchesReference runs the denoising loop and a reference copy of
// the loop as it was before the per-step work was cut (scaled latents in a
// buffer copied into the input with the extra channels at every step,
// predictions copied out, fresh noise drawn inline, byte-wise float16
// conversion) on the same seeds, and wants the same latents bit for bit:
// float32 Euler ancestral with guidance, float16 LCM with a ControlNet,
// DDIM with InstructPix2Pix's three branches and extra channels, Euler on
// a 9-channel inpainting UNet.
func TestStepMatchesReference(t *testing.T) {
	rt := onnxtest.Runtime(t)
	ctx := context.Background()
	ro, err := ort.NewRunOptions()
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Destroy()
	const lw, lh = 12, 8
	for _, tc := range []struct {
		model, control string
		steps          int
	}{
		{"tiny-sd", "", 4},
		{"tiny-sd-turbo", engine.ControlCanny, 4},
		{"tiny-sd-pix2pix", "", 3},
		{"tiny-sd-inpaint", "", 3},
	} {
		e := loadTiny(t, rt, tc.model)
		cond, err := e.encodeText(ctx, ro, "a photo of a cat")
		if err != nil {
			t.Fatal(err)
		}
		uncond, err := e.encodeText(ctx, ro, "")
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(7, 8))
		normals := func(n int) []float32 {
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
			return v
		}
		n := e.latentCh * lw * lh
		extra := normals((e.inChannels - e.latentCh) * lw * lh)
		var branches []branch
		var combine func([][]float32, []float32)
		switch e.inChannels {
		case 8:
			branches = []branch{{cond, extra}, {uncond, extra}, {uncond, make([]float32, len(extra))}}
			combine = cfg3(3, 1.5)
		case 9:
			branches = []branch{{uncond, extra}, {cond, extra}}
			combine = cfg2(3)
		default:
			if e.guidance > 1 {
				branches = []branch{{uncond, nil}, {cond, nil}}
				combine = cfg2(float32(e.guidance))
			} else {
				branches = []branch{{cond, nil}}
			}
		}
		var cn *controlNet
		var ctl []float32
		if tc.control != "" {
			cn = e.controls[tc.control]
			ctl = normals(3 * lw * lh * vaeFactor * vaeFactor)
		}
		d, err := e.newDenoiser(ro, lw, lh, branches, cn, ctl, 0.7)
		if err != nil {
			t.Fatal(err)
		}
		d.combine = combine
		x0 := normals(n)
		var got, want []float32
		for k, run := range []func(context.Context, *denoiser, *sampler, []float32) error{
			func(ctx context.Context, d *denoiser, s *sampler, x []float32) error { return d.run(ctx, s, x) },
			refRun,
		} {
			s, err := newSampler(e.sched, tc.steps, 1, rand.New(rand.NewPCG(1, 2)))
			if err != nil {
				t.Fatal(err)
			}
			x := append([]float32(nil), x0...)
			if err := run(ctx, d, s, x); err != nil {
				t.Fatalf("%s: %v", tc.model, err)
			}
			if k == 0 {
				got = x
			} else {
				want = x
			}
		}
		d.destroy()
		same := 0
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: latent %d is %v, the reference %v", tc.model, i, got[i], want[i])
			}
			if got[i] == x0[i] {
				same++
			}
		}
		if same == n {
			t.Fatalf("%s: the loop left the latents unchanged", tc.model)
		}
	}
}

// TestHalfConversion checks the fast float16 conversions against the
// reference ones: every half, and float32s around every rounding boundary
// of every exponent.
func TestHalfConversion(t *testing.T) {
	for h := range 1 << 16 {
		got, want := f16ToF32(uint16(h)), refF16ToF32(uint16(h))
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("f16ToF32(%#04x) = %#08x, want %#08x", h, math.Float32bits(got), math.Float32bits(want))
		}
	}
	lows := []uint32{0, 1, 0x7ff, 0xfff, 0x1000, 0x1001, 0x17ff, 0x1fff, 0x0800, 0x1800}
	for hi := range uint32(1 << 19) {
		for _, lo := range lows {
			b := hi<<13 | lo
			if got, want := f32ToF16(math.Float32frombits(b)), refF32ToF16(math.Float32frombits(b)); got != want {
				t.Fatalf("f32ToF16(%#08x) = %#04x, want %#04x", b, got, want)
			}
		}
	}
}

// refRun is the denoising loop as it was before it was optimised; it uses
// the denoiser's tensors and sessions.
func refRun(ctx context.Context, d *denoiser, s *sampler, x []float32) error {
	e := d.e
	n := len(x)
	scaled := make([]float32, n)
	preds := make([][]float32, len(d.branches))
	for i := range preds {
		preds[i] = make([]float32, n)
	}
	combined := make([]float32, n)
	for i, t := range s.ts {
		k := s.inputScale(i)
		for j, v := range x {
			scaled[j] = v * k
		}
		for _, g := range d.groups {
			plane := e.inChannels * d.lw * d.lh
			for b := range g.count {
				br := d.branches[g.first+b]
				buf := append(append(make([]float32, 0, plane), scaled...), br.extra...)
				refSetAt(g.sample, b, buf)
			}
			refSetTS(g.ts, t)
			if d.control != nil {
				for b := range g.count {
					refSetAt(g.cSample, b, scaled)
				}
				refSetTS(g.cTS, t)
				outs := make([]ort.Value, len(g.residuals))
				for r, rt := range g.residuals {
					outs[r] = rt.value()
				}
				if err := d.control.c.run(ctx, d.ro, g.cIns, outs); err != nil {
					return err
				}
				if g.cScale == nil && d.cscale != 1 {
					for _, rt := range g.residuals {
						v := make([]float32, rt.n)
						refGetAt(rt, 0, v)
						for j := range v {
							v[j] *= d.cscale
						}
						refSetAt(rt, 0, v)
					}
				}
			}
			if err := e.unet.run(ctx, d.ro, g.ins, g.outs); err != nil {
				return err
			}
			for b := range g.count {
				refGetAt(g.out, b, preds[g.first+b])
			}
		}
		pred := preds[0]
		if d.combine != nil {
			d.combine(preds, combined)
			pred = combined
		}
		refStep(s, i, x, pred)
		if d.blend != nil {
			d.blend(x, i+1)
		}
	}
	return nil
}

func refSetAt(t *ftensor, k int, src []float32) {
	if t.f32 != nil {
		copy(t.f32.GetData()[k*len(src):], src)
		return
	}
	b := t.f16.GetData()[2*k*len(src):]
	for i, v := range src {
		h := refF32ToF16(v)
		b[2*i], b[2*i+1] = byte(h), byte(h>>8)
	}
}

func refGetAt(t *ftensor, k int, dst []float32) {
	if t.f32 != nil {
		copy(dst, t.f32.GetData()[k*len(dst):])
		return
	}
	b := t.f16.GetData()[2*k*len(dst):]
	for i := range dst {
		dst[i] = refF16ToF32(uint16(b[2*i]) | uint16(b[2*i+1])<<8)
	}
}

func refSetTS(t *timestepTensor, v float64) {
	if t.f == nil || t.f.sc != nil {
		t.set(v)
		return
	}
	vals := make([]float32, t.f.n)
	for i := range vals {
		vals[i] = float32(v)
	}
	refSetAt(t.f, 0, vals)
}

// refStep is sampler.step drawing its noise inline.
func refStep(s *sampler, i int, x, out []float32) {
	c := s.cfg
	if s.euler() {
		sg, next := s.sigmas[i], s.sigmas[i+1]
		var kx, ko float64
		switch c.Prediction {
		case predEpsilon:
			kx, ko = 1, -sg
		case predVelocity:
			kx, ko = 1/(sg*sg+1), -sg/math.Sqrt(sg*sg+1)
		default:
			kx, ko = 0, 1
		}
		if c.Class == schedEulerA {
			up := math.Sqrt(next * next * (sg*sg - next*next) / (sg * sg))
			down := math.Sqrt(math.Max(next*next-up*up, 0))
			dt := down - sg
			a := float32(1 + (1-kx)*dt/sg)
			b := float32(-ko * dt / sg)
			u := float32(up)
			for k := range x {
				x[k] = a*x[k] + b*out[k] + u*float32(s.rng.NormFloat64())
			}
			return
		}
		dt := next - sg
		a := float32(1 + (1-kx)*dt/sg)
		b := float32(-ko * dt / sg)
		for k := range x {
			x[k] = a*x[k] + b*out[k]
		}
		return
	}
	t := s.ts[i]
	at := c.alphaAt(t)
	var aprev float64
	switch {
	case c.Class == schedLCM && i+1 < len(s.ts):
		aprev = c.alphaAt(s.ts[i+1])
	case c.Class == schedLCM:
		aprev = 1
	case t-float64(s.stepGap) >= 0:
		aprev = c.alphaAt(t - float64(s.stepGap))
	case c.SetAlphaToOne == nil || *c.SetAlphaToOne:
		aprev = 1
	default:
		aprev = c.trainAlphasCumul[0]
	}
	sa, sb := math.Sqrt(at), math.Sqrt(1-at)
	var px, po, ex, eo float64
	switch c.Prediction {
	case predEpsilon:
		px, po, ex, eo = 1/sa, -sb/sa, 0, 1
	case predVelocity:
		px, po, ex, eo = sa, -sb, sb, sa
	default:
		px, po, ex, eo = 0, 1, 1/sb, -sa/sb
	}
	if c.Class == schedLCM {
		st := t * c.TimestepScaling
		const sd = 0.5
		cskip := sd * sd / (st*st + sd*sd)
		cout := st / math.Sqrt(st*st+sd*sd)
		last := i+1 >= len(s.ts)
		ca, cn := float32(math.Sqrt(aprev)), float32(math.Sqrt(1-aprev))
		for k := range x {
			x0 := float32(px)*x[k] + float32(po)*out[k]
			d := float32(cout)*x0 + float32(cskip)*x[k]
			if last {
				x[k] = d
			} else {
				x[k] = ca*d + cn*float32(s.rng.NormFloat64())
			}
		}
		return
	}
	ca, cn := float32(math.Sqrt(aprev)), float32(math.Sqrt(1-aprev))
	lim := float32(c.ClipSampleRange)
	for k := range x {
		x0 := float32(px)*x[k] + float32(po)*out[k]
		eps := float32(ex)*x[k] + float32(eo)*out[k]
		if c.ClipSample {
			x0 = min(max(x0, -lim), lim)
		}
		x[k] = ca*x0 + cn*eps
	}
}

// refF32ToF16 is the branchy float16 rounding the fast one replaced.
func refF32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int((b>>23)&0xff) - 127 + 15
	man := b & 0x7fffff
	switch {
	case (b>>23)&0xff == 0xff:
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp >= 0x1f:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		man |= 0x800000
		shift := uint(14 - exp)
		h := man >> shift
		rem := man & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(exp)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++
	}
	return sign | uint16(h)
}

// refF16ToF32 is the branchy float16 widening the fast one replaced.
func refF16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0 && man == 0:
		return math.Float32frombits(sign)
	case exp == 0:
		e := uint32(127 - 15 + 1)
		for man&0x400 == 0 {
			man <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (man&0x3ff)<<13)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | man<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

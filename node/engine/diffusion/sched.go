package diffusion

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
)

// schedConfig is the part of scheduler/scheduler_config.json the samplers
// read (diffusers' names and defaults).
type schedConfig struct {
	Class            string  `json:"_class_name"`
	BetaStart        float64 `json:"beta_start"`
	BetaEnd          float64 `json:"beta_end"`
	BetaSchedule     string  `json:"beta_schedule"`
	TrainSteps       int     `json:"num_train_timesteps"`
	Prediction       string  `json:"prediction_type"`
	Spacing          string  `json:"timestep_spacing"`
	StepsOffset      int     `json:"steps_offset"`
	SetAlphaToOne    *bool   `json:"set_alpha_to_one"`
	OriginalSteps    int     `json:"original_inference_steps"`
	TimestepScaling  float64 `json:"timestep_scaling"`
	ClipSample       bool    `json:"clip_sample"`
	ClipSampleRange  float64 `json:"clip_sample_range"`
	trainAlphasCumul []float64
}

// Scheduler kinds this package runs.
const (
	schedEuler    = "EulerDiscreteScheduler"
	schedEulerA   = "EulerAncestralDiscreteScheduler"
	schedDDIM     = "DDIMScheduler"
	schedLCM      = "LCMScheduler"
	predEpsilon   = "epsilon"
	predVelocity  = "v_prediction"
	predSample    = "sample"
	spacingLead   = "leading"
	spacingTrail  = "trailing"
	spacingLinear = "linspace"
)

// readSchedConfig parses and checks a scheduler config; an unknown class
// is refused (PNDM and LMS configs, as SD 1.5 ships, run as Euler, which
// samples the same model well and needs no history).
func readSchedConfig(path string) (*schedConfig, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("scheduler config: %w", err)
	}
	c := &schedConfig{BetaStart: 0.0001, BetaEnd: 0.02, BetaSchedule: "linear", TrainSteps: 1000,
		Prediction: predEpsilon, Spacing: spacingLead, OriginalSteps: 50, TimestepScaling: 10, ClipSampleRange: 1}
	if err := json.Unmarshal(raw, c); err != nil {
		return nil, fmt.Errorf("scheduler config %s: %w", path, err)
	}
	switch c.Class {
	case schedEuler, schedEulerA, schedDDIM, schedLCM:
	case "PNDMScheduler", "LMSDiscreteScheduler", "DPMSolverMultistepScheduler", "DDPMScheduler", "":
		c.Class = schedEuler
	default:
		return nil, fmt.Errorf("scheduler %q is not supported (Euler, Euler ancestral, DDIM, LCM)", c.Class)
	}
	switch c.Prediction {
	case predEpsilon, predVelocity, predSample:
	default:
		return nil, fmt.Errorf("scheduler prediction_type %q is not supported", c.Prediction)
	}
	if c.TrainSteps < 2 || c.TrainSteps > 100000 || c.BetaStart <= 0 || c.BetaEnd <= 0 || c.BetaEnd >= 1 {
		return nil, fmt.Errorf("scheduler config %s: bad betas or num_train_timesteps", path)
	}
	n := c.TrainSteps
	ac := make([]float64, n)
	prod := 1.0
	for i := range n {
		f := float64(i) / float64(n-1)
		var beta float64
		switch c.BetaSchedule {
		case "scaled_linear":
			b := math.Sqrt(c.BetaStart) + f*(math.Sqrt(c.BetaEnd)-math.Sqrt(c.BetaStart))
			beta = b * b
		case "linear":
			beta = c.BetaStart + f*(c.BetaEnd-c.BetaStart)
		default:
			return nil, fmt.Errorf("scheduler beta_schedule %q is not supported", c.BetaSchedule)
		}
		prod *= 1 - beta
		ac[i] = prod
	}
	c.trainAlphasCumul = ac
	return c, nil
}

// sampler is one job's run of a scheduler: the model timesteps it visits
// and how it moves the latents between them.
type sampler struct {
	cfg *schedConfig
	// ts are the model timesteps, in visiting order.
	ts []float64
	// sigmas (Euler kinds) has len(ts)+1 entries, the last 0.
	sigmas []float64
	// stepGap is the DDIM distance to the previous timestep.
	stepGap int
	rng     *rand.Rand
}

// euler reports whether the sampler works in sigma space.
func (s *sampler) euler() bool {
	return s.cfg.Class == schedEuler || s.cfg.Class == schedEulerA
}

// newSampler lays out steps timesteps; strength < 1 (img2img) starts part
// of the way down, as diffusers' pipelines do. It returns an error when
// strength leaves no step.
func newSampler(c *schedConfig, steps int, strength float64, rng *rand.Rand) (*sampler, error) {
	s := &sampler{cfg: c, rng: rng}
	T := c.TrainSteps
	if c.Class == schedLCM {
		// LCM: the distilled skeleton of original_inference_steps steps,
		// shortened by strength, then steps of it evenly.
		k := T / max(1, c.OriginalSteps)
		orig := int(float64(c.OriginalSteps) * strength)
		if orig < 1 {
			return nil, errNoSteps
		}
		var skel []float64
		for i := orig; i >= 1; i-- {
			skel = append(skel, float64(i*k-1))
		}
		steps = min(steps, len(skel))
		for i := range steps {
			s.ts = append(s.ts, skel[int(math.Floor(float64(i)*float64(len(skel))/float64(steps)))])
		}
		return s, nil
	}
	switch c.Spacing {
	case spacingLinear:
		for i := range steps {
			v := float64(T-1) - float64(i)*float64(T-1)/float64(max(steps-1, 1))
			s.ts = append(s.ts, v)
		}
	case spacingTrail:
		r := float64(T) / float64(steps)
		for i := range steps {
			s.ts = append(s.ts, math.Round(float64(T)-float64(i)*r)-1)
		}
	default: // leading
		r := T / steps
		for i := steps - 1; i >= 0; i-- {
			s.ts = append(s.ts, float64(i*r+c.StepsOffset))
		}
	}
	s.stepGap = T / steps
	if strength < 1 {
		init := min(int(float64(steps)*strength), steps)
		if init < 1 {
			return nil, errNoSteps
		}
		s.ts = s.ts[steps-init:]
	}
	if s.euler() {
		for _, t := range s.ts {
			s.sigmas = append(s.sigmas, c.sigmaAt(t))
		}
		s.sigmas = append(s.sigmas, 0)
	}
	return s, nil
}

// errNoSteps is the strength that leaves nothing to do.
var errNoSteps = fmt.Errorf("strength too small for the number of steps")

// alphaAt is the cumulative alpha of a (possibly fractional) timestep,
// interpolated linearly.
func (c *schedConfig) alphaAt(t float64) float64 {
	ac := c.trainAlphasCumul
	t = math.Max(0, math.Min(t, float64(len(ac)-1)))
	i := int(t)
	if i >= len(ac)-1 {
		return ac[len(ac)-1]
	}
	f := t - float64(i)
	return ac[i]*(1-f) + ac[i+1]*f
}

// sigmaAt is the Euler noise level of timestep t: sqrt((1-a)/a),
// interpolated in sigma between integer timesteps as diffusers does.
func (c *schedConfig) sigmaAt(t float64) float64 {
	sig := func(i int) float64 { a := c.trainAlphasCumul[i]; return math.Sqrt((1 - a) / a) }
	n := len(c.trainAlphasCumul)
	t = math.Max(0, math.Min(t, float64(n-1)))
	i := int(t)
	if i >= n-1 {
		return sig(n - 1)
	}
	f := t - float64(i)
	return sig(i)*(1-f) + sig(i+1)*f
}

// initSigma scales unit noise into the first step's latents.
func (s *sampler) initSigma() float64 {
	if !s.euler() {
		return 1
	}
	m := slices.Max(s.sigmas)
	if s.cfg.Spacing == spacingLinear || s.cfg.Spacing == spacingTrail {
		return m
	}
	return math.Sqrt(m*m + 1)
}

// inputScale is the factor the latents are multiplied by before the UNet
// at step i.
func (s *sampler) inputScale(i int) float32 {
	if !s.euler() {
		return 1
	}
	return float32(1 / math.Sqrt(s.sigmas[i]*s.sigmas[i]+1))
}

// addNoise puts x0 at the noise level of step i (i == len(ts): the end,
// x0 itself) into dst.
func (s *sampler) addNoise(dst, x0, noise []float32, i int) {
	if i >= len(s.ts) {
		copy(dst, x0)
		return
	}
	if s.euler() {
		sg := float32(s.sigmas[i])
		for k := range dst {
			dst[k] = x0[k] + noise[k]*sg
		}
		return
	}
	a := s.cfg.alphaAt(s.ts[i])
	ca, cn := float32(math.Sqrt(a)), float32(math.Sqrt(1-a))
	for k := range dst {
		dst[k] = ca*x0[k] + cn*noise[k]
	}
}

// freshNoise reports whether step i adds fresh noise (ancestral steps, LCM
// steps before the last), which step takes from drawNoise.
func (s *sampler) freshNoise(i int) bool {
	switch s.cfg.Class {
	case schedEulerA:
		return true
	case schedLCM:
		return i+1 < len(s.ts)
	}
	return false
}

// drawNoise fills dst with standard normal draws from the sampler's
// generator, in order.
func (s *sampler) drawNoise(dst []float32) {
	for k := range dst {
		dst[k] = float32(s.rng.NormFloat64())
	}
}

// step moves x from step i to step i+1 given the model output out (noise,
// velocity or sample, by prediction_type). When freshNoise(i), noise holds
// the step's draws from drawNoise (else it is not read).
func (s *sampler) step(i int, x, out, noise []float32) {
	c := s.cfg
	if s.euler() {
		sg, next := s.sigmas[i], s.sigmas[i+1]
		// d = (x - x0) / sigma, with x0 from the prediction type.
		var kx, ko float64 // x0 = kx*x + ko*out
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
			out, noise := out[:len(x)], noise[:len(x)]
			for k := range x {
				x[k] = a*x[k] + b*out[k] + u*noise[k]
			}
			return
		}
		dt := next - sg
		a := float32(1 + (1-kx)*dt/sg)
		b := float32(-ko * dt / sg)
		out := out[:len(x)]
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
	// x0 = px*x + po*out, eps = ex*x + eo*out.
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
		ca, cn := float32(math.Sqrt(aprev)), float32(math.Sqrt(1-aprev))
		fpx, fpo, fco, fcs := float32(px), float32(po), float32(cout), float32(cskip)
		out := out[:len(x)]
		if i+1 >= len(s.ts) { // the last step adds no noise
			for k := range x {
				x0 := fpx*x[k] + fpo*out[k]
				x[k] = fco*x0 + fcs*x[k]
			}
			return
		}
		noise = noise[:len(x)]
		for k := range x {
			x0 := fpx*x[k] + fpo*out[k]
			d := fco*x0 + fcs*x[k]
			x[k] = ca*d + cn*noise[k]
		}
		return
	}
	ca, cn := float32(math.Sqrt(aprev)), float32(math.Sqrt(1-aprev))
	lim := float32(c.ClipSampleRange)
	fpx, fpo, fex, feo := float32(px), float32(po), float32(ex), float32(eo)
	out = out[:len(x)]
	for k := range x {
		x0 := fpx*x[k] + fpo*out[k]
		eps := fex*x[k] + feo*out[k]
		if c.ClipSample {
			x0 = min(max(x0, -lim), lim)
		}
		x[k] = ca*x0 + cn*eps
	}
}

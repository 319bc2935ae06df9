package audiocodec

import "math"

// Resampler design: a polyphase windowed-sinc filter. The rate ratio is
// reduced to out/in = L/M; output sample n sits at input position n*M/L,
// whose fractional part is one of L phases. Each phase has 2*K taps of a
// sinc low-pass (cut-off at 0.475 of the lower of the two rates, so the
// band up to 7.6 kHz survives a conversion to 16 kHz and nothing above
// 8 kHz aliases) under a Kaiser window (beta 8.6, about 80 dB stop band),
// normalised to unit DC gain. The phase table is computed once per
// conversion; when L exceeds 4096 (rates with no large common factor with
// 16 kHz) the phase is rounded to the nearest of 4096, a timing error
// below 1/8192 of a sample. Input is pushed in
// blocks, so a long file is converted without holding it at its original
// rate.
const (
	zeroCrossings = 16
	kaiserBeta    = 8.6
	cutoffFrac    = 0.95 // of the lower Nyquist frequency
	maxTablePhase = 4096
)

type resampler struct {
	l, m  int64
	k     int64       // taps each side of the centre
	fc    float64     // cut-off in cycles per input sample
	table [][]float32 // per phase (min(l, maxTablePhase) of them), 2k taps
	buf   []float32   // pending input; buf[0] is input index base
	base  int64
	n     int64 // next output index
	seen  int64 // input samples pushed
	out   []float32
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func newResampler(inRate, outRate int) *resampler {
	g := gcd(int64(inRate), int64(outRate))
	r := &resampler{l: int64(outRate) / g, m: int64(inRate) / g}
	ratio := float64(outRate) / float64(inRate)
	r.fc = 0.5 * cutoffFrac * math.Min(1, ratio)
	r.k = int64(math.Ceil(zeroCrossings / (2 * r.fc)))
	// At most about a million coefficients (4 MB) per conversion.
	n := min(r.l, maxTablePhase, max(256, (1<<20)/(2*r.k)))
	r.table = make([][]float32, n)
	for p := range r.table {
		r.table[p] = r.taps(float64(p)/float64(n), nil)
	}
	return r
}

// taps computes the 2k coefficients for inputs ip-k+1 .. ip+k of an
// output at ip+frac.
func (r *resampler) taps(frac float64, dst []float32) []float32 {
	if cap(dst) < int(2*r.k) {
		dst = make([]float32, 2*r.k)
	}
	dst = dst[:2*r.k]
	half := float64(r.k)
	i0 := bessel0(kaiserBeta)
	var sum float64
	vals := make([]float64, 2*r.k)
	for j := range vals {
		t := frac - float64(int64(j)-r.k+1) // distance from input sample
		x := 2 * r.fc * t
		s := 2 * r.fc
		if x != 0 {
			s = math.Sin(math.Pi*x) / (math.Pi * t)
		}
		w := 0.0
		if u := t / half; u > -1 && u < 1 {
			w = bessel0(kaiserBeta*math.Sqrt(1-u*u)) / i0
		}
		vals[j] = s * w
		sum += vals[j]
	}
	for j, v := range vals {
		dst[j] = float32(v / sum)
	}
	return dst
}

// bessel0 is the modified Bessel function of the first kind, order 0.
func bessel0(x float64) float64 {
	sum, term := 1.0, 1.0
	for k := 1; k < 64; k++ {
		term *= (x / (2 * float64(k))) * (x / (2 * float64(k)))
		sum += term
		if term < 1e-12*sum {
			break
		}
	}
	return sum
}

// push adds input samples and converts what they complete.
func (r *resampler) push(x []float32) {
	r.buf = append(r.buf, x...)
	r.seen += int64(len(x))
	r.drain(false)
}

// finish converts the rest (the input is zero past its end) and returns
// all output.
func (r *resampler) finish() []float32 {
	r.drain(true)
	return r.out
}

func (r *resampler) drain(final bool) {
	total := (r.seen*r.l + r.m - 1) / r.m // output length for the input so far
	for r.n < total {
		pos := r.n * r.m
		ip, phase := pos/r.l, pos%r.l
		if n := int64(len(r.table)); n != r.l {
			if phase = (phase*n + r.l/2) / r.l; phase == n {
				ip, phase = ip+1, 0
			}
		}
		if !final && ip+r.k >= r.base+int64(len(r.buf)) {
			break
		}
		h := r.table[phase]
		var acc float32
		start := ip - r.k + 1
		for j, c := range h {
			idx := start + int64(j) - r.base
			if idx >= 0 && idx < int64(len(r.buf)) {
				acc += c * r.buf[idx]
			}
		}
		r.out = append(r.out, acc)
		r.n++
	}
	// Drop input no later output needs.
	keep := (r.n*r.m)/r.l - r.k + 1
	if drop := keep - r.base; drop > 0 && drop <= int64(len(r.buf)) && drop > 1<<14 {
		r.buf = append(r.buf[:0], r.buf[drop:]...)
		r.base = keep
	}
}

package whisper

import (
	"math"
	"math/cmplx"
)

// melFrontEnd computes Whisper's log-mel spectrogram exactly as
// openai/whisper's log_mel_spectrogram does: a centred STFT (reflect
// padding at the start of the audio) with n_fft 400, hop 160 and a periodic
// Hann window; the power spectrum times librosa's Slaney-normalised mel
// filter bank; log10 of max(x, 1e-10); values below max-8 raised to max-8;
// then (x+4)/4. It is immutable and safe for concurrent use.
type melFrontEnd struct {
	nMels   int
	hann    [nFFT]float64
	filters []melFilter
	fft     *fftPlan
}

// melFilter is one triangular filter: weights for FFT bins from first on.
type melFilter struct {
	first   int
	weights []float64
}

func newMelFrontEnd(nMels int) *melFrontEnd {
	m := &melFrontEnd{nMels: nMels, filters: slaneyMelFilters(sampleRate, nFFT, nMels), fft: newFFTPlan(nFFT)}
	for i := range m.hann {
		m.hann[i] = 0.5 - 0.5*math.Cos(2*math.Pi*float64(i)/nFFT)
	}
	return m
}

// slaneyMelFilters is librosa.filters.mel(sr, n_fft, n_mels, htk=False,
// norm="slaney"): triangles on the Slaney mel scale (linear below 1 kHz,
// logarithmic above), each scaled to unit area.
func slaneyMelFilters(sr, nfft, nMels int) []melFilter {
	const (
		fSp     = 200.0 / 3
		minLogH = 1000.0
		minLogM = minLogH / fSp
	)
	logStep := math.Log(6.4) / 27
	hzToMel := func(f float64) float64 {
		if f >= minLogH {
			return minLogM + math.Log(f/minLogH)/logStep
		}
		return f / fSp
	}
	melToHz := func(m float64) float64 {
		if m >= minLogM {
			return minLogH * math.Exp(logStep*(m-minLogM))
		}
		return m * fSp
	}
	nBins := nfft/2 + 1
	fftFreqs := make([]float64, nBins)
	for i := range fftFreqs {
		fftFreqs[i] = float64(i) * float64(sr) / 2 / float64(nBins-1)
	}
	lo, hi := hzToMel(0), hzToMel(float64(sr)/2)
	melF := make([]float64, nMels+2)
	for i := range melF {
		melF[i] = melToHz(lo + (hi-lo)*float64(i)/float64(nMels+1))
	}
	out := make([]melFilter, nMels)
	for i := range out {
		enorm := 2 / (melF[i+2] - melF[i])
		w := make([]float64, nBins)
		first, last := -1, -1
		for k, f := range fftFreqs {
			lower := (f - melF[i]) / (melF[i+1] - melF[i])
			upper := (melF[i+2] - f) / (melF[i+2] - melF[i+1])
			v := math.Max(0, math.Min(lower, upper))
			// librosa returns float32 weights; round the same way.
			w[k] = float64(float32(v * enorm))
			if w[k] != 0 {
				if first < 0 {
					first = k
				}
				last = k
			}
		}
		if first < 0 {
			out[i] = melFilter{}
			continue
		}
		out[i] = melFilter{first: first, weights: w[first : last+1]}
	}
	return out
}

// compute computes the log-mel of the 3000 frames starting at frame start
// of samples (frame f is centred on sample f*160; samples past the end are
// zeros, as in Whisper's 30 s zero padding) into dst, laid out
// [nMels][3000]. The clamp to max-8 uses this window's maximum (a single
// window of audio up to 30 s gives exactly Whisper's values).
func (m *melFrontEnd) compute(samples []float32, start int, dst []float32) {
	const bins = nFFT/2 + 1
	power := make([]float64, 2*bins)
	z := make([]complex128, nFFT)
	spec := make([]complex128, nFFT)
	tmp := make([]complex128, nFFT)
	logs := make([]float64, m.nMels*nFrames)
	frame := func(f int, buf []float64) {
		base := (start+f)*hopLength - nFFT/2
		for k := range nFFT {
			i := base + k
			if i < 0 {
				i = -i // reflect, edge not repeated
			}
			var v float64
			if i < len(samples) {
				v = float64(samples[i])
			}
			buf[k] = v * m.hann[k]
		}
	}
	a := make([]float64, nFFT)
	b := make([]float64, nFFT)
	for f := 0; f < nFrames; f += 2 {
		// Two real frames share one complex FFT: z = a + ib.
		frame(f, a)
		frame(f+1, b)
		for k := range z {
			z[k] = complex(a[k], b[k])
		}
		m.fft.transform(spec, z, tmp)
		for k := range bins {
			zk, zn := spec[k], cmplx.Conj(spec[(nFFT-k)%nFFT])
			ak := (zk + zn) / 2
			bk := (zk - zn) / complex(0, 2)
			power[k] = real(ak)*real(ak) + imag(ak)*imag(ak)
			power[bins+k] = real(bk)*real(bk) + imag(bk)*imag(bk)
		}
		for j, flt := range m.filters {
			var s0, s1 float64
			for k, w := range flt.weights {
				s0 += w * power[flt.first+k]
				s1 += w * power[bins+flt.first+k]
			}
			logs[j*nFrames+f] = math.Log10(math.Max(s0, 1e-10))
			logs[j*nFrames+f+1] = math.Log10(math.Max(s1, 1e-10))
		}
	}
	top := math.Inf(-1)
	for _, v := range logs {
		top = math.Max(top, v)
	}
	floor := top - 8
	for i, v := range logs {
		dst[i] = float32((math.Max(v, floor) + 4) / 4)
	}
}

// fftPlan is a mixed-radix (2, 3, 4, 5, then any prime) decimation-in-time
// complex FFT of one size.
type fftPlan struct {
	n       int
	factors []int
	twiddle []complex128 // exp(-2πi k/n)
}

func newFFTPlan(n int) *fftPlan {
	p := &fftPlan{n: n, twiddle: make([]complex128, n)}
	for k := range p.twiddle {
		s, c := math.Sincos(-2 * math.Pi * float64(k) / float64(n))
		p.twiddle[k] = complex(c, s)
	}
	for r := n; r > 1; {
		f := 0
		for _, c := range []int{4, 2, 3, 5} {
			if r%c == 0 {
				f = c
				break
			}
		}
		if f == 0 {
			for f = 7; r%f != 0; f += 2 {
			}
		}
		p.factors = append(p.factors, f)
		r /= f
	}
	return p
}

// transform writes the DFT of src to dst; tmp is scratch of the plan's size.
func (p *fftPlan) transform(dst, src, tmp []complex128) {
	p.rec(dst, src, 1, p.n, 0, tmp)
}

func (p *fftPlan) rec(out, in []complex128, stride, n, fi int, tmp []complex128) {
	if n == 1 {
		out[0] = in[0]
		return
	}
	radix := p.factors[fi]
	m := n / radix
	for r := range radix {
		p.rec(out[r*m:(r+1)*m], in[r*stride:], stride*radix, m, fi+1, tmp)
	}
	copy(tmp[:n], out[:n])
	for k := range m {
		for q := range radix {
			idx := q*m + k
			var sum complex128
			for r := range radix {
				sum += p.twiddle[(r*idx*stride)%p.n] * tmp[r*m+k]
			}
			out[idx] = sum
		}
	}
}

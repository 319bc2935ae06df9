package tts

import (
	"fmt"
	"math"
	"math/cmplx"
)

// resample converts x from rate in to rate out with a windowed-sinc
// interpolator (16 zero crossings each side, Hann window, cut-off at the
// lower Nyquist frequency). Quality is ample for speech at 16-48 kHz.
func resample(x []float32, in, out int) []float32 {
	if in == out || len(x) == 0 {
		return append([]float32(nil), x...)
	}
	const zeros = 16
	ratio := float64(out) / float64(in)
	cut := math.Min(1, ratio) // of the input Nyquist
	half := float64(zeros) / cut
	n := int(math.Round(float64(len(x)) * ratio))
	y := make([]float32, n)
	for i := range y {
		t := float64(i) / ratio // position in input samples
		lo := max(0, int(math.Ceil(t-half)))
		hi := min(len(x)-1, int(math.Floor(t+half)))
		var acc float64
		for j := lo; j <= hi; j++ {
			d := float64(j) - t
			w := 0.5 + 0.5*math.Cos(math.Pi*d/half)
			acc += float64(x[j]) * cut * sinc(cut*d) * w
		}
		y[i] = float32(acc)
	}
	return y
}

func sinc(x float64) float64 {
	if x == 0 {
		return 1
	}
	return math.Sin(math.Pi*x) / (math.Pi * x)
}

// stft holds the linear-spectrogram settings of a VITS-style model.
type stft struct {
	nFFT, hop, win int
	window         []float64 // periodic Hann of length win, centred in nFFT
}

func newSTFT(nFFT, hop, win int) (*stft, error) {
	if nFFT < 16 || nFFT&(nFFT-1) != 0 || hop <= 0 || hop > nFFT || win <= 0 || win > nFFT {
		return nil, fmt.Errorf("spectrogram: filter_length %d (want a power of two), hop %d, win %d", nFFT, hop, win)
	}
	s := &stft{nFFT: nFFT, hop: hop, win: win, window: make([]float64, nFFT)}
	off := (nFFT - win) / 2
	for i := range win {
		s.window[off+i] = 0.5 - 0.5*math.Cos(2*math.Pi*float64(i)/float64(win))
	}
	return s, nil
}

// bins is the number of frequency bins, nFFT/2+1.
func (s *stft) bins() int { return s.nFFT/2 + 1 }

// magnitude returns the frames x bins magnitude spectrogram of y as
// OpenVoice computes it: reflect padding of (nFFT-hop)/2 at both ends, no
// centring, |X| = sqrt(re^2 + im^2 + 1e-6). Frame-major: out[f*bins+k].
func (s *stft) magnitude(y []float32) ([]float32, int) {
	pad := (s.nFFT - s.hop) / 2
	n := len(y) + 2*pad
	p := make([]float64, n)
	for i := range p {
		j := i - pad
		// Reflect without repeating the edge sample; fold as often as
		// needed for very short inputs.
		for j < 0 || j >= len(y) {
			if j < 0 {
				j = -j
			}
			if j >= len(y) {
				j = 2*(len(y)-1) - j
			}
			if len(y) == 1 {
				j = 0
			}
		}
		p[i] = float64(y[j])
	}
	if n < s.nFFT {
		return nil, 0
	}
	frames := (n-s.nFFT)/s.hop + 1
	k := s.bins()
	out := make([]float32, frames*k)
	buf := make([]complex128, s.nFFT)
	for f := range frames {
		off := f * s.hop
		for i := range buf {
			buf[i] = complex(p[off+i]*s.window[i], 0)
		}
		fft(buf)
		for b := range k {
			re, im := real(buf[b]), imag(buf[b])
			out[f*k+b] = float32(math.Sqrt(re*re + im*im + 1e-6))
		}
	}
	return out, frames
}

// fft is an in-place iterative radix-2 FFT; len(a) is a power of two.
func fft(a []complex128) {
	n := len(a)
	for i, j := 1, 0; i < n; i++ {
		bit := n >> 1
		for ; j&bit != 0; bit >>= 1 {
			j ^= bit
		}
		j |= bit
		if i < j {
			a[i], a[j] = a[j], a[i]
		}
	}
	for size := 2; size <= n; size <<= 1 {
		w := cmplx.Exp(complex(0, -2*math.Pi/float64(size)))
		for start := 0; start < n; start += size {
			wk := complex(1, 0)
			for k := range size / 2 {
				u, v := a[start+k], a[start+k+size/2]*wk
				a[start+k], a[start+k+size/2] = u+v, u-v
				wk *= w
			}
		}
	}
}

// rms is the root mean square of x (0 for no samples).
func rms(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s / float64(max(len(x), 1)))
}

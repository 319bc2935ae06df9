package tts

import (
	"math"
	"math/cmplx"
	"testing"
)

func TestFFTMatchesDFT(t *testing.T) {
	x := make([]complex128, 64)
	for i := range x {
		x[i] = complex(math.Sin(float64(i)*0.3)+0.1*float64(i%5), 0)
	}
	want := make([]complex128, len(x))
	for k := range want {
		for n, v := range x {
			want[k] += v * cmplx.Exp(complex(0, -2*math.Pi*float64(k*n)/float64(len(x))))
		}
	}
	fft(x)
	for k := range x {
		if cmplx.Abs(x[k]-want[k]) > 1e-9 {
			t.Fatalf("bin %d: %v, want %v", k, x[k], want[k])
		}
	}
}

func TestSpectrogramPeak(t *testing.T) {
	s, err := newSTFT(1024, 256, 1024)
	if err != nil {
		t.Fatal(err)
	}
	const rate = 22050
	y := make([]float32, rate)
	for i := range y {
		y[i] = float32(math.Sin(2 * math.Pi * 1000 * float64(i) / rate))
	}
	mag, frames := s.magnitude(y)
	// (22050 + 768 - 1024)/256 + 1 frames, like OpenVoice's numpy code.
	if frames != (rate+768-1024)/256+1 {
		t.Fatalf("%d frames", frames)
	}
	k := s.bins()
	mid := mag[frames/2*k : frames/2*k+k]
	best := 0
	for b := range mid {
		if mid[b] > mid[best] {
			best = b
		}
	}
	if want := int(math.Round(1000.0 * 1024 / rate)); best != want {
		t.Fatalf("peak at bin %d, want %d", best, want)
	}
}

func TestResample(t *testing.T) {
	const in, out = 24000, 22050
	x := make([]float32, in)
	for i := range x {
		x[i] = float32(math.Sin(2 * math.Pi * 440 * float64(i) / in))
	}
	y := resample(x, in, out)
	if len(y) != out {
		t.Fatalf("%d samples", len(y))
	}
	for i := 1000; i < out-1000; i += 97 {
		want := math.Sin(2 * math.Pi * 440 * float64(i) / out)
		if math.Abs(float64(y[i])-want) > 2e-3 {
			t.Fatalf("sample %d = %v, want %v", i, y[i], want)
		}
	}
}

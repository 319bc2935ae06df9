package whisper

import (
	"bufio"
	"math"
	"math/cmplx"
	"os"
	"strconv"
	"strings"
	"testing"
)

// melTestSignal builds the same float32 samples as
// testdata/mel_reference.py's signal().
func melTestSignal() []float32 {
	const n = 88000
	out := make([]float32, n)
	state := int64(12345)
	for i := range out {
		state = (state*1103515245 + 12345) % 2147483648
		t := float64(i) / sampleRate
		v := 0.5*math.Sin(2*math.Pi*440*t) + 0.3*math.Sin(2*math.Pi*(200+1000*t)*t)
		v += 0.05 * (float64(state)/2147483648 - 0.5)
		if i > 60000 {
			v *= 1e-4
		}
		out[i] = float32(v)
	}
	return out
}

// TestLogMelMatchesReference compares the Go log-mel with values numpy
// computed (testdata/mel_reference.py) for 80 and 128 mel bins.
func TestLogMelMatchesReference(t *testing.T) {
	f, err := os.Open("testdata/mel_reference.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	x := melTestSignal()
	mels := map[int][]float32{}
	for _, n := range []int{80, 128} {
		mels[n] = make([]float32, n*nFrames)
		newMelFrontEnd(n).compute(x, 0, mels[n])
	}
	var checked int
	var worst float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			fields := strings.Fields(line)
			n, _ := strconv.Atoi(fields[2])
			want, _ := strconv.ParseFloat(fields[len(fields)-1], 64)
			var sum float64
			for _, v := range mels[n] {
				sum += float64(v)
			}
			if got := sum / float64(len(mels[n])); math.Abs(got-want) > 1e-5 {
				t.Errorf("n_mels %d: mean %.7f, want %.7f", n, got, want)
			}
			continue
		}
		var n, b, fr int
		var want float64
		fields := strings.Fields(line)
		n, _ = strconv.Atoi(fields[0])
		b, _ = strconv.Atoi(fields[1])
		fr, _ = strconv.Atoi(fields[2])
		want, _ = strconv.ParseFloat(fields[3], 64)
		got := float64(mels[n][b*nFrames+fr])
		d := math.Abs(got - want)
		worst = math.Max(worst, d)
		if d > 2e-5 {
			t.Errorf("n_mels %d mel %d frame %d: %.7f, want %.7f", n, b, fr, got, want)
		}
		checked++
	}
	if checked < 300 {
		t.Fatalf("only %d reference values read", checked)
	}
	t.Logf("%d reference values, worst difference %.2g", checked, worst)
}

// TestFFTMatchesDFT checks the mixed-radix FFT against a direct DFT for
// sizes with every radix path.
func TestFFTMatchesDFT(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 7, 8, 12, 49, 400} {
		p := newFFTPlan(n)
		in := make([]complex128, n)
		for i := range in {
			in[i] = complex(math.Sin(float64(i*i)+1), math.Cos(float64(3*i)))
		}
		out := make([]complex128, n)
		p.transform(out, in, make([]complex128, n))
		for k := range n {
			var want complex128
			for j := range n {
				want += in[j] * cmplx.Exp(complex(0, -2*math.Pi*float64(j*k)/float64(n)))
			}
			if cmplx.Abs(out[k]-want) > 1e-9*float64(n) {
				t.Fatalf("n=%d bin %d: %v, want %v", n, k, out[k], want)
			}
		}
	}
}

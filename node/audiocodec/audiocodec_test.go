package audiocodec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// toneAt is the test signal: 0.5*sin(440 Hz) on the left channel,
// 0.5*sin(1 kHz) on the right (more channels repeat the two).
func toneAt(ch, i, rate int) float64 {
	f := 440.0
	if ch%2 == 1 {
		f = 1000
	}
	return 0.5 * math.Sin(2*math.Pi*f*float64(i)/float64(rate))
}

// makeWAV encodes frames of the test tone.
func makeWAV(t testing.TB, rate, channels, bits int, float, extensible bool, frames int) []byte {
	t.Helper()
	bytesPer := bits / 8
	var data []byte
	for i := range frames {
		for c := range channels {
			v := toneAt(c, i, rate)
			switch {
			case float && bits == 32:
				data = binary.LittleEndian.AppendUint32(data, math.Float32bits(float32(v)))
			case float:
				data = binary.LittleEndian.AppendUint64(data, math.Float64bits(v))
			case bits == 8:
				data = append(data, byte(int(math.Round(v*127))+128))
			case bits == 16:
				data = binary.LittleEndian.AppendUint16(data, uint16(int16(math.Round(v*32767))))
			case bits == 24:
				x := int32(math.Round(v * 8388607))
				data = append(data, byte(x), byte(x>>8), byte(x>>16))
			default:
				data = binary.LittleEndian.AppendUint32(data, uint32(int32(math.Round(v*2147483647))))
			}
		}
	}
	tag := uint16(wavPCM)
	if float {
		tag = wavFloat
	}
	fmtChunk := binary.LittleEndian.AppendUint16(nil, tag)
	if extensible {
		fmtChunk = binary.LittleEndian.AppendUint16(nil, wavExtensible)
	}
	fmtChunk = binary.LittleEndian.AppendUint16(fmtChunk, uint16(channels))
	fmtChunk = binary.LittleEndian.AppendUint32(fmtChunk, uint32(rate))
	fmtChunk = binary.LittleEndian.AppendUint32(fmtChunk, uint32(rate*channels*bytesPer))
	fmtChunk = binary.LittleEndian.AppendUint16(fmtChunk, uint16(channels*bytesPer))
	fmtChunk = binary.LittleEndian.AppendUint16(fmtChunk, uint16(bits))
	if extensible {
		fmtChunk = binary.LittleEndian.AppendUint16(fmtChunk, 22)
		fmtChunk = binary.LittleEndian.AppendUint16(fmtChunk, uint16(bits))
		fmtChunk = binary.LittleEndian.AppendUint32(fmtChunk, 3) // channel mask
		guid := []byte{0, 0, 0, 0, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xaa, 0x00, 0x38, 0x9b, 0x71}
		binary.LittleEndian.PutUint16(guid, tag)
		fmtChunk = append(fmtChunk, guid...)
	}
	out := []byte("RIFF\x00\x00\x00\x00WAVE")
	out = append(out, "fmt "...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(fmtChunk)))
	out = append(out, fmtChunk...)
	out = append(out, "LIST\x03\x00\x00\x00abc\x00"...) // an odd-sized chunk to skip
	out = append(out, "data"...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(data)))
	out = append(out, data...)
	binary.LittleEndian.PutUint32(out[4:], uint32(len(out)-8))
	return out
}

// amplitude is the amplitude of the f Hz component of x (16 kHz), away
// from the edges.
func amplitude(x []float32, f float64) float64 {
	lo, hi := len(x)/10, len(x)*9/10
	var re, im float64
	for i := lo; i < hi; i++ {
		s, c := math.Sincos(2 * math.Pi * f * float64(i) / SampleRate)
		re += float64(x[i]) * c
		im += float64(x[i]) * s
	}
	return 2 * math.Hypot(re, im) / float64(hi-lo)
}

// checkTone asserts x is the downmixed test tone: amp at 440 Hz and at
// 1 kHz (for an even channel count), little else.
func checkTone(t *testing.T, name string, x []float32, dur, wantDur, amp, tol float64) {
	t.Helper()
	if math.Abs(dur-wantDur) > 0.08 {
		t.Errorf("%s: duration %.3f s, want %.3f", name, dur, wantDur)
	}
	if want := int(math.Round(wantDur * SampleRate)); math.Abs(float64(len(x)-want)) > 0.08*SampleRate {
		t.Errorf("%s: %d samples, want about %d", name, len(x), want)
	}
	a440, a1k, a3k := amplitude(x, 440), amplitude(x, 1000), amplitude(x, 3000)
	if math.Abs(a440-amp) > tol || math.Abs(a1k-amp) > tol || a3k > tol {
		t.Errorf("%s: amplitudes 440 Hz %.4f, 1 kHz %.4f, 3 kHz %.4f; want %.4f, %.4f, 0", name, a440, a1k, a3k, amp, amp)
	}
}

func TestDecodeWAVVariants(t *testing.T) {
	for _, c := range []struct {
		name              string
		rate, ch, bits    int
		float, extensible bool
	}{
		{"pcm8-16k-stereo", 16000, 2, 8, false, false},
		{"pcm16-16k-stereo", 16000, 2, 16, false, false},
		{"pcm24-48k-stereo", 48000, 2, 24, false, false},
		{"pcm32-22050-stereo", 22050, 2, 32, false, false},
		{"float32-44100-stereo", 44100, 2, 32, true, false},
		{"float64-8000-stereo", 8000, 2, 64, true, false},
		{"extensible-pcm16-44100-4ch", 44100, 4, 16, false, true},
		{"extensible-float32-96000", 96000, 2, 32, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := makeWAV(t, c.rate, c.ch, c.bits, c.float, c.extensible, c.rate*3/2)
			x, dur, err := Decode(data, 60)
			if err != nil {
				t.Fatal(err)
			}
			tol := 0.005
			if c.bits == 8 {
				tol = 0.01
			}
			checkTone(t, c.name, x, dur, 1.5, 0.25, tol)
		})
	}
}

// TestDecodeMono16kIsExact checks that 16 kHz mono float input comes back
// sample for sample.
func TestDecodeMono16kIsExact(t *testing.T) {
	data := makeWAV(t, 16000, 1, 32, true, false, 1000)
	x, _, err := Decode(data, 60)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range x {
		if want := float32(toneAt(0, i, 16000)); v != want {
			t.Fatalf("sample %d: %v, want %v", i, v, want)
		}
	}
}

// TestDecodeCompressed decodes the committed MP3, FLAC and Ogg Vorbis
// files (testdata/gen.sh).
func TestDecodeCompressed(t *testing.T) {
	for _, c := range []struct {
		file   string
		format Format
		dur    float64
		tol    float64
	}{
		{"tone.mp3", FormatMP3, 1.0, 0.003},
		{"tone.flac", FormatFLAC, 0.5, 0.0005},
		{"tone.ogg", FormatVorbis, 1.0, 0.003},
	} {
		data, err := os.ReadFile("testdata/" + c.file)
		if err != nil {
			t.Fatal(err)
		}
		if f := Detect(data); f != c.format {
			t.Errorf("%s: detected %q, want %q", c.file, f, c.format)
		}
		x, dur, err := Decode(data, 60)
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		// MP3 adds encoder delay and padding (about 70 ms). ffmpeg's sine
		// source has amplitude 1/8, halved by gen.sh's volume filter and
		// again by the downmix.
		checkTone(t, c.file, x, dur, c.dur, 1.0/32, c.tol)
	}
}

func wantInputError(t *testing.T, name string, err error) {
	t.Helper()
	var ie *engine.InputError
	if !errors.As(err, &ie) || ie.Param != "file" {
		t.Errorf("%s: error %v, want an InputError on file", name, err)
	}
}

func TestDecodeRejects(t *testing.T) {
	opus, err := os.ReadFile("testdata/tone.opus")
	if err != nil {
		t.Fatal(err)
	}
	good := makeWAV(t, 16000, 1, 16, false, false, 16000)
	truncated := good[:len(good)-100]
	// A header declaring two hours of 48 kHz stereo 16-bit audio.
	twoHours := makeWAV(t, 48000, 2, 16, false, false, 10)
	binary.LittleEndian.PutUint32(twoHours[len(twoHours)-40-4:], uint32(2*3600*48000*4))
	long := makeWAV(t, 8000, 1, 8, false, false, 8000*11)
	for name, data := range map[string][]byte{
		"empty":            nil,
		"garbage":          []byte("this is not audio at all, just some text"),
		"riff-only":        []byte("RIFF\x04\x00\x00\x00WAVE"),
		"truncated":        truncated,
		"two-hours":        twoHours,
		"opus":             opus,
		"too-big":          make([]byte, MaxBytes+1),
		"no-samples":       makeWAV(t, 16000, 1, 16, false, false, 0),
		"mp3-sync-garbage": {0xff, 0xfb, 0x90, 0x00, 1, 2, 3},
	} {
		_, _, err := Decode(data, 60)
		wantInputError(t, name, err)
	}
	_, _, err = Decode(long, 10)
	wantInputError(t, "longer-than-limit", err)
}

// FuzzDecode checks that no input panics and that output stays bounded by
// the duration limit.
func FuzzDecode(f *testing.F) {
	f.Add(makeWAV(f, 16000, 1, 16, false, false, 100))
	f.Add(makeWAV(f, 44100, 2, 24, false, true, 50))
	for _, name := range []string{"tone.mp3", "tone.flac", "tone.ogg", "tone.opus"} {
		if data, err := os.ReadFile("testdata/" + name); err == nil {
			f.Add(data[:min(len(data), 4096)])
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxSeconds = 5
		x, dur, err := Decode(data, maxSeconds)
		if err != nil {
			var ie *engine.InputError
			if !errors.As(err, &ie) {
				t.Fatalf("non-input error %v", err)
			}
			return
		}
		if dur > maxSeconds || len(x) > (maxSeconds+1)*SampleRate {
			t.Fatalf("%d samples, %.2f s past the %d s limit", len(x), dur, maxSeconds)
		}
	})
}

// TestDecodeOddRate covers a rate with no large common factor with 16 kHz
// (rounded phases) and the highest accepted rate.
func TestDecodeOddRate(t *testing.T) {
	for _, rate := range []int{44101, 192000, 1000 * 11} {
		data := makeWAV(t, rate, 2, 16, false, false, rate)
		start := time.Now()
		x, dur, err := Decode(data, 60)
		if err != nil {
			t.Fatal(err)
		}
		if rate > 8000 {
			checkTone(t, fmt.Sprint(rate), x, dur, 1, 0.25, 0.005)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("%d Hz: 1 s took %v", rate, el)
		}
	}
}

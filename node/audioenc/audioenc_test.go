package audioenc

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os/exec"
	"strconv"
	"testing"

	"github.com/infermesh/infermesh/node/audiocodec"
)

// tone is a test signal: a 440 Hz sine with a slow amplitude envelope.
func tone(n, rate int) []float32 {
	x := make([]float32, n)
	for i := range x {
		t := float64(i) / float64(rate)
		x[i] = float32(0.5 * math.Sin(2*math.Pi*440*t) * (0.6 + 0.4*math.Sin(2*math.Pi*1.5*t)))
	}
	return x
}

// probe decodes data with ffmpeg and returns the decoded stream's sample
// rate and its duration from the decoded sample count.
func probe(t *testing.T, data []byte) (rate int, seconds float64) {
	t.Helper()
	cmd := exec.Command("ffprobe", "-v", "error", "-select_streams", "a:0", "-show_entries", "stream=sample_rate", "-of", "json", "-i", "pipe:0")
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ffprobe: %v", err)
	}
	var p struct {
		Streams []struct {
			SampleRate string `json:"sample_rate"`
		} `json:"streams"`
	}
	if err := json.Unmarshal(out, &p); err != nil || len(p.Streams) != 1 {
		t.Fatalf("ffprobe output %s: %v", out, err)
	}
	rate, _ = strconv.Atoi(p.Streams[0].SampleRate)
	dec := exec.Command("ffmpeg", "-v", "error", "-i", "pipe:0", "-f", "s16le", "-ac", "1", "pipe:1")
	dec.Stdin = bytes.NewReader(data)
	pcm, err := dec.Output()
	if err != nil {
		t.Fatalf("ffmpeg decode: %v", err)
	}
	return rate, float64(len(pcm)/2) / float64(rate)
}

func requireFFmpeg(t *testing.T) {
	t.Helper()
	for _, p := range []string{"ffmpeg", "ffprobe"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s is needed to check the encoders (Debian package ffmpeg): %v", p, err)
		}
	}
}

func TestEncodeDecodesBack(t *testing.T) {
	requireFFmpeg(t)
	e := New()
	for _, rate := range []int{24000, 22050} {
		pcm := tone(rate*3, rate) // 3 s
		for _, f := range Formats() {
			if !e.Available(f) {
				t.Fatalf("%s not available although ffmpeg is installed", f)
			}
			data, err := e.Encode(context.Background(), f, pcm, rate)
			if err != nil {
				t.Fatalf("%s@%d: %v", f, rate, err)
			}
			if f == PCM {
				if len(data) != 2*len(pcm) {
					t.Fatalf("pcm: %d bytes for %d samples", len(data), len(pcm))
				}
				continue
			}
			gotRate, secs := probe(t, data)
			if gotRate != f.OutputRate(rate) {
				t.Errorf("%s@%d: decoded rate %d, want %d", f, rate, gotRate, f.OutputRate(rate))
			}
			if d := math.Abs(secs-3) / 3; d > 0.05 {
				t.Errorf("%s@%d: decoded %.3f s, want 3 s within 5%%", f, rate, secs)
			}
			t.Logf("%s@%d: %d bytes, %d Hz, %.3f s", f, rate, len(data), gotRate, secs)
		}
	}
}

// TestLosslessRoundTrip checks wav and flac sample by sample through the
// node's own decoder (node/audiocodec resamples to 16 kHz, so the input is
// at 16 kHz).
func TestLosslessRoundTrip(t *testing.T) {
	e := New()
	pcm := tone(16000, 16000)
	pcm[10], pcm[11] = 1.5, -2 // clipped
	for _, f := range []Format{WAV, FLAC} {
		data, err := e.Encode(context.Background(), f, pcm, 16000)
		if err != nil {
			t.Fatal(err)
		}
		got, secs, err := audiocodec.Decode(data, 60)
		if err != nil {
			t.Fatalf("%s: decode: %v", f, err)
		}
		if len(got) != len(pcm) || secs != 1 {
			t.Fatalf("%s: %d samples (%.3f s), want %d", f, len(got), secs, len(pcm))
		}
		for i := range pcm {
			want := float64(s16(pcm[i])) / 32768
			if math.Abs(float64(got[i])-want) > 1.0/32768 {
				t.Fatalf("%s: sample %d = %v, want %v", f, i, got[i], want)
			}
		}
	}
	if flac, _ := e.Encode(context.Background(), FLAC, pcm, 16000); len(flac) > 2*len(pcm)*3/4 {
		t.Errorf("flac of a tone is %d bytes, not smaller than the %d-byte PCM", len(flac), 2*len(pcm))
	}
}

// TestStreamingWriters writes PCM in uneven chunks and checks that bytes
// arrive before Close for every format and that the result decodes to the
// whole duration.
func TestStreamingWriters(t *testing.T) {
	requireFFmpeg(t)
	e := New()
	const rate = 24000
	pcm := tone(rate*4, rate)
	for _, f := range Formats() {
		var out bytes.Buffer
		w, err := e.NewWriter(context.Background(), &out, f, rate)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(pcm); i += 7001 {
			if err := w.Write(pcm[i:min(i+7001, len(pcm))]); err != nil {
				t.Fatalf("%s: write: %v", f, err)
			}
		}
		// Bytes leave before Close (ffmpeg's are checked after Close: its
		// copier writes concurrently).
		if f == WAV || f == PCM || f == FLAC {
			if out.Len() < len(pcm)/4 {
				t.Errorf("%s: only %d bytes out before Close", f, out.Len())
			}
		}
		if err := w.Close(); err != nil {
			t.Fatalf("%s: close: %v", f, err)
		}
		if f == PCM {
			if out.Len() != 2*len(pcm) {
				t.Fatalf("pcm stream: %d bytes", out.Len())
			}
			continue
		}
		if f == WAV && binary.LittleEndian.Uint32(out.Bytes()[40:]) != 0xFFFFFFFF {
			t.Errorf("streamed wav does not declare an unknown length")
		}
		gotRate, secs := probe(t, out.Bytes())
		if gotRate != f.OutputRate(rate) || math.Abs(secs-4)/4 > 0.05 {
			t.Errorf("%s stream: %d Hz, %.3f s; want %d Hz, 4 s", f, gotRate, secs, f.OutputRate(rate))
		}
	}
}

func TestUnavailableAndBadInput(t *testing.T) {
	none := NewWithFFmpeg("")
	for _, f := range []Format{MP3, Opus, AAC} {
		if none.Available(f) {
			t.Errorf("%s available without ffmpeg", f)
		}
		if _, err := none.Encode(context.Background(), f, make([]float32, 100), 24000); !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s without ffmpeg: %v", f, err)
		}
	}
	for _, f := range []Format{WAV, PCM, FLAC} {
		if !none.Available(f) {
			t.Errorf("%s needs no ffmpeg but is unavailable", f)
		}
	}
	if _, err := none.Encode(context.Background(), WAV, nil, 100); err == nil {
		t.Error("rate 100 accepted")
	}
	if f, err := ParseFormat(""); err != nil || f != MP3 {
		t.Errorf("default format %q %v", f, err)
	}
	if _, err := ParseFormat("ogg"); err == nil {
		t.Error("format ogg accepted")
	}
}

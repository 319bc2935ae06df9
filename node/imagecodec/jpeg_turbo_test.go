//go:build cgo && !nolibjpeg

package imagecodec

import (
	"bytes"
	"context"
	"encoding/base64"
	"image"
	"image/draw"
	"image/jpeg"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// turboMaxDiff and turboMaxMean bound how far libjpeg-turbo's pixels may
// be from image/jpeg's (converted to RGBA by image/draw) on the same file,
// per 0..255 channel value. Both decoders use an accurate integer IDCT and
// a fixed-point YCbCr to RGB conversion with chroma replicated (no fancy
// upsampling), but they round differently: each step can be off by one
// level, and the conversion multiplies a chroma difference by up to 1.772,
// so a few levels at most. Measured on the files below: max 4, mean
// 0.17 (colour photos), 0.32 (the progressive file whose last refinement
// scans are missing) and 0.01 (grey).
const (
	turboMaxDiff = 6
	turboMaxMean = 0.4
)

// skimageData is where Debian's python3-skimage keeps its sample photos.
const skimageData = "/usr/lib/python3/dist-packages/skimage/data"

// turboCases returns named JPEG files: Go's image test files of every
// subsampling ratio, progressive, restart markers, grey, CMYK, Adobe RGB
// and one whose later progressive scans are cut off (testdata), and skimage photos encoded at qualities
// 75, 90 and 100.
func turboCases(t *testing.T) map[string][]byte {
	t.Helper()
	cases := map[string][]byte{}
	names, err := filepath.Glob("testdata/*.jpeg")
	if err != nil || len(names) < 16 {
		t.Fatalf("testdata JPEGs: %d, %v", len(names), err)
	}
	for _, n := range names {
		d, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		cases[filepath.Base(n)] = d
	}
	for _, n := range []string{"astronaut.png", "coffee.png", "motorcycle_left.png", "chelsea.png", "page.png"} {
		f, err := os.Open(filepath.Join(skimageData, n))
		if err != nil {
			t.Fatalf("test photo: %v (install python3-skimage)", err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []int{75, 90, 100} {
			var buf bytes.Buffer
			if err := jpeg.Encode(&buf, img, &jpeg.Options{Quality: q}); err != nil {
				t.Fatal(err)
			}
			cases[n+"@q"+string(rune('0'+q/10))+string(rune('0'+q%10))] = buf.Bytes()
		}
	}
	return cases
}

// TestTurboMatchesImageJPEG: every file image/jpeg decodes, libjpeg-turbo
// decodes to within a few levels of it, except the colour spaces it leaves
// to image/jpeg (CMYK, Adobe RGB); every file image/jpeg refuses, it
// refuses too, and Decode still reports image/jpeg's error for it.
func TestTurboMatchesImageJPEG(t *testing.T) {
	fallback := map[string]bool{"video-001.cmyk.jpeg": true, "video-001.rgb.jpeg": true}
	for name, data := range turboCases(t) {
		cfg, err := jpeg.DecodeConfig(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ref, refErr := jpeg.Decode(bytes.NewReader(data))
		got, ok := decodeJPEGTurbo(data, cfg.Width, cfg.Height, make([]byte, cfg.Width*cfg.Height*4), nil)
		switch {
		case refErr != nil:
			if ok {
				t.Errorf("%s: image/jpeg refuses it (%v), libjpeg-turbo decoded it", name, refErr)
			}
			_, _, err := DecodeBudgeted(context.Background(), base64.StdEncoding.EncodeToString(data), Options{}, nil)
			if err == nil || !strings.Contains(err.Error(), refErr.Error()) {
				t.Errorf("%s: Decode error %v, want image/jpeg's %v", name, err, refErr)
			}
			continue
		case fallback[name]:
			if ok {
				t.Errorf("%s: libjpeg-turbo decoded a colour space it should leave to image/jpeg", name)
			}
			continue
		case !ok:
			t.Errorf("%s: libjpeg-turbo refused a file image/jpeg decodes (%T)", name, ref)
			continue
		}
		want := image.NewRGBA(image.Rect(0, 0, cfg.Width, cfg.Height))
		draw.Draw(want, want.Rect, ref, ref.Bounds().Min, draw.Src)
		maxD, sum := 0, 0
		for i, v := range want.Pix {
			d := int(v) - int(got.Pix[i])
			d = max(d, -d)
			maxD, sum = max(maxD, d), sum+d
		}
		mean := float64(sum) / float64(len(want.Pix))
		if maxD > turboMaxDiff || mean > turboMaxMean {
			t.Errorf("%s (%T): max difference %d, mean %.3f; want <= %d, <= %.2f", name, ref, maxD, mean, turboMaxDiff, turboMaxMean)
		}
	}
}

// TestTurboRefusesDamage: cutting or corrupting a file never yields an
// image from libjpeg-turbo that image/jpeg would refuse, never crashes, and
// Decode still answers with image/jpeg's error.
func TestTurboRefusesDamage(t *testing.T) {
	data, err := os.ReadFile("testdata/video-001.q50.420.jpeg")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := jpeg.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	try := func(what string, d []byte) {
		if _, err := jpeg.Decode(bytes.NewReader(d)); err != nil {
			refused++
			if _, ok := decodeJPEGTurbo(d, cfg.Width, cfg.Height, make([]byte, cfg.Width*cfg.Height*4), nil); ok {
				t.Errorf("%s: image/jpeg refuses it (%v), libjpeg-turbo decoded it", what, err)
			}
			// Decode reports image/jpeg's error (when the header still
			// passes; otherwise DecodeConfig's).
			if _, _, derr := DecodeBudgeted(context.Background(), base64.StdEncoding.EncodeToString(d), Options{}, nil); derr == nil {
				t.Errorf("%s: Decode accepted a file image/jpeg refuses (%v)", what, err)
			} else if _, cerr := jpeg.DecodeConfig(bytes.NewReader(d)); cerr == nil && !strings.Contains(derr.Error(), err.Error()) {
				t.Errorf("%s: Decode error %v, want image/jpeg's %v", what, derr, err)
			}
		}
	}
	for n := len(data) - 1; n > 0; n -= 97 {
		try("cut", data[:n])
	}
	for i := 2; i < len(data); i += 53 {
		d := bytes.Clone(data)
		d[i] ^= 0xA5
		try("flipped", d)
	}
	if refused < 10 {
		t.Fatalf("only %d damaged files refused by image/jpeg; the test needs more", refused)
	}
	if _, ok := decodeJPEGTurbo(data, cfg.Width+1, cfg.Height, make([]byte, (cfg.Width+1)*cfg.Height*4), nil); ok {
		t.Error("decoded with other dimensions than the header's")
	}
}

package upscale

import (
	"encoding/binary"
	"image"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// photo is skimage's astronaut test photo (Debian python3-skimage).
const photo = "/usr/lib/python3/dist-packages/skimage/data/astronaut.png"

// loadThick loads the ESRGAN thick folder that scripts/assets-upscale.sh
// installs, with the given option overrides.
func loadThick(t testing.TB, opts map[string]string) *Engine {
	t.Helper()
	dir := onnxtest.AssetDir(t, "esrgan-thick", "esrgan-thick-x2.onnx", "esrgan-thick-x4.onnx")
	o := map[string]string{"layout": "nhwc", "input_range": "1"}
	for k, v := range opts {
		o[k] = v
	}
	e, err := load(onnxtest.Runtime(t), engine.Spec{
		ID: "onnx/esrgan/thick", Task: engine.TaskImageUpscale, Dir: dir,
		Files: map[string]string{"x2": "esrgan-thick-x2.onnx", "x4": "esrgan-thick-x4.onnx"}, Options: o,
	})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// readPhoto decodes the test photo and returns its crop r.
func readPhoto(t testing.TB, r image.Rectangle) *image.NRGBA {
	t.Helper()
	f, err := os.Open(photo)
	if err != nil {
		t.Fatalf("test photo (install python3-skimage-data or python3-skimage): %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("decode %s: %v", photo, err)
	}
	full := toNRGBA(img)
	return toNRGBA(full.SubImage(r))
}

// boxDown shrinks img by the integer factor s, averaging s×s blocks.
func boxDown(img *image.NRGBA, s int) *image.NRGBA {
	w, h := img.Rect.Dx()/s, img.Rect.Dy()/s
	out := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			for c := range 4 {
				sum := 0
				for dy := range s {
					for dx := range s {
						sum += int(img.Pix[(y*s+dy)*img.Stride+4*(x*s+dx)+c])
					}
				}
				out.Pix[y*out.Stride+4*x+c] = uint8((sum + s*s/2) / (s * s))
			}
		}
	}
	return out
}

// psnr is the RGB peak signal-to-noise ratio of a against b in dB.
func psnr(t testing.TB, a, b *image.NRGBA) float64 {
	t.Helper()
	if a.Rect.Size() != b.Rect.Size() {
		t.Fatalf("psnr: sizes %v and %v differ", a.Rect.Size(), b.Rect.Size())
	}
	var se float64
	n := 0
	for y := range a.Rect.Dy() {
		for x := range a.Rect.Dx() {
			for c := range 3 {
				d := float64(a.Pix[y*a.Stride+4*x+c]) - float64(b.Pix[y*b.Stride+4*x+c])
				se += d * d
				n++
			}
		}
	}
	return 10 * math.Log10(255*255/(se/float64(n)))
}

// diff returns the largest and the mean absolute difference of a and b's
// RGBA bytes.
func diff(t testing.TB, a, b *image.NRGBA) (maxd int, mean float64) {
	t.Helper()
	if a.Rect.Size() != b.Rect.Size() {
		t.Fatalf("diff: sizes %v and %v differ", a.Rect.Size(), b.Rect.Size())
	}
	sum := 0
	for y := range a.Rect.Dy() {
		for x := range 4 * a.Rect.Dx() {
			d := int(a.Pix[y*a.Stride+x]) - int(b.Pix[y*b.Stride+x])
			if d < 0 {
				d = -d
			}
			maxd = max(maxd, d)
			sum += d
		}
	}
	return maxd, float64(sum) / float64(4*a.Rect.Dx()*a.Rect.Dy())
}

// readF32 reads a little-endian float32 test file.
func readF32(t testing.TB, name string) []float32 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

package imagecodec

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/color/palette"
	"image/draw"
	"image/gif"
	"image/jpeg"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

// testImage is a small gradient with a few distinct colours.
func testImage(w, h int) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.SetNRGBA(x, y, color.NRGBA{uint8(x * 255 / max(w-1, 1)), uint8(y * 255 / max(h-1, 1)), uint8((x + y) % 256), 255})
		}
	}
	return img
}

func encodePNG(t testing.TB, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeJPEG(t testing.TB, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := jpeg.Encode(&b, img, &jpeg.Options{Quality: 90}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeGIF(t testing.TB, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := gif.Encode(&b, img, nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// pngHeaderOnly returns a PNG signature and IHDR chunk claiming w x h 8-bit
// grey pixels, with no image data after it.
func pngHeaderOnly(w, h uint32) []byte {
	var b bytes.Buffer
	b.WriteString("\x89PNG\r\n\x1a\n")
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], w)
	binary.BigEndian.PutUint32(ihdr[4:], h)
	ihdr[8] = 8 // bit depth
	ihdr[9] = 0 // greyscale
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(ihdr)))
	b.Write(n[:])
	chunk := append([]byte("IHDR"), ihdr...)
	b.Write(chunk)
	binary.BigEndian.PutUint32(n[:], crc32.ChecksumIEEE(chunk))
	b.Write(n[:])
	return b.Bytes()
}

// mimeWrap breaks s into 76-character lines, as MIME encoders do.
func mimeWrap(s string) string {
	var sb strings.Builder
	for len(s) > 76 {
		sb.WriteString(s[:76])
		sb.WriteString("\r\n")
		s = s[76:]
	}
	sb.WriteString(s)
	return sb.String()
}

func TestDecodeAccepts(t *testing.T) {
	src := testImage(37, 23)
	pngData := encodePNG(t, src)
	std := base64.StdEncoding.EncodeToString(pngData)
	cases := []struct {
		name string
		in   string
	}{
		{"std padded", std},
		{"std unpadded", base64.RawStdEncoding.EncodeToString(pngData)},
		{"url padded", base64.URLEncoding.EncodeToString(pngData)},
		{"url unpadded", base64.RawURLEncoding.EncodeToString(pngData)},
		{"surrounding whitespace", "\n  " + std + " \n"},
		{"mime line breaks", mimeWrap(std)},
		{"data url", "data:image/png;base64," + std},
		{"data url upper case", "DATA:IMAGE/PNG;BASE64," + std},
		{"data url with parameter", "data:image/png;name=x.png;base64," + std},
		{"data url declaring another image type", "data:image/jpeg;base64," + std},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			img, err := decode(c.in, 0)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			assertSamePixels(t, src, img, 0)
		})
	}
}

func TestDecodeFormats(t *testing.T) {
	src := testImage(40, 30)
	cases := []struct {
		name      string
		data      []byte
		tolerance int
	}{
		{"png", encodePNG(t, src), 0},
		{"jpeg", encodeJPEG(t, src), 40},
		{"gif", encodeGIF(t, src), 80},
		{"png paletted", encodePNG(t, toPaletted(src)), 80},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			img, err := decode(base64.StdEncoding.EncodeToString(c.data), 0)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			assertSamePixels(t, src, img, c.tolerance)
		})
	}
}

func toPaletted(src image.Image) *image.Paletted {
	p := image.NewPaletted(src.Bounds(), palette.Plan9)
	for y := src.Bounds().Min.Y; y < src.Bounds().Max.Y; y++ {
		for x := src.Bounds().Min.X; x < src.Bounds().Max.X; x++ {
			p.Set(x, y, src.At(x, y))
		}
	}
	return p
}

// assertSamePixels compares got with want channel by channel, allowing
// tolerance per 8-bit channel (lossy formats).
func assertSamePixels(t *testing.T, want *image.NRGBA, got image.Image, tolerance int) {
	t.Helper()
	if got.Bounds().Size() != want.Bounds().Size() {
		t.Fatalf("size %v, want %v", got.Bounds().Size(), want.Bounds().Size())
	}
	gb := got.Bounds()
	for y := range want.Rect.Dy() {
		for x := range want.Rect.Dx() {
			w := want.NRGBAAt(x, y)
			g := color.NRGBAModel.Convert(got.At(gb.Min.X+x, gb.Min.Y+y)).(color.NRGBA)
			for i, d := range []int{int(w.R) - int(g.R), int(w.G) - int(g.G), int(w.B) - int(g.B), int(w.A) - int(g.A)} {
				if d > tolerance || -d > tolerance {
					t.Fatalf("pixel (%d,%d) channel %d: got %v, want %v (tolerance %d)", x, y, i, g, w, tolerance)
				}
			}
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	pngData := encodePNG(t, testImage(64, 64))
	std := base64.StdEncoding.EncodeToString(pngData)
	webp := append([]byte("RIFF\x10\x00\x00\x00WEBPVP8 "), make([]byte, 16)...)
	cases := []struct {
		name string
		in   string
		opts Options
		msg  string
	}{
		{"empty", "", Options{}, "empty"},
		{"blank", " \n\t", Options{}, "empty"},
		{"only padding", "====", Options{}, "empty"},
		{"remote url", "https://example.com/cat.png", Options{}, "remote URLs are not fetched"},
		{"data url without comma", "data:image/png;base64", Options{}, "no comma"},
		{"data url not base64", "data:image/png," + std, Options{}, "base64-encoded"},
		{"data url not an image", "data:text/plain;base64," + std, Options{}, "image/* media type"},
		{"data url without type", "data:;base64," + std, Options{}, "image/* media type"},
		{"invalid characters", "iVBORw0K!!!!", Options{}, "neither valid base64"},
		{"inner space", std[:20] + " " + std[20:], Options{}, "neither valid base64"},
		{"mixed alphabets", "ab+c-d/e_f", Options{}, "mixes"},
		{"impossible length", "AAAAA", Options{}, "neither valid base64"},
		{"too many bytes", std, Options{MaxBytes: len(pngData) - 1}, "byte limit"},
		{"too many pixels", std, Options{MaxPixels: 64*64 - 1}, "pixel limit"},
		{"huge header", base64.StdEncoding.EncodeToString(pngHeaderOnly(100_000, 100_000)), Options{}, "pixel limit"},
		{"zero-size header", base64.StdEncoding.EncodeToString(pngHeaderOnly(0, 10)), Options{}, "could not be decoded as PNG"},
		{"broken webp", base64.StdEncoding.EncodeToString(webp), Options{}, "could not be decoded as WebP"},
		{"unknown format", base64.StdEncoding.EncodeToString([]byte("hello, world")), Options{}, "not recognised"},
		{"truncated png", base64.StdEncoding.EncodeToString(pngData[:len(pngData)/2]), Options{}, "could not be decoded as PNG"},
		{"truncated jpeg", base64.StdEncoding.EncodeToString(encodeJPEG(t, testImage(64, 64))[:200]), Options{}, "could not be decoded as JPEG"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			img, err := decodeOpts(c.in, c.opts)
			if err == nil {
				t.Fatalf("Decode accepted the input: %v", img.Bounds())
			}
			assertInputError(t, err)
			if !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q does not mention %q", err, c.msg)
			}
		})
	}
}

func TestDecodeByteLimitIsInclusive(t *testing.T) {
	pngData := encodePNG(t, testImage(8, 8))
	if _, err := decode(base64.StdEncoding.EncodeToString(pngData), len(pngData)); err != nil {
		t.Fatalf("an image of exactly the limit was refused: %v", err)
	}
}

func assertInputError(t *testing.T, err error) {
	t.Helper()
	var ie *engine.InputError
	if !errors.As(err, &ie) {
		t.Fatalf("error %v (%T) is not an *engine.InputError", err, err)
	}
	if ie.Param != "image" {
		t.Fatalf("error names param %q, want image", ie.Param)
	}
	if !errors.Is(err, engine.ErrInvalidInput) {
		t.Fatalf("error %v is not engine.ErrInvalidInput", err)
	}
}

func TestEncodePNGDataURLRoundTrip(t *testing.T) {
	src := testImage(33, 17)
	// Partial transparency must survive exactly.
	for i := 3; i < len(src.Pix); i += 4 {
		src.Pix[i] = uint8(i / 4 % 256)
	}
	url, err := EncodePNGDataURL(src)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(url, "data:image/png;base64,") {
		t.Fatalf("not a PNG data URL: %.40s", url)
	}
	img, err := decode(url, 0)
	if err != nil {
		t.Fatalf("decode own output: %v", err)
	}
	assertSamePixels(t, src, img, 0)
}

func TestEncodePNGDataURLNil(t *testing.T) {
	if _, err := EncodePNGDataURL(nil); err == nil {
		t.Fatal("nil image encoded")
	}
}

// FuzzDecode checks that no input makes Decode panic, that every refusal is
// an input error on "image", and that accepted images respect the limits.
func FuzzDecode(f *testing.F) {
	src := testImage(12, 9)
	var jb, gb, pb bytes.Buffer
	_ = jpeg.Encode(&jb, src, nil)
	_ = gif.Encode(&gb, src, nil)
	_ = png.Encode(&pb, src)
	seeds := [][]byte{pb.Bytes(), jb.Bytes(), gb.Bytes(), pngHeaderOnly(1<<20, 1<<20), []byte("GIF89a"), []byte("RIFF0000WEBP")}
	// WebP files and JPEGs with EXIF orientations.
	for _, name := range []string{"gopher-doc.with-alpha.lossless.webp", "video-001.lossy.webp"} {
		if d, err := os.ReadFile(filepath.Join("testdata", name)); err == nil {
			seeds = append(seeds, d)
		} else {
			f.Fatal(err)
		}
	}
	small := encodeJPEG(f, testImage(12, 9))
	for _, o := range []uint16{3, 6, 8} {
		seeds = append(seeds, withSegments(small, exifSegment(o, binary.LittleEndian)), withSegments(small, jfifSegment, exifSegment(o, binary.BigEndian)))
	}
	for _, d := range seeds {
		f.Add(base64.StdEncoding.EncodeToString(d))
		f.Add("data:image/png;base64," + base64.RawURLEncoding.EncodeToString(d))
	}
	f.Add("")
	f.Add("data:")
	f.Add("data:image/png;base64,")
	f.Add("====")
	f.Add("https://x")
	opts := Options{MaxBytes: 1 << 16, MaxPixels: 1 << 16}
	bud := NewBudget(0)
	f.Fuzz(func(t *testing.T, s string) {
		img, err := decodeOpts(s, opts)
		// Streamed (a JPEG decoded by its consumer): the same picture or
		// the same error.
		sImg, sErr := decodeStream(s, opts, bud)
		if (err == nil) != (sErr == nil) || (err != nil && err.Error() != sErr.Error()) {
			t.Fatalf("streamed: %v, at once: %v", sErr, err)
		}
		if err != nil {
			if img != nil {
				t.Fatal("image returned with an error")
			}
			assertInputError(t, err)
			return
		}
		b := img.Bounds()
		if b.Empty() || b.Dx()*b.Dy() > opts.MaxPixels {
			t.Fatalf("accepted image of %v beyond the limits", b)
		}
		want := image.NewRGBA(image.Rect(0, 0, b.Dx(), b.Dy()))
		draw.Draw(want, want.Rect, img, b.Min, draw.Src)
		if !bytes.Equal(want.Pix, sImg.(*image.RGBA).Pix) {
			t.Fatal("streamed pixels differ from a decode at once")
		}
	})
}

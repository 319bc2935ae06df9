package imagecodec

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

// exifSegment builds an APP1 Exif segment whose IFD0 holds a dummy
// ImageWidth entry, then Orientation o, in byte order bo.
func exifSegment(o uint16, bo binary.ByteOrder) []byte {
	var t bytes.Buffer
	if bo == binary.LittleEndian {
		t.WriteString("II")
	} else {
		t.WriteString("MM")
	}
	w := func(v any) { _ = binary.Write(&t, bo, v) }
	w(uint16(42))
	w(uint32(8)) // IFD0 offset
	w(uint16(2)) // entries
	w(uint16(0x0100))
	w(uint16(3))
	w(uint32(1))
	w(uint16(640))
	w(uint16(0))
	w(uint16(orientationTag))
	w(uint16(3))
	w(uint32(1))
	w(o)
	w(uint16(0))
	w(uint32(0)) // no next IFD
	payload := append([]byte("Exif\x00\x00"), t.Bytes()...)
	seg := []byte{0xFF, 0xE1, 0, 0}
	binary.BigEndian.PutUint16(seg[2:], uint16(len(payload)+2))
	return append(seg, payload...)
}

// withSegments inserts segments right after a JPEG's SOI marker.
func withSegments(jpg []byte, segs ...[]byte) []byte {
	out := append([]byte(nil), jpg[:2]...)
	for _, s := range segs {
		out = append(out, s...)
	}
	return append(out, jpg[2:]...)
}

// jfifSegment is a minimal APP0 JFIF segment, as most cameras' files start.
var jfifSegment = []byte{0xFF, 0xE0, 0, 16, 'J', 'F', 'I', 'F', 0, 1, 1, 0, 0, 1, 0, 1, 0, 0}

// upright is a 48x32 picture of four flat quadrants (red, green / blue,
// white), so any wrong turn or flip moves a colour to another corner even
// through JPEG compression.
func upright() *image.NRGBA {
	const w, h = 48, 32
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			c := color.NRGBA{255, 0, 0, 255}
			switch {
			case x >= w/2 && y < h/2:
				c = color.NRGBA{0, 255, 0, 255}
			case x < w/2 && y >= h/2:
				c = color.NRGBA{0, 0, 255, 255}
			case x >= w/2 && y >= h/2:
				c = color.NRGBA{255, 255, 255, 255}
			}
			img.SetNRGBA(x, y, c)
		}
	}
	return img
}

// stored returns the pixels a camera stores for the upright picture u
// under EXIF orientation o, from the EXIF definition of where the stored
// row 0 and column 0 lie in the visual picture (1: top, left; 2: top,
// right; 3: bottom, right; 4: bottom, left; 5: left, top; 6: right, top;
// 7: right, bottom; 8: left, bottom).
func stored(u *image.NRGBA, o int) *image.NRGBA {
	w, h := u.Rect.Dx(), u.Rect.Dy()
	sw, sh := w, h
	if o >= 5 {
		sw, sh = h, w
	}
	s := image.NewNRGBA(image.Rect(0, 0, sw, sh))
	for r := range sh {
		for c := range sw {
			var ux, uy int
			switch o {
			case 1:
				ux, uy = c, r
			case 2:
				ux, uy = w-1-c, r
			case 3:
				ux, uy = w-1-c, h-1-r
			case 4:
				ux, uy = c, h-1-r
			case 5:
				ux, uy = r, c
			case 6:
				ux, uy = w-1-r, c
			case 7:
				ux, uy = w-1-r, h-1-c
			case 8:
				ux, uy = r, h-1-c
			}
			s.SetNRGBA(c, r, u.NRGBAAt(ux, uy))
		}
	}
	return s
}

// TestDecodeEXIFOrientation decodes JPEGs stored in each of the 8 EXIF
// orientations (both TIFF byte orders, with and without a JFIF segment
// first) and checks that each comes out as the upright picture.
func TestDecodeEXIFOrientation(t *testing.T) {
	u := upright()
	for o := 1; o <= 8; o++ {
		for _, bo := range []binary.ByteOrder{binary.BigEndian, binary.LittleEndian} {
			jpg := encodeJPEG(t, stored(u, o))
			for _, data := range [][]byte{
				withSegments(jpg, exifSegment(uint16(o), bo)),
				withSegments(jpg, jfifSegment, exifSegment(uint16(o), bo)),
			} {
				if got := jpegOrientation(data); got != o {
					t.Fatalf("orientation %d (%v): read %d", o, bo, got)
				}
				img, err := decode(base64.StdEncoding.EncodeToString(data), 0)
				if err != nil {
					t.Fatalf("orientation %d: %v", o, err)
				}
				assertSamePixels(t, u, img, 40)
			}
		}
	}
}

// TestEXIFOrientationMalformed checks that broken or hostile EXIF data is
// ignored (orientation 1), never read out of bounds.
func TestEXIFOrientationMalformed(t *testing.T) {
	good := withSegments(encodeJPEG(t, upright()), exifSegment(6, binary.BigEndian))
	seg := exifSegment(6, binary.BigEndian)
	cases := map[string][]byte{
		"no exif":          encodeJPEG(t, upright()),
		"orientation 0":    withSegments(encodeJPEG(t, upright()), exifSegment(0, binary.BigEndian)),
		"orientation 9":    withSegments(encodeJPEG(t, upright()), exifSegment(9, binary.LittleEndian)),
		"truncated":        good[:2+len(seg)-6],
		"segment too long": append([]byte{0xFF, 0xD8, 0xFF, 0xE1, 0xFF, 0xFF}, seg[4:]...),
		"not a jpeg":       []byte("GIF89a"),
		"short":            {0xFF, 0xD8},
	}
	bad := bytes.Clone(good)
	binary.BigEndian.PutUint32(bad[4+6+4:], 0xFFFFFFF0) // IFD0 offset far away
	cases["ifd offset"] = bad
	bad = bytes.Clone(good)
	binary.BigEndian.PutUint16(bad[4+6+8:], 0xFFFF) // entry count beyond the data
	cases["entry count"] = bad
	for name, data := range cases {
		if got := jpegOrientation(data); got != 1 {
			t.Errorf("%s: orientation %d, want 1", name, got)
		}
	}
}

// TestDecodeWebP decodes a lossless WebP (with alpha) and a lossy one and
// compares them with PNGs of the same pictures.
func TestDecodeWebP(t *testing.T) {
	for _, tc := range []struct {
		webp, png string
		tolerance int
	}{
		{"gopher-doc.with-alpha.lossless.webp", "gopher-doc.with-alpha.png", 0},
		{"video-001.lossy.webp", "video-001.png", -1}, // -1: mean difference
	} {
		data, err := os.ReadFile(filepath.Join("testdata", tc.webp))
		if err != nil {
			t.Fatal(err)
		}
		ref, err := os.ReadFile(filepath.Join("testdata", tc.png))
		if err != nil {
			t.Fatal(err)
		}
		want, err := png.Decode(bytes.NewReader(ref))
		if err != nil {
			t.Fatal(err)
		}
		wantN := image.NewNRGBA(want.Bounds())
		for y := want.Bounds().Min.Y; y < want.Bounds().Max.Y; y++ {
			for x := want.Bounds().Min.X; x < want.Bounds().Max.X; x++ {
				wantN.Set(x, y, want.At(x, y))
			}
		}
		img, err := decode("data:image/webp;base64,"+base64.StdEncoding.EncodeToString(data), 0)
		if err != nil {
			t.Fatalf("%s: %v", tc.webp, err)
		}
		if tc.tolerance >= 0 {
			assertSamePixels(t, wantN, img, tc.tolerance)
		} else {
			// Lossy (this file is strongly compressed): the mean
			// difference from the original must be small, and much
			// smaller than from the original upside down.
			d := meanAbsDiff(t, wantN, img)
			flipped := meanAbsDiff(t, stored(wantN, 4), img)
			t.Logf("%s: mean difference %.1f levels (upside down: %.1f)", tc.webp, d, flipped)
			if d > 14 || d > flipped/3 {
				t.Errorf("%s: mean difference %.1f levels from the original (%.1f upside down), want <= 14 and < a third", tc.webp, d, flipped)
			}
		}
		if _, err := decodeOpts(base64.StdEncoding.EncodeToString(data), Options{MaxPixels: want.Bounds().Dx()*want.Bounds().Dy() - 1}); err == nil {
			t.Errorf("%s: the pixel limit was not applied", tc.webp)
		}
	}
}

// meanAbsDiff is the mean absolute difference of the RGB channels of two
// images of the same size.
func meanAbsDiff(t *testing.T, want *image.NRGBA, got image.Image) float64 {
	t.Helper()
	if got.Bounds().Size() != want.Bounds().Size() {
		t.Fatalf("size %v, want %v", got.Bounds().Size(), want.Bounds().Size())
	}
	var sum, n float64
	gb := got.Bounds()
	for y := range want.Rect.Dy() {
		for x := range want.Rect.Dx() {
			w := want.NRGBAAt(x, y)
			g := color.NRGBAModel.Convert(got.At(gb.Min.X+x, gb.Min.Y+y)).(color.NRGBA)
			for _, d := range []int{int(w.R) - int(g.R), int(w.G) - int(g.G), int(w.B) - int(g.B)} {
				sum += float64(max(d, -d))
				n++
			}
		}
	}
	return sum / n
}

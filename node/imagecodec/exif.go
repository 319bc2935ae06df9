package imagecodec

import (
	"encoding/binary"
	"image"
	"image/draw"
)

// Bounds of the EXIF orientation scan: a hostile file cannot make it walk
// more than maxJPEGSegments segments or maxIFDEntries directory entries.
const (
	maxJPEGSegments = 64
	maxIFDEntries   = 512
	orientationTag  = 0x0112
)

// jpegOrientation returns the EXIF Orientation (1-8) of a JPEG file, or 1
// when the file has none or it cannot be read. It walks the marker segments
// before the first scan looking for an APP1 "Exif" segment, reads IFD0 of
// its TIFF structure (either byte order) and the Orientation tag's SHORT
// value. Every offset is checked against the segment's length.
func jpegOrientation(data []byte) int {
	if len(data) < 4 || data[0] != 0xFF || data[1] != 0xD8 {
		return 1
	}
	p := 2
	for range maxJPEGSegments {
		// Skip fill bytes before a marker.
		for p < len(data) && data[p] == 0xFF && p+1 < len(data) && data[p+1] == 0xFF {
			p++
		}
		if p+4 > len(data) || data[p] != 0xFF {
			return 1
		}
		marker := data[p+1]
		if marker == 0xDA || marker == 0xD9 { // start of scan, end of image
			return 1
		}
		if marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7) { // no length
			p += 2
			continue
		}
		n := int(binary.BigEndian.Uint16(data[p+2:]))
		if n < 2 || p+2+n > len(data) {
			return 1
		}
		seg := data[p+4 : p+2+n]
		if marker == 0xE1 && len(seg) >= 6 && string(seg[:6]) == "Exif\x00\x00" {
			if o := tiffOrientation(seg[6:]); o != 0 {
				return o
			}
		}
		p += 2 + n
	}
	return 1
}

// tiffOrientation reads the Orientation tag from IFD0 of a TIFF structure,
// or returns 0.
func tiffOrientation(t []byte) int {
	if len(t) < 8 {
		return 0
	}
	var bo binary.ByteOrder
	switch string(t[:2]) {
	case "II":
		bo = binary.LittleEndian
	case "MM":
		bo = binary.BigEndian
	default:
		return 0
	}
	if bo.Uint16(t[2:]) != 42 {
		return 0
	}
	ifd := int64(bo.Uint32(t[4:]))
	if ifd < 8 || ifd+2 > int64(len(t)) {
		return 0
	}
	count := int(bo.Uint16(t[ifd:]))
	for i := range min(count, maxIFDEntries) {
		e := ifd + 2 + int64(i)*12
		if e+12 > int64(len(t)) {
			return 0
		}
		if bo.Uint16(t[e:]) != orientationTag {
			continue
		}
		// Type SHORT (3), count 1: the value sits in the entry's first
		// two value bytes.
		if bo.Uint16(t[e+2:]) != 3 || bo.Uint32(t[e+4:]) < 1 {
			return 0
		}
		if o := int(bo.Uint16(t[e+8:])); o >= 1 && o <= 8 {
			return o
		}
		return 0
	}
	return 0
}

// orient returns img turned upright for EXIF orientation o (1-8): 2 mirror,
// 3 rotate 180°, 4 flip vertically, 5 transpose, 6 rotate 90° clockwise,
// 7 transverse, 8 rotate 90° counter-clockwise. Orientation 1 returns img
// itself; otherwise the result is a new RGBA (or Gray, for a grey image)
// with its origin at (0, 0).
func orient(img image.Image, o int) image.Image {
	if o <= 1 || o > 8 {
		return img
	}
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	dw, dh := w, h
	if o >= 5 {
		dw, dh = h, w
	}
	// src maps a destination pixel to its source pixel.
	src := func(x, y int) (int, int) {
		switch o {
		case 2:
			return w - 1 - x, y
		case 3:
			return w - 1 - x, h - 1 - y
		case 4:
			return x, h - 1 - y
		case 5:
			return y, x
		case 6:
			return y, h - 1 - x
		case 7:
			return w - 1 - y, h - 1 - x
		}
		return w - 1 - y, x // 8
	}
	if g, ok := img.(*image.Gray); ok && b.Min == (image.Point{}) {
		out := image.NewGray(image.Rect(0, 0, dw, dh))
		for y := range dh {
			for x := range dw {
				sx, sy := src(x, y)
				out.Pix[y*out.Stride+x] = g.Pix[sy*g.Stride+sx]
			}
		}
		return out
	}
	rgba, ok := img.(*image.RGBA)
	if !ok || b.Min != (image.Point{}) {
		rgba = image.NewRGBA(image.Rect(0, 0, w, h))
		draw.Draw(rgba, rgba.Rect, img, b.Min, draw.Src)
	}
	out := image.NewRGBA(image.Rect(0, 0, dw, dh))
	for y := range dh {
		row := out.Pix[y*out.Stride:]
		for x := range dw {
			sx, sy := src(x, y)
			copy(row[4*x:4*x+4], rgba.Pix[sy*rgba.Stride+4*sx:])
		}
	}
	return out
}

// Package imagecodec turns the `image` field of vision requests (plain base64
// or a base64 data URL) into a decoded image, and encodes results back into
// PNG data URLs. Every size is bounded before memory is committed to it, so a
// hostile request cannot make a node allocate more than the configured limits.
// Images stay in memory; nothing is written to disk.
//
// Formats are chosen by sniffing magic bytes and calling the PNG, JPEG, GIF
// (first frame) or WebP decoder directly rather than through image.Decode,
// so importing this package registers nothing in the standard library's
// global format table. A JPEG's EXIF Orientation is applied, so the image
// comes out upright as a viewer would show it.
//
// In cgo builds (without the nolibjpeg tag) JPEGs are decoded by
// libjpeg-turbo, linked statically, straight into an *image.RGBA: about
// four times faster than image/jpeg plus the conversion to RGBA that every
// vision pipeline needs, and within a few levels of image/jpeg's pixels.
// Anything libjpeg-turbo does not decode cleanly (an error, a warning about
// corrupt or truncated data, CMYK or Adobe RGB) goes to image/jpeg, so which
// files are accepted and the errors reported stay image/jpeg's.
package imagecodec

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"strings"

	"golang.org/x/image/webp"

	"github.com/infermesh/infermesh/node/engine"
)

// Defaults applied when an Options field is zero or negative.
const (
	// DefaultMaxBytes bounds the size of the encoded image file (after base64
	// decoding): 32 MiB.
	DefaultMaxBytes = 32 << 20
	// DefaultMaxPixels bounds width*height: 40 megapixels.
	DefaultMaxPixels = 40_000_000
)

// param is the request parameter every caller error names.
const param = "image"

// Options bounds what DecodeBudgeted accepts.
type Options struct {
	// MaxBytes is the largest accepted image file, in bytes after base64
	// decoding (DefaultMaxBytes when <= 0).
	MaxBytes int
	// MaxPixels is the largest accepted width*height (DefaultMaxPixels when
	// <= 0). It is checked from the file header before pixels are decoded.
	MaxPixels int
	// Stream lets DecodeBudgeted return a JPEG as a *Streamed that its
	// consumer decodes (when a Budget is given and the file needs no EXIF
	// rotation); its decoding errors then come from Streamed.Decode.
	Stream bool
	// Check, when set, is called with the width and height read from the
	// file header before any pixel is decoded (and before the budget is
	// reserved); its error is returned as it is. It lets a caller refuse
	// a picture larger than its own limits without decoding it.
	Check func(width, height int) error
}

func (o Options) withDefaults() Options {
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxPixels <= 0 {
		o.MaxPixels = DefaultMaxPixels
	}
	return o
}

// EncodePNGDataURL encodes img as a PNG and returns it as a
// `data:image/png;base64,` URL.
func EncodePNGDataURL(img image.Image) (string, error) {
	if img == nil {
		return "", errors.New("imagecodec: nil image")
	}
	const prefix = "data:image/png;base64,"
	var sb strings.Builder
	sb.WriteString(prefix)
	w := base64.NewEncoder(base64.StdEncoding, &sb)
	if err := png.Encode(w, img); err != nil {
		return "", fmt.Errorf("imagecodec: encode png: %w", err)
	}
	if err := w.Close(); err != nil {
		return "", fmt.Errorf("imagecodec: encode png: %w", err)
	}
	return sb.String(), nil
}

func inputErr(format string, args ...any) error {
	return &engine.InputError{Param: param, Msg: fmt.Sprintf(format, args...)}
}

// base64Payload strips a data URL header if present and returns the base64
// text. Anything that is neither base64 nor a base64 data URL is refused.
func base64Payload(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", inputErr("image is empty; send base64 or a data:image/...;base64, URL")
	}
	if !hasPrefixFold(s, "data:") {
		if hasPrefixFold(s, "http://") || hasPrefixFold(s, "https://") {
			return "", inputErr("image must be base64 or a data: URL; remote URLs are not fetched")
		}
		return s, nil
	}
	comma := strings.IndexByte(s, ',')
	if comma < 0 {
		return "", inputErr("image data URL has no comma before its data")
	}
	params := strings.Split(s[len("data:"):comma], ";")
	mediaType := strings.ToLower(strings.TrimSpace(params[0]))
	if !strings.HasPrefix(mediaType, "image/") {
		if mediaType == "" {
			mediaType = "none"
		}
		return "", inputErr("image data URL must have an image/* media type, got %s", mediaType)
	}
	if len(params) < 2 || !strings.EqualFold(strings.TrimSpace(params[len(params)-1]), "base64") {
		return "", inputErr("image data URL must be base64-encoded (data:%s;base64,...)", mediaType)
	}
	return strings.TrimSpace(s[comma+1:]), nil
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// decodeBase64 decodes payload with the alphabet it uses, accepting missing
// padding and line breaks, and refuses output longer than maxBytes without
// allocating more than maxBytes+1 bytes for it.
func decodeBase64(payload string, maxBytes int) ([]byte, error) {
	enc := base64.RawStdEncoding
	// IndexByte is vectorised; ContainsAny walks the text a byte at a time
	// (0.04 ms of a 640x480 JPEG's 86 KB of base64, where nothing is found).
	std := strings.IndexByte(payload, '+') >= 0 || strings.IndexByte(payload, '/') >= 0
	url := strings.IndexByte(payload, '-') >= 0 || strings.IndexByte(payload, '_') >= 0
	switch {
	case std && url:
		return nil, inputErr("image is not valid base64: it mixes the standard (+/) and URL (-_) alphabets")
	case url:
		enc = base64.RawURLEncoding
	}
	payload = strings.TrimRight(payload, "=\r\n\t ")
	if payload == "" {
		return nil, inputErr("image is empty; send base64 or a data:image/...;base64, URL")
	}
	// The decoded length is at most 3/4 of the text, so a buffer of that
	// size (or of the limit plus one byte, when smaller) never grows: a too
	// large input is detected when the limit's extra byte fills.
	buf := make([]byte, min(len(payload)/4*3+3, maxBytes+1))
	var n int
	if enc.DecodedLen(len(payload)) < len(buf) {
		// The whole output fits with room to spare (so the limit's extra
		// byte cannot fill and end the read early): one call, without the
		// streaming decoder's extra pass over the text. Both skip line
		// breaks and refuse anything else that is not base64.
		var err error
		if n, err = enc.Decode(buf, []byte(payload)); err != nil {
			return nil, inputErr("image is neither valid base64 nor a data:image/...;base64, URL")
		}
	} else {
		var err error
		n, err = io.ReadFull(base64.NewDecoder(enc, strings.NewReader(payload)), buf)
		switch {
		case err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		default:
			return nil, inputErr("image is neither valid base64 nor a data:image/...;base64, URL")
		}
	}
	if n > maxBytes {
		return nil, inputErr("image is larger than the %d-byte limit", maxBytes)
	}
	return buf[:n], nil
}

// format is one image container this package decodes.
type format struct {
	name         string
	decodeConfig func(io.Reader) (image.Config, error)
	decode       func(io.Reader) (image.Image, error)
}

// hasMagic reports whether data starts with magic, without allocating.
func hasMagic(data []byte, magic string) bool {
	return len(data) >= len(magic) && string(data[:len(magic)]) == magic
}

// sniff picks the decoder from the file's magic bytes.
func sniff(data []byte) (format, error) {
	switch {
	case hasMagic(data, "\x89PNG\r\n\x1a\n"):
		return format{"PNG", png.DecodeConfig, png.Decode}, nil
	case hasMagic(data, "\xff\xd8\xff"):
		return format{"JPEG", jpeg.DecodeConfig, jpeg.Decode}, nil
	case hasMagic(data, "GIF87a"), hasMagic(data, "GIF89a"):
		return format{"GIF", gif.DecodeConfig, gif.Decode}, nil
	case hasMagic(data, "RIFF") && len(data) >= 12 && string(data[8:12]) == "WEBP":
		return format{"WebP", webp.DecodeConfig, webp.Decode}, nil
	}
	return format{}, inputErr("image format not recognised; send PNG, JPEG, GIF or WebP")
}

// decodeImageWith checks the header's dimensions against maxPixels, calls
// reserve with them, and only then decodes the pixels. A JPEG that
// libjpeg decodes goes into a buffer from pool (nil: a fresh one); that
// buffer is returned as pooled, for the caller to give back with
// pool.put once nothing holds the image, and is nil when the image does
// not live in a pool buffer. With stream, a JPEG that needs no rotation
// comes back as a *Streamed for its consumer to decode (pool must not be
// nil).
func decodeImageWith(data []byte, maxPixels int, reserve func(w, h int) error, pool *pixelPool, stream bool) (img image.Image, pooled []byte, err error) {
	f, err := sniff(data)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := f.decodeConfig(bytes.NewReader(data))
	if err != nil {
		return nil, nil, inputErr("image could not be decoded as %s: %v", f.name, err)
	}
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return nil, nil, inputErr("image has no pixels (%dx%d)", cfg.Width, cfg.Height)
	}
	if int64(cfg.Width)*int64(cfg.Height) > int64(maxPixels) {
		return nil, nil, inputErr("image is %dx%d, more than the %d-pixel limit", cfg.Width, cfg.Height, maxPixels)
	}
	if reserve != nil {
		if err := reserve(cfg.Width, cfg.Height); err != nil {
			return nil, nil, err
		}
	}
	orientation := 1
	if f.name == "JPEG" {
		orientation = jpegOrientation(data)
	}
	if stream && pool != nil && f.name == "JPEG" && turboAvailable && orientation <= 1 {
		buf := pool.get(cfg.Width * cfg.Height * 4)
		return newStream(data, f, cfg.Width, cfg.Height, buf), buf, nil
	}
	if f.name == "JPEG" && turboAvailable {
		// libjpeg writes every byte of the buffer when it succeeds, so a
		// recycled buffer's stale pixels are never seen.
		buf := pool.get(cfg.Width * cfg.Height * 4)
		if m, ok := decodeJPEGTurbo(data, cfg.Width, cfg.Height, buf, nil); ok {
			img, pooled = m, buf
		} else {
			pool.put(buf)
		}
	}
	if img == nil {
		if img, err = f.decode(bytes.NewReader(data)); err != nil {
			return nil, nil, inputErr("image could not be decoded as %s: %v", f.name, err)
		}
	}
	// Rotating needs a copy; Cost's working-copy share covers it.
	if o := orient(img, orientation); o != img {
		img = o
		pool.put(pooled)
		pooled = nil
	}
	b := img.Bounds()
	if b.Empty() || int64(b.Dx())*int64(b.Dy()) > int64(maxPixels) {
		pool.put(pooled)
		if b.Empty() {
			return nil, nil, inputErr("image has no pixels (%dx%d)", b.Dx(), b.Dy())
		}
		return nil, nil, inputErr("image is %dx%d, more than the %d-pixel limit", b.Dx(), b.Dy(), maxPixels)
	}
	return img, pooled, nil
}

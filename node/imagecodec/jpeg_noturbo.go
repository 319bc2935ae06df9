//go:build !cgo || nolibjpeg

package imagecodec

import (
	"image"
	"runtime"
)

// turboAvailable reports whether decodeJPEGTurbo can decode: not without
// cgo or with the nolibjpeg build tag, where every JPEG goes to image/jpeg.
const turboAvailable = false

// decodeJPEGTurbo is not available without cgo or with the nolibjpeg
// build tag.
func decodeJPEGTurbo([]byte, int, int, []byte, *int32) (*image.RGBA, bool) { return nil, false }

// osYield yields the processor (no stream is ever made without libjpeg).
func osYield() { runtime.Gosched() }

package imagecodec

import (
	"bytes"
	"image"
	"image/color"
	"sync"
	"sync/atomic"
)

// Streamed is a JPEG that libjpeg decodes when its consumer asks
// (Decode), row by row, so that another goroutine can read the first rows
// while the last are decoded: a resize into a model's input runs beside
// the decode on a second core instead of after it. DecodeBudgeted returns
// one only when asked (Options.Stream) and for JPEGs libjpeg takes without
// rotation; the header has been checked and the budget reserved.
//
// The goroutine that will run the model calls Decode itself: a goroutine
// that waits (parks) for another is often resumed on another thread, and
// the model run it starts next then runs measurably slower, its caches
// being on the other core (node/engine/vision/DESIGN.md).
type Streamed struct {
	data     []byte
	f        format
	rgba     *image.RGBA   // the buffer libjpeg fills, row by row
	progress *int32        // rows of rgba decoded so far, stored by C
	once     sync.Once     // runs the decode (or gives it up, on release)
	done     chan struct{} // closed when the decode has ended
	// After done: the picture (rgba, or image/jpeg's decode of a file
	// libjpeg gave up on) or the error of a file neither decodes.
	final image.Image
	err   error
}

// newStream returns data (a w x h JPEG) to be decoded into pix.
func newStream(data []byte, f format, w, h int, pix []byte) *Streamed {
	return &Streamed{
		data:     data,
		f:        f,
		rgba:     &image.RGBA{Pix: pix, Stride: 4 * w, Rect: image.Rect(0, 0, w, h)},
		progress: new(int32),
		done:     make(chan struct{}),
	}
}

// Decode decodes the picture on the calling goroutine (or waits for the
// decode another goroutine runs) and returns it: the buffer Buffer
// returned, or, when libjpeg gives up on the file, image/jpeg's decode
// into an image of its own (redone), so that rows a reader already took
// are never rewritten under it; or the error of a file neither decodes.
func (s *Streamed) Decode() (img image.Image, redone bool, err error) {
	s.once.Do(s.decode)
	<-s.done
	if s.err != nil {
		return nil, false, s.err
	}
	return s.final, s.final != image.Image(s.rgba), nil
}

func (s *Streamed) decode() {
	defer close(s.done)
	w, h := s.rgba.Rect.Dx(), s.rgba.Rect.Dy()
	if _, ok := decodeJPEGTurbo(s.data, w, h, s.rgba.Pix, s.progress); ok {
		s.final = s.rgba
		return
	}
	img, err := s.f.decode(bytes.NewReader(s.data))
	if err != nil {
		s.err = inputErr("image could not be decoded as %s: %v", s.f.name, err)
		return
	}
	s.final = img
}

// abandon ends a stream nobody decoded (and waits for a running decode).
func (s *Streamed) abandon() {
	s.once.Do(func() {
		s.err = inputErr("image was released before it was decoded")
		close(s.done)
	})
	<-s.done
}

// Buffer is the RGBA buffer Decode fills; its rows are final once Rows
// says so.
func (s *Streamed) Buffer() *image.RGBA { return s.rgba }

// Rows waits, while another goroutine runs Decode, until the first n rows
// of Buffer are decoded. It reports false when they never will be
// (libjpeg gave up on the file, or it was released undecoded); Decode
// then tells what to use instead.
//
// It spins for as long as libjpeg is decoding on the other goroutine
// (libjpeg always ends by storing its row count or -1, so the wait is
// bounded by the decode), without yielding to the Go scheduler, whose
// threads then competed with the decoding one for the cores (in a 640x480
// CenterNet request the decode took 1.9 ms instead of 1.1 at the median),
// but giving its CPU to any other runnable thread between checks
// (sched_yield): it is often woken on the decoder's own CPU.
func (s *Streamed) Rows(n int) bool {
	n = min(n, s.rgba.Rect.Dy())
	for {
		p := atomic.LoadInt32(s.progress)
		switch {
		case p >= int32(n):
			return true
		case p < 0:
			return false
		}
		select {
		case <-s.done:
			return atomic.LoadInt32(s.progress) >= int32(n)
		default:
		}
		osYield()
	}
}

// Bounds is the picture's rectangle, known from the header.
func (s *Streamed) Bounds() image.Rectangle { return s.rgba.Rect }

// ColorModel is RGBA's.
func (s *Streamed) ColorModel() color.Model { return color.RGBAModel }

// At decodes the picture first if nobody has; a picture that could not be
// decoded reads as transparent black (Decode reports its error).
func (s *Streamed) At(x, y int) color.Color {
	img, _, err := s.Decode()
	if err != nil {
		return color.RGBA{}
	}
	return img.At(x, y)
}

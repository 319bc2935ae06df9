package engine

import (
	"context"
	"image"
)

// ---------------------------------------------------------------------------
// Text recognition (OCR).
//
// A TextReader finds the lines of text in an image and reads them. It is
// used on its own and as one source of the composed image describer.

// TaskTextRecognition finds and reads the text lines of an image (the
// shipped model is PaddleOCR PP-OCRv4, Chinese and English).
const TaskTextRecognition Task = "text-recognition"

// TextLine is one line (or word group) of text read from an image.
type TextLine struct {
	// Text is what the recogniser read, without leading or trailing space.
	Text string
	// Confidence is the recogniser's mean per-character probability in
	// [0, 1].
	Confidence float32
	// Box is the axis-aligned x, y, width, height (original-image pixels
	// from the top-left corner, clipped to the image) of the possibly
	// rotated region the text was read from.
	Box [4]float32
}

// TextReader is implemented by engines whose Task is TaskTextRecognition.
type TextReader interface {
	Engine
	// Read returns the text lines found in img in reading order (top to
	// bottom, then left to right). An image without text gives an empty
	// slice. Caller errors are InputErrors (param "image"). A cancelled ctx
	// stops the call and returns ctx.Err().
	Read(ctx context.Context, img image.Image) ([]TextLine, error)
}

package imagecodec

import (
	"context"
	"image"
	"image/draw"
)

// decode is DecodeBudgeted without a budget, with a byte limit.
func decode(s string, maxBytes int) (image.Image, error) {
	return decodeOpts(s, Options{MaxBytes: maxBytes})
}

// decodeOpts is DecodeBudgeted without a budget.
func decodeOpts(s string, opts Options) (image.Image, error) {
	img, _, err := DecodeBudgeted(context.Background(), s, opts, nil)
	return img, err
}

// decodeStream decodes s with Options.Stream under bud, decoding a stream
// on the calling goroutine, and returns the picture (released: copied
// when it lived in the budget's pool).
func decodeStream(s string, opts Options, bud *Budget) (image.Image, error) {
	opts.Stream = true
	img, release, err := DecodeBudgeted(context.Background(), s, opts, bud)
	if err != nil {
		return nil, err
	}
	defer release()
	if st, ok := img.(*Streamed); ok {
		if img, _, err = st.Decode(); err != nil {
			return nil, err
		}
	}
	b := img.Bounds()
	out := image.NewRGBA(image.Rect(0, 0, b.Dx(), b.Dy()))
	draw.Draw(out, out.Rect, img, b.Min, draw.Src)
	return out, nil
}

package imagecodec

import (
	"context"
	"image"
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

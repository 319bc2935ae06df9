package engine

import (
	"context"
	"image"
)

// TaskImageUpscale is a super-resolution model: it makes an image 2 or 4
// times larger per side (POST /v1/images/generations with operation
// "upscale").
const TaskImageUpscale Task = "image-upscale"

// Upscaler is implemented by engines whose Task is TaskImageUpscale.
type Upscaler interface {
	Engine
	// Scales lists the factors the model supports, ascending (e.g. [2 4]).
	Scales() []int
	// Upscale returns img enlarged scale times per side. An unsupported
	// scale is an InputError with param "upscale_factor"; an image whose
	// output would exceed the engine's bound (documented by the
	// implementation) is an InputError with param "image". A cancelled ctx
	// stops the run and returns ctx.Err().
	Upscale(ctx context.Context, img image.Image, scale int) (*image.NRGBA, error)
}

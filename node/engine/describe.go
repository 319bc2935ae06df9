package engine

import (
	"context"
	"image"
)

// ---------------------------------------------------------------------------
// Image description (POST /v1/images/describe).

// TaskImageDescription turns an image into a text description. Two kinds
// of engine serve it: a learned captioner (Florence-2) and the composed
// describer, which writes a templated description from object detection,
// face detection and OCR results.
const TaskImageDescription Task = "image-description"

// Description detail levels (DescribeRequest.Detail).
const (
	// DetailCaption asks for one short sentence (the default).
	DetailCaption = "caption"
	// DetailDetailed asks for a paragraph: objects, counts and positions.
	DetailDetailed = "detailed"
	// DetailMore asks for everything the engine can tell (for the composed
	// describer: plus faces, text read and dominant colours).
	DetailMore = "more"
)

// DescribeRequest asks for a description of one image.
type DescribeRequest struct {
	// Image is the decoded picture (any size with at least one pixel).
	Image image.Image
	// Detail is DetailCaption, DetailDetailed or DetailMore; "" means
	// DetailCaption. Other values are InputErrors (param "detail").
	Detail string
}

// Describer is implemented by engines whose Task is TaskImageDescription.
type Describer interface {
	Engine
	// Describe returns a description of req.Image whose length follows
	// req.Detail. Caller errors are InputErrors (param "image" or
	// "detail"). A cancelled ctx stops the call and returns ctx.Err().
	Describe(ctx context.Context, req DescribeRequest) (string, error)
}

package engine

import (
	"context"
	"image"
)

// ---------------------------------------------------------------------------
// Vision: object detection and face analysis.
//
// The types below are what the engines behind POST /v1/vision/detections and
// POST /v1/vision/faces take and give back. Boxes are [x, y, w, h] in pixels
// of the original image, measured from its top-left corner (image.Bounds().Min
// is the origin whatever the image's Min is), clipped to the image.

// Vision tasks.
const (
	// TaskObjectDetection finds labelled objects (COCO-80 classes for the
	// shipped model) and returns their boxes.
	TaskObjectDetection Task = "object-detection"
	// TaskFaceDetection finds faces (box, landmarks) and, when asked,
	// computes a face descriptor for each one.
	TaskFaceDetection Task = "face-detection"
)

// Bounds of DetectRequest.MaxResults and FaceRequest.MaxResults. The API
// layer validates with the same numbers; engines return an InputError
// (param "max_results") for values outside [1, MaxResultsLimit] other
// than 0.
const (
	// DefaultMaxResults is used when MaxResults is 0.
	DefaultMaxResults = 100
	// MaxResultsLimit is the largest accepted MaxResults.
	MaxResultsLimit = 1000
)

// Detection is one detected object.
type Detection struct {
	// Label is the class name, e.g. "person" or "cup".
	Label string
	// Confidence is the model's score in [0, 1].
	Confidence float32
	// Box is x, y, width, height in original-image pixels from the top-left
	// corner, clipped to the image.
	Box [4]float32
}

// DetectRequest asks for the objects in one image.
type DetectRequest struct {
	// Image is the decoded picture (any size with at least one pixel).
	Image image.Image
	// ConfidenceThreshold drops detections scoring below it; 0 means the
	// engine's default (documented by the engine, 0.3 for CenterNet).
	// Values outside [0, 1] are InputErrors (param "confidence_threshold").
	ConfidenceThreshold float32
	// MaxResults caps the number of detections returned, best first;
	// 0 means DefaultMaxResults.
	MaxResults int
}

// Detector is implemented by engines whose Task is TaskObjectDetection.
type Detector interface {
	Engine
	// Detect returns the objects found in req.Image, highest confidence
	// first. Caller errors are InputErrors (param "image",
	// "confidence_threshold" or "max_results"). A cancelled ctx stops the
	// call and returns ctx.Err().
	Detect(ctx context.Context, req DetectRequest) ([]Detection, error)
}

// Face is one detected face.
type Face struct {
	// Confidence is the detector's score in [0, 1].
	Confidence float32
	// Box is x, y, width, height in original-image pixels from the top-left
	// corner, clipped to the image.
	Box [4]float32
	// Landmarks are keypoints in original-image pixels (not clipped). The
	// BlazeFace engine gives six, in this order: the eye on the image's
	// left, the eye on the image's right (for an upright face seen from the
	// front), nose tip, mouth centre, then the two ear tragions in the same
	// left/right order as the eyes.
	Landmarks [][2]float32
	// Embedding is the L2-normalised face descriptor when the request asked
	// for embeddings (nil otherwise); compare two with a dot product
	// (cosine similarity).
	Embedding []float32
}

// FaceRequest asks for the faces in one image.
type FaceRequest struct {
	// Image is the decoded picture (any size with at least one pixel).
	Image image.Image
	// ConfidenceThreshold drops faces scoring below it; 0 means the
	// engine's default (0.5 for BlazeFace). Values outside [0, 1] are
	// InputErrors (param "confidence_threshold").
	ConfidenceThreshold float32
	// MaxResults caps the number of faces returned, best first; 0 means
	// DefaultMaxResults.
	MaxResults int
	// Embeddings asks for a descriptor per returned face.
	Embeddings bool
}

// FaceAnalyzer is implemented by engines whose Task is TaskFaceDetection.
type FaceAnalyzer interface {
	Engine
	// Faces returns the faces found in req.Image, highest confidence first,
	// each with an embedding when req.Embeddings is set. Caller errors are
	// InputErrors (param "image", "confidence_threshold" or "max_results").
	// A cancelled ctx stops the call and returns ctx.Err().
	Faces(ctx context.Context, req FaceRequest) ([]Face, error)
	// EmbeddingDim is the length of Face.Embedding (0 when the engine has
	// no embedder).
	EmbeddingDim() int
}

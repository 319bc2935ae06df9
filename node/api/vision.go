package api

import (
	"context"
	"fmt"
	"image"
	"net/http"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/imagecodec"
)

// MaxImageBytes bounds a decoded image file.
const MaxImageBytes = 24 << 20

// MinImageSide is the smallest width and height a vision route accepts.
const MinImageSide = 8

// backgroundRequest is POST /v1/vision/background. model is optional: without
// it the node's default background-removal model serves.
type backgroundRequest struct {
	Model string `json:"model,omitempty"`
	Image string `json:"image"`
}

// detectionsRequest is POST /v1/vision/detections and (with
// ReturnEmbeddings) POST /v1/vision/faces. model is optional: without it
// the mesh's default model of the task serves.
type detectionsRequest struct {
	Model               string   `json:"model,omitempty"`
	Image               string   `json:"image"`
	ConfidenceThreshold *float64 `json:"confidence_threshold,omitempty"`
	MaxResults          *int     `json:"max_results,omitempty"`
	// ReturnEmbeddings is accepted on the faces route only.
	ReturnEmbeddings bool `json:"return_embeddings,omitempty"`
}

func checkImageRequest(model, img string) error {
	if len(model) > 256 {
		return apierr.BadRequest(apierr.CodeInvalidValue, "model", "The model id is longer than 256 characters.")
	}
	if img == "" {
		return apierr.BadRequest(apierr.CodeMissingParam, "image", "You must provide an image parameter (base64 or a data: URL).")
	}
	return nil
}

func parseBackground(body []byte) (*backgroundRequest, error) {
	var req backgroundRequest
	if err := decodeWithBigString(body, &req, "image", &req.Image); err != nil {
		return nil, err
	}
	if err := checkImageRequest(req.Model, req.Image); err != nil {
		return nil, err
	}
	return &req, nil
}

func parseDetections(faces bool) func(body []byte) (*detectionsRequest, error) {
	return func(body []byte) (*detectionsRequest, error) {
		var req detectionsRequest
		if err := decodeWithBigString(body, &req, "image", &req.Image); err != nil {
			return nil, err
		}
		if !faces && req.ReturnEmbeddings {
			return nil, apierr.BadRequest(apierr.CodeUnknownParam, "return_embeddings", "return_embeddings is a parameter of /v1/vision/faces.")
		}
		if err := checkImageRequest(req.Model, req.Image); err != nil {
			return nil, err
		}
		if t := req.ConfidenceThreshold; t != nil && (*t < 0 || *t > 1) {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "confidence_threshold", "confidence_threshold must be between 0 and 1.")
		}
		if m := req.MaxResults; m != nil && (*m < 1 || *m > engine.MaxResultsLimit) {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "max_results", "max_results must be between 1 and 1000.")
		}
		return &req, nil
	}
}

func noVisionProvider() *apierr.Error {
	return apierr.New(http.StatusNotImplemented, apierr.TypeNotImplemented, apierr.CodeNoProviderConfigured, "model",
		"No vision engine for this endpoint is installed on this mesh.")
}

// visionEngine finds the engine of task for a vision request (model ""
// for the default) and writes the error when there is none: 501
// no_provider_configured while the mesh has no model of the task at all,
// else 404 for an unknown model and 400 for one of another task.
func (s *Server) visionEngine(w http.ResponseWriter, r *http.Request, task engine.Task, model string) (engine.Engine, string, bool) {
	return s.engineOr(w, r, task, model, func() *apierr.Error {
		if model == "" || s.opt.Backend.DefaultModel(string(task)) == "" {
			return noVisionProvider()
		}
		return ModelNotFound(model)
	})
}

// streamConsumer is an engine that takes a JPEG while libjpeg is still
// decoding it (an *imagecodec.Streamed) and starts its resize on the
// first rows, so that the two overlap on two cores.
type streamConsumer interface {
	TakesStreamedImages() bool
}

// runOnImage decodes a request's image for eng and runs fn on it, writing
// any error; the decoded image's budget is held until fn returns. An
// engine that takes streamed images gets a JPEG as it is decoded.
func (s *Server) runOnImage(w http.ResponseWriter, r *http.Request, eng engine.Engine, field string, fn func(ctx context.Context, img image.Image) error) {
	sc, _ := eng.(streamConsumer)
	img, release, err := imagecodec.DecodeBudgeted(r.Context(), field,
		imagecodec.Options{MaxBytes: MaxImageBytes, Stream: sc != nil && sc.TakesStreamedImages()}, s.images)
	if err != nil {
		writeErr(w, err)
		return
	}
	defer release()
	if b := img.Bounds(); b.Dx() < MinImageSide || b.Dy() < MinImageSide {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "image", fmt.Sprintf("The image is %dx%d pixels; vision routes need at least %dx%d.", b.Dx(), b.Dy(), MinImageSide, MinImageSide)))
		return
	}
	if err := fn(r.Context(), img); err != nil {
		writeErr(w, err)
	}
}

func (s *Server) visionBackground(w http.ResponseWriter, r *http.Request) {
	req, ok := decodeRequest(w, r, MaxImageBody, parseBackground)
	if !ok {
		return
	}
	eng, id, ok := s.visionEngine(w, r, engine.TaskBackgroundRemoval, req.Model)
	if !ok {
		return
	}
	s.runOnImage(w, r, eng, req.Image, func(ctx context.Context, img image.Image) error {
		out, err := eng.(engine.BackgroundRemover).RemoveBackground(ctx, img)
		if err != nil {
			return err
		}
		url, err := imagecodec.EncodePNGDataURL(out)
		if err != nil {
			return err
		}
		reportUsage(w, 1, 0) // one input image
		writeJSON(w, http.StatusOK, map[string]any{"image": url, "media_type": "image/png", "model": id})
		return nil
	})
}

// DetectedObject is one object of a detections response.
type DetectedObject struct {
	// Label is the class name (COCO names for the built-in detector).
	Label string `json:"label"`
	// Confidence is the detector's score, 0..1.
	Confidence float32 `json:"confidence"`
	// Box is [x, y, width, height] in the original image's pixels from
	// its top-left corner.
	Box [4]float32 `json:"box"`
}

// DetectionsResponse is the body of POST /v1/vision/detections.
type DetectionsResponse struct {
	// Object is "vision.detections".
	Object string `json:"object"`
	// Model is the canonical id of the model that served.
	Model string `json:"model"`
	// Width and Height are the image's size after EXIF orientation.
	Width int `json:"width"`
	// Height is the image's height in pixels.
	Height int `json:"height"`
	// Objects are the detections, highest confidence first.
	Objects []DetectedObject `json:"objects"`
}

// DetectedFace is one face of a faces response.
type DetectedFace struct {
	// Confidence is the detector's score, 0..1.
	Confidence float32 `json:"confidence"`
	// Box is [x, y, width, height] in the original image's pixels.
	Box [4]float32 `json:"box"`
	// Landmarks are [x, y] points: the image-left eye, image-right eye,
	// nose tip, mouth centre, image-left ear, image-right ear.
	Landmarks [][2]float32 `json:"landmarks,omitempty"`
	// Embedding is the L2-normalised face descriptor, with
	// return_embeddings only.
	Embedding []float32 `json:"embedding,omitempty"`
}

// FacesResponse is the body of POST /v1/vision/faces.
type FacesResponse struct {
	// Object is "vision.faces".
	Object string `json:"object"`
	// Model is the canonical id of the model that served.
	Model string `json:"model"`
	// Width is the image's width in pixels.
	Width int `json:"width"`
	// Height is the image's height in pixels.
	Height int `json:"height"`
	// Faces are the detected faces, highest confidence first.
	Faces []DetectedFace `json:"faces"`
}

func threshold(t *float64) float32 {
	if t == nil {
		return 0 // the engine's default
	}
	return float32(*t)
}

func maxResults(m *int) int {
	if m == nil {
		return 0 // the engine's default
	}
	return *m
}

func (s *Server) visionDetections(w http.ResponseWriter, r *http.Request) {
	req, ok := decodeRequest(w, r, MaxImageBody, parseDetections(false))
	if !ok {
		return
	}
	eng, id, ok := s.visionEngine(w, r, engine.TaskObjectDetection, req.Model)
	if !ok {
		return
	}
	s.runOnImage(w, r, eng, req.Image, func(ctx context.Context, img image.Image) error {
		dets, err := eng.(engine.Detector).Detect(ctx, engine.DetectRequest{
			Image: img, ConfidenceThreshold: threshold(req.ConfidenceThreshold), MaxResults: maxResults(req.MaxResults),
		})
		if err != nil {
			return err
		}
		out := DetectionsResponse{Object: "vision.detections", Model: id, Width: img.Bounds().Dx(), Height: img.Bounds().Dy(),
			Objects: make([]DetectedObject, 0, len(dets))}
		for _, d := range dets {
			out.Objects = append(out.Objects, DetectedObject{Label: d.Label, Confidence: d.Confidence, Box: d.Box})
		}
		reportUsage(w, 1, 0) // one input image
		writeJSON(w, http.StatusOK, out)
		return nil
	})
}

func (s *Server) visionFaces(w http.ResponseWriter, r *http.Request) {
	req, ok := decodeRequest(w, r, MaxImageBody, parseDetections(true))
	if !ok {
		return
	}
	eng, id, ok := s.visionEngine(w, r, engine.TaskFaceDetection, req.Model)
	if !ok {
		return
	}
	s.runOnImage(w, r, eng, req.Image, func(ctx context.Context, img image.Image) error {
		faces, err := eng.(engine.FaceAnalyzer).Faces(ctx, engine.FaceRequest{
			Image: img, ConfidenceThreshold: threshold(req.ConfidenceThreshold), MaxResults: maxResults(req.MaxResults),
			Embeddings: req.ReturnEmbeddings,
		})
		if err != nil {
			return err
		}
		out := FacesResponse{Object: "vision.faces", Model: id, Width: img.Bounds().Dx(), Height: img.Bounds().Dy(),
			Faces: make([]DetectedFace, 0, len(faces))}
		for _, f := range faces {
			out.Faces = append(out.Faces, DetectedFace{Confidence: f.Confidence, Box: f.Box, Landmarks: f.Landmarks, Embedding: f.Embedding})
		}
		reportUsage(w, 1, 0) // one input image
		writeJSON(w, http.StatusOK, out)
		return nil
	})
}

// describeRequest is POST /v1/images/describe.
type describeRequest struct {
	Model  string `json:"model,omitempty"`
	Image  string `json:"image"`
	Detail string `json:"detail,omitempty"`
}

func parseDescribe(body []byte) (*describeRequest, error) {
	var req describeRequest
	if err := decodeWithBigString(body, &req, "image", &req.Image); err != nil {
		return nil, err
	}
	if err := checkImageRequest(req.Model, req.Image); err != nil {
		return nil, err
	}
	switch req.Detail {
	case "":
		req.Detail = engine.DetailCaption
	case engine.DetailCaption, engine.DetailDetailed, engine.DetailMore:
	default:
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "detail", "detail must be caption, detailed or more.")
	}
	return &req, nil
}

// DescriptionResponse is the body of POST /v1/images/describe: an
// editable text prompt describing the image.
type DescriptionResponse struct {
	// Object is "image.description".
	Object string `json:"object"`
	// Model is the canonical id of the model that served.
	Model string `json:"model"`
	// Detail is the level of detail asked for: caption, detailed or more.
	Detail string `json:"detail"`
	// Prompt is the description, ready to edit and use as a prompt.
	Prompt string `json:"prompt"`
}

func (s *Server) imagesDescribe(w http.ResponseWriter, r *http.Request) {
	req, ok := decodeRequest(w, r, MaxImageBody, parseDescribe)
	if !ok {
		return
	}
	eng, id, ok := s.visionEngine(w, r, engine.TaskImageDescription, req.Model)
	if !ok {
		return
	}
	s.runOnImage(w, r, eng, req.Image, func(ctx context.Context, img image.Image) error {
		text, err := eng.(engine.Describer).Describe(ctx, engine.DescribeRequest{Image: img, Detail: req.Detail})
		if err != nil {
			return err
		}
		reportUsage(w, 1, 0) // one input image
		writeJSON(w, http.StatusOK, DescriptionResponse{Object: "image.description", Model: id, Detail: req.Detail, Prompt: text})
		return nil
	})
}

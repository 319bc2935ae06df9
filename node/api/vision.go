package api

import (
	"errors"
	"image"
	"net/http"

	"github.com/infermesh/infermesh/node/imagecodec"
)

// MaxImageBytes bounds a decoded image file.
const MaxImageBytes = 24 << 20

// backgroundRequest is POST /v1/vision/background. model is optional: without
// it the node's default background-removal model serves.
type backgroundRequest struct {
	Model string `json:"model,omitempty"`
	Image string `json:"image"`
}

func parseBackground(body []byte) (*backgroundRequest, error) {
	var req backgroundRequest
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	if len(req.Model) > 256 {
		return nil, BadRequest(CodeInvalidValue, "model", "The model id is longer than 256 characters.")
	}
	if req.Image == "" {
		return nil, BadRequest(CodeMissingParam, "image", "You must provide an image parameter (base64 or a data: URL).")
	}
	return &req, nil
}

// decodeImage decodes a request's image under the node's decoded-image
// memory budget; release returns the reservation.
func (s *Server) decodeImage(r *http.Request, field string) (image.Image, func(), error) {
	return imagecodec.DecodeBudgeted(r.Context(), field, imagecodec.Options{MaxBytes: MaxImageBytes}, s.images)
}

func noVisionProvider() *APIError {
	return Errorf(http.StatusNotImplemented, TypeNotImplemented, CodeNoProviderConfigured, "model",
		"No vision engine for this endpoint is installed on this mesh.")
}

func (s *Server) visionBackground(w http.ResponseWriter, r *http.Request) {
	req, ok := decodeRequest(w, r, MaxImageBody, parseBackground)
	if !ok {
		return
	}
	eng, id, err := s.opt.Backend.BackgroundRemover(r.Context(), req.Model)
	if errors.Is(err, ErrModelNotFound) {
		if req.Model == "" || s.opt.Backend.DefaultModel("background-removal") == "" {
			WriteError(w, noVisionProvider())
		} else {
			WriteError(w, ModelNotFound(req.Model))
		}
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	img, release, err := s.decodeImage(r, req.Image)
	if err != nil {
		writeErr(w, err)
		return
	}
	defer release()
	out, err := eng.RemoveBackground(r.Context(), img)
	if err != nil {
		writeErr(w, err)
		return
	}
	url, err := imagecodec.EncodePNGDataURL(out)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"image": url, "media_type": "image/png", "model": id})
}

// noVisionEngine serves detections and faces: no engine for them exists yet,
// so after validating the body they answer 501 no_provider_configured.
func (s *Server) noVisionEngine(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(r, MaxImageBody)
	if err != nil {
		writeErr(w, err)
		return
	}
	if _, err := peekObject(body); err != nil {
		writeErr(w, err)
		return
	}
	WriteError(w, noVisionProvider())
}

package api

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/audiocodec"
	"github.com/infermesh/infermesh/node/audioenc"
	"github.com/infermesh/infermesh/node/engine"
)

// cloneRequest is POST /v1/audio/clone: speak input in the voice of a
// reference clip. It comes as multipart/form-data (reference_audio a
// file part) or as JSON (reference_audio base64).
type cloneRequest struct {
	Model          string   `json:"model"`
	Input          string   `json:"input"`
	ReferenceAudio string   `json:"reference_audio"`
	ReferenceText  string   `json:"reference_text,omitempty"`
	ResponseFormat string   `json:"response_format,omitempty"`
	Speed          *float64 `json:"speed,omitempty"`
	StreamFormat   string   `json:"stream_format,omitempty"`
	reference      []byte
}

// parseClone reads either form of the clone request and validates it.
func parseClone(body []byte, contentType string) (*cloneRequest, error) {
	var req cloneRequest
	if strings.HasPrefix(contentType, "multipart/") {
		f, err := parseAudioForm(body, contentType, "reference_audio")
		if err != nil {
			return nil, err
		}
		allowed := []string{"model", "input", "reference_text", "response_format", "speed", "stream_format"}
		for name, v := range f.fields {
			if !slices.Contains(allowed, name) {
				return nil, apierr.BadRequest(apierr.CodeUnknownParam, name, fmt.Sprintf("Unrecognized request argument supplied: %s", name))
			}
			if len(v) > 1 {
				return nil, apierr.BadRequest(apierr.CodeInvalidValue, name, name+" is given more than once.")
			}
		}
		req.Model, req.Input, req.ReferenceText = strings.TrimSpace(f.value("model")), f.value("input"), f.value("reference_text")
		req.ResponseFormat, req.StreamFormat = f.value("response_format"), f.value("stream_format")
		if v := strings.TrimSpace(f.value("speed")); v != "" {
			sp, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, apierr.BadRequest(apierr.CodeInvalidValue, "speed", "speed must be a number between 0.25 and 4.0.")
			}
			req.Speed = &sp
		}
		if !f.hasFile {
			return nil, apierr.BadRequest(apierr.CodeMissingParam, "reference_audio", "You must provide reference_audio (a clip of the voice, 3 to 30 s).")
		}
		req.reference = f.file
	} else {
		if err := decodeStrict(body, &req); err != nil {
			return nil, err
		}
		if req.ReferenceAudio == "" {
			return nil, apierr.BadRequest(apierr.CodeMissingParam, "reference_audio", "You must provide reference_audio (base64 of a clip of the voice, 3 to 30 s).")
		}
		if len(req.ReferenceAudio) > MaxAudioFileBytes/3*4+4 {
			return nil, apierr.New(http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, apierr.CodeTooLarge, "reference_audio", "reference_audio is larger than 25 MB.")
		}
		b, err := base64.StdEncoding.DecodeString(req.ReferenceAudio)
		if err != nil {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "reference_audio", "reference_audio is not valid base64.")
		}
		req.reference = b
	}
	speech := speechRequest{Model: req.Model, Input: req.Input, Voice: "", ResponseFormat: req.ResponseFormat, Speed: req.Speed, StreamFormat: req.StreamFormat}
	if err := checkSpeech(&speech); err != nil {
		return nil, err
	}
	switch {
	case len(req.reference) == 0:
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "reference_audio", "reference_audio is empty.")
	case len(req.ReferenceText) > 4096:
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "reference_text", "reference_text is longer than 4096 characters.")
	}
	return &req, nil
}

func (s *Server) audioClone(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(r, MaxAudioFileBytes+1<<20)
	if err != nil {
		writeErr(w, err)
		return
	}
	req, err := parseClone(body, r.Header.Get("Content-Type"))
	if err != nil {
		writeErr(w, err)
		return
	}
	work, ok := s.admitSpeechWork(w, r, req.Input, req.Speed)
	if !ok {
		return
	}
	defer work()
	eng, _, ok := s.taskEngine(w, r, engine.TaskVoiceCloning, req.Model)
	if !ok {
		return
	}
	ref, seconds, err := audiocodec.Decode(req.reference, engine.MaxReferenceSeconds)
	var ie *engine.InputError
	switch {
	case errors.As(err, &ie):
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "reference_audio", "reference_audio: "+ie.Msg))
		return
	case err != nil:
		writeErr(w, err)
		return
	case seconds < engine.MinReferenceSeconds || math.IsNaN(seconds):
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "reference_audio",
			fmt.Sprintf("reference_audio is %.1f s; it must be %d to %d s.", seconds, engine.MinReferenceSeconds, engine.MaxReferenceSeconds)))
		return
	}
	cl := eng.(engine.Cloner)
	format, _ := audioenc.ParseFormat(req.ResponseFormat)
	s.streamAudio(w, r, format, cl.SampleRate(), req.StreamFormat == "sse", len([]rune(req.Input)),
		func(ctx context.Context, emit func([]float32) error) error {
			return cl.Clone(ctx, engine.CloneRequest{Text: req.Input, Reference: ref, ReferenceText: req.ReferenceText, Speed: speed(req.Speed)}, emit)
		})
}

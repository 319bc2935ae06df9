package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/audioenc"
	"github.com/infermesh/infermesh/node/engine"
)

// speechRequest is POST /v1/audio/speech (OpenAI's create speech).
type speechRequest struct {
	Model          string   `json:"model"`
	Input          string   `json:"input"`
	Voice          string   `json:"voice,omitempty"`
	ResponseFormat string   `json:"response_format,omitempty"`
	Speed          *float64 `json:"speed,omitempty"`
	// Instructions is passed to provider (upstream) models; the local
	// models cannot follow style instructions and ignore it.
	Instructions string `json:"instructions,omitempty"`
	StreamFormat string `json:"stream_format,omitempty"`
}

func parseSpeech(body []byte) (*speechRequest, error) {
	var req speechRequest
	if err := decodeStrict(body, &req); err != nil {
		return nil, err
	}
	if err := checkSpeech(&req); err != nil {
		return nil, err
	}
	return &req, nil
}

// checkSpeech validates the fields speech and clone requests share.
func checkSpeech(req *speechRequest) error {
	switch {
	case req.Model == "":
		return apierr.BadRequest(apierr.CodeMissingParam, "model", "You must provide a model parameter.")
	case len(req.Model) > 256:
		return apierr.BadRequest(apierr.CodeInvalidValue, "model", "The model id is longer than 256 characters.")
	case strings.TrimSpace(req.Input) == "":
		return apierr.BadRequest(apierr.CodeMissingParam, "input", "You must provide the input text.")
	case len([]rune(req.Input)) > engine.MaxSpeechInput:
		return apierr.BadRequest(apierr.CodeInvalidValue, "input", fmt.Sprintf("input is longer than %d characters.", engine.MaxSpeechInput))
	case len(req.Voice) > 128:
		return apierr.BadRequest(apierr.CodeInvalidValue, "voice", "voice is longer than 128 characters.")
	case len(req.Instructions) > 4096:
		return apierr.BadRequest(apierr.CodeInvalidValue, "instructions", "instructions are longer than 4096 characters.")
	case req.Speed != nil && (math.IsNaN(*req.Speed) || *req.Speed < engine.MinSpeechSpeed || *req.Speed > engine.MaxSpeechSpeed):
		return apierr.BadRequest(apierr.CodeInvalidValue, "speed", "speed must be between 0.25 and 4.0.")
	}
	if _, err := audioenc.ParseFormat(req.ResponseFormat); err != nil {
		return apierr.BadRequest(apierr.CodeInvalidValue, "response_format", "response_format must be mp3, opus, aac, flac, wav or pcm.")
	}
	switch req.StreamFormat {
	case "", "audio", "sse":
	default:
		return apierr.BadRequest(apierr.CodeInvalidValue, "stream_format", "stream_format must be audio or sse.")
	}
	return nil
}

func speed(s *float64) float32 {
	if s == nil {
		return 1
	}
	return float32(*s)
}

// flushWriter flushes the response after every write, so audio reaches
// the client as it is encoded.
type flushWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (f *flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// streamAudio answers with audio produced chunk by chunk by run, encoded
// as format: a chunked audio body, or server-sent events speech.audio.delta
// and speech.audio.done (sse). Nothing is written before the first chunk,
// so an error before it (a bad voice) is an ordinary error answer; an
// error after it cuts the response.
func (s *Server) streamAudio(w http.ResponseWriter, r *http.Request, format audioenc.Format, rate int, asSSE bool, chars int,
	run func(ctx context.Context, emit func([]float32) error) error) {
	if !s.audio.Available(format) {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "response_format",
			fmt.Sprintf("This node cannot produce %s audio (its encoder is missing); use wav, pcm or flac.", format)))
		return
	}
	ctx := r.Context()
	var enc audioenc.Writer
	var events *sse
	var buf bytes.Buffer
	started := false
	begin := func() error {
		started = true
		if asSSE {
			events = newSSE(w)
			var err error
			enc, err = s.audio.NewWriter(ctx, &buf, format, rate)
			return err
		}
		w.Header().Set("Content-Type", format.ContentType())
		w.WriteHeader(http.StatusOK)
		var err error
		enc, err = s.audio.NewWriter(ctx, &flushWriter{w: w, rc: http.NewResponseController(w)}, format, rate)
		return err
	}
	delta := func() error {
		if buf.Len() == 0 {
			return nil
		}
		err := events.data(map[string]any{"type": "speech.audio.delta", "audio": base64.StdEncoding.EncodeToString(buf.Bytes())})
		buf.Reset()
		return err
	}
	err := run(ctx, func(pcm []float32) error {
		if !started {
			if err := begin(); err != nil {
				return err
			}
		}
		if err := enc.Write(pcm); err != nil {
			return err
		}
		if asSSE {
			return delta()
		}
		return nil
	})
	if err == nil && !started {
		err = errors.New("the model produced no audio")
	}
	if err != nil {
		if !started {
			writeErr(w, err)
			return
		}
		if enc != nil {
			enc.Close()
		}
		if asSSE {
			events.data(map[string]any{"type": "error", "error": map[string]any{"message": err.Error(), "type": apierr.TypeServer, "code": apierr.CodeInternal}})
			return
		}
		s.log.Warn("speech stream broke off", "err", err)
		panic(http.ErrAbortHandler)
	}
	reportUsage(w, int64(chars), 0)
	if err := enc.Close(); err != nil {
		s.log.Warn("speech encoder", "err", err)
		if !asSSE {
			panic(http.ErrAbortHandler)
		}
	}
	if asSSE {
		delta()
		events.data(map[string]any{"type": "speech.audio.done",
			"usage": map[string]any{"input_tokens": chars, "output_tokens": 0, "total_tokens": chars}})
	}
}

func (s *Server) audioSpeech(w http.ResponseWriter, r *http.Request) {
	req, ok := decodeRequest(w, r, MaxJSONBody, parseSpeech)
	if !ok {
		return
	}
	work, ok := s.admitSpeechWork(w, r, req.Input, req.Speed)
	if !ok {
		return
	}
	defer work()
	eng, _, ok := s.taskEngine(w, r, engine.TaskTextToSpeech, req.Model)
	if !ok {
		return
	}
	sp := eng.(engine.Speaker)
	format, _ := audioenc.ParseFormat(req.ResponseFormat)
	s.streamAudio(w, r, format, sp.SampleRate(), req.StreamFormat == "sse", len([]rune(req.Input)),
		func(ctx context.Context, emit func([]float32) error) error {
			return sp.Synthesize(ctx, engine.SpeechRequest{Text: req.Input, Voice: req.Voice, Speed: speed(req.Speed), Instructions: req.Instructions}, emit)
		})
}

// audioVoices is GET /v1/audio/voices?model=ID: the voices of a speech
// model, from the node that holds it.
func (s *Server) audioVoices(w http.ResponseWriter, r *http.Request) {
	model := r.URL.Query().Get("model")
	if model == "" {
		apierr.Write(w, apierr.BadRequest(apierr.CodeMissingParam, "model", "You must provide a model query parameter."))
		return
	}
	eng, id, ok := s.taskEngine(w, r, engine.TaskTextToSpeech, model)
	if !ok {
		return
	}
	sp := eng.(engine.Speaker)
	data := make([]map[string]any, 0, len(sp.Voices()))
	for _, v := range sp.Voices() {
		d := map[string]any{"id": v.ID, "language": v.Language, "gender": v.Gender}
		if len(v.OpenAI) > 0 {
			d["openai_voices"] = v.OpenAI // OpenAI's names that select this voice
		}
		data = append(data, d)
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "model": id, "sample_rate": sp.SampleRate(), "data": data})
}

package api

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/audiocodec"
	"github.com/infermesh/infermesh/node/engine"
)

// MaxAudioSeconds bounds the audio one transcription request may carry.
const MaxAudioSeconds = 30 * 60

// transcriptionRequest is a parsed POST /v1/audio/transcriptions or
// /v1/audio/translations form.
type transcriptionRequest struct {
	Model       string
	File        []byte
	Language    string
	Prompt      string
	Format      string
	Temperature float32
	Words       bool
	Segments    bool
	Stream      bool
	Translate   bool
}

var languageCode = regexp.MustCompile(`^[a-z]{2,3}$`)

// parseTranscription validates a transcription (translate: translation)
// form; each error is a 400 naming its field.
func parseTranscription(body []byte, contentType string, translate bool) (*transcriptionRequest, error) {
	f, err := parseAudioForm(body, contentType, "file")
	if err != nil {
		return nil, err
	}
	allowed := []string{"model", "prompt", "response_format", "temperature"}
	if !translate {
		allowed = append(allowed, "language", "timestamp_granularities[]", "timestamp_granularities", "stream")
	}
	for name, v := range f.fields {
		if !slices.Contains(allowed, name) {
			return nil, apierr.BadRequest(apierr.CodeUnknownParam, name, fmt.Sprintf("Unrecognized request argument supplied: %s", name))
		}
		if len(v) > 1 && !strings.HasPrefix(name, "timestamp_granularities") {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, name, fmt.Sprintf("%s is given more than once.", name))
		}
	}
	req := &transcriptionRequest{Model: strings.TrimSpace(f.value("model")), Prompt: f.value("prompt"),
		Language: strings.TrimSpace(f.value("language")), Format: f.value("response_format"), Translate: translate}
	switch {
	case req.Model == "":
		return nil, apierr.BadRequest(apierr.CodeMissingParam, "model", "You must provide a model parameter.")
	case len(req.Model) > 256:
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "model", "The model id is longer than 256 characters.")
	case !f.hasFile:
		return nil, apierr.BadRequest(apierr.CodeMissingParam, "file", "You must provide a file (the audio, as a multipart file part).")
	case len(f.file) == 0:
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "file", "The audio file is empty.")
	case req.Language != "" && !languageCode.MatchString(req.Language):
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "language", "language must be an ISO-639-1 code such as en or de.")
	case len(req.Prompt) > 4096:
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "prompt", "prompt is longer than 4096 characters.")
	}
	if ct := f.fileType; ct != "" && ct != "application/octet-stream" && !strings.HasPrefix(ct, "audio/") && !strings.HasPrefix(ct, "video/") {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "file", fmt.Sprintf("The file's content type %s is not audio.", ct))
	}
	req.File = f.file
	if req.Format == "" {
		req.Format = "json"
	}
	switch req.Format {
	case "json", "text", "srt", "verbose_json", "vtt":
	default:
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "response_format", "response_format must be json, text, srt, verbose_json or vtt.")
	}
	if t := strings.TrimSpace(f.value("temperature")); t != "" {
		v, err := strconv.ParseFloat(t, 32)
		if err != nil || math.IsNaN(v) || v < 0 || v > 1 {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "temperature", "temperature must be a number between 0 and 1.")
		}
		req.Temperature = float32(v)
	}
	for _, g := range append(f.fields["timestamp_granularities[]"], f.fields["timestamp_granularities"]...) {
		switch strings.TrimSpace(g) {
		case "word":
			req.Words = true
		case "segment":
			req.Segments = true
		default:
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "timestamp_granularities", "timestamp_granularities must be segment or word.")
		}
	}
	if (req.Words || req.Segments) && req.Format != "verbose_json" {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "timestamp_granularities", "timestamp_granularities need response_format verbose_json.")
	}
	if s := strings.TrimSpace(f.value("stream")); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "stream", "stream must be true or false.")
		}
		req.Stream = b
	}
	if req.Stream && req.Format != "json" && req.Format != "text" {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "stream", "Streaming works with response_format json or text.")
	}
	return req, nil
}

func (s *Server) audioTranscriptions(w http.ResponseWriter, r *http.Request) {
	s.transcribe(w, r, false)
}

func (s *Server) audioTranslations(w http.ResponseWriter, r *http.Request) { s.transcribe(w, r, true) }

func (s *Server) transcribe(w http.ResponseWriter, r *http.Request, translate bool) {
	body, err := readBody(r, MaxAudioFileBytes+1<<20)
	if err != nil {
		writeErr(w, err)
		return
	}
	req, err := parseTranscription(body, r.Header.Get("Content-Type"), translate)
	if err != nil {
		writeErr(w, err)
		return
	}
	eng, id, ok := s.taskEngine(w, r, engine.TaskSpeechToText, req.Model)
	if !ok {
		return
	}
	tr := eng.(engine.Transcriber)
	if req.Language != "" && !slices.Contains(tr.Languages(), req.Language) {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "language", fmt.Sprintf("Model %s does not know the language %q.", id, req.Language)))
		return
	}
	if req.Words && !tr.WordTimestamps() {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "timestamp_granularities", fmt.Sprintf("Model %s has no word timestamps.", id)))
		return
	}
	// Decoding stops at the node's per-request limit, so audio longer
	// than it costs no more than the limit's worth of samples.
	maxSeconds := s.work.lim.AudioSeconds
	samples, seconds, err := audiocodec.Decode(req.File, float64(maxSeconds))
	if errors.Is(err, audiocodec.ErrTooLong) {
		msg := err.Error()
		if !strings.Contains(msg, "bytes") { // a duration, not the file size
			msg += fmt.Sprintf("; this node transcribes at most %d seconds per request (--audio-max-seconds, SERVICE_AUDIO_MAX_SECONDS)", maxSeconds)
		}
		apierr.Write(w, apierr.New(http.StatusRequestEntityTooLarge, apierr.TypeInvalidRequest, apierr.CodeTooLarge, "file", msg))
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	if len(samples) == 0 {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "file", "The audio has no samples."))
		return
	}
	secs := int64(math.Ceil(seconds))
	work, ok := s.admitWork(w, r, workAudio, "file", secs, fmt.Sprintf("%d s of audio", secs))
	if !ok {
		return
	}
	defer work()
	treq := engine.TranscribeRequest{Samples: samples, Language: req.Language, Translate: translate,
		Prompt: req.Prompt, Temperature: req.Temperature, WordTimestamps: req.Words}
	var stream *sse
	var onSegment func(engine.Segment)
	if req.Stream {
		stream = newSSE(w)
		onSegment = func(seg engine.Segment) {
			stream.data(map[string]any{"type": "transcript.text.delta", "delta": seg.Text})
		}
	}
	res, err := tr.Transcribe(r.Context(), treq, onSegment)
	if err != nil {
		if stream != nil && stream.started {
			stream.data(map[string]any{"type": "error", "error": map[string]any{"message": err.Error(), "type": apierr.TypeServer, "code": apierr.CodeInternal}})
			return
		}
		writeErr(w, err)
		return
	}
	usage := map[string]any{"type": "duration", "seconds": int(math.Ceil(seconds))}
	reportUsage(w, int64(math.Ceil(seconds)), 0)
	text := strings.TrimSpace(res.Text)
	if stream != nil {
		stream.data(map[string]any{"type": "transcript.text.done", "text": text, "usage": usage})
		return
	}
	switch req.Format {
	case "json":
		writeJSON(w, http.StatusOK, map[string]any{"text": text, "usage": usage})
	case "text":
		writeText(w, "text/plain; charset=utf-8", text+"\n")
	case "srt":
		writeText(w, "application/x-subrip; charset=utf-8", subtitles(res.Segments, false))
	case "vtt":
		writeText(w, "text/vtt; charset=utf-8", subtitles(res.Segments, true))
	case "verbose_json":
		writeJSON(w, http.StatusOK, verboseTranscript(res, text, translate, req, usage))
	}
}

func writeText(w http.ResponseWriter, contentType, body string) {
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(http.StatusOK)
	w.Write([]byte(body))
}

// verboseTranscript is OpenAI's verbose_json body.
func verboseTranscript(res engine.Transcript, text string, translate bool, req *transcriptionRequest, usage map[string]any) map[string]any {
	task := "transcribe"
	if translate {
		task = "translate"
	}
	out := map[string]any{"task": task, "language": languageName(res.Language), "duration": res.Duration, "text": text, "usage": usage}
	if req.Segments || !req.Words {
		segs := make([]map[string]any, 0, len(res.Segments))
		for _, s := range res.Segments {
			tokens := s.Tokens
			if tokens == nil {
				tokens = []int{}
			}
			segs = append(segs, map[string]any{"id": s.ID, "seek": int(s.Start * 100), "start": s.Start, "end": s.End,
				"text": s.Text, "tokens": tokens, "temperature": s.Temperature, "avg_logprob": s.AvgLogprob,
				"compression_ratio": s.CompressionRatio, "no_speech_prob": s.NoSpeechProb})
		}
		out["segments"] = segs
	}
	if req.Words {
		words := make([]map[string]any, 0, len(res.Words))
		for _, w := range res.Words {
			words = append(words, map[string]any{"word": strings.TrimSpace(w.Word), "start": w.Start, "end": w.End})
		}
		out["words"] = words
	}
	return out
}

// subtitles renders segments as SubRip (vtt false) or WebVTT cues: one
// cue per non-empty segment, times clamped so cues never overlap.
func subtitles(segs []engine.Segment, vtt bool) string {
	var b strings.Builder
	if vtt {
		b.WriteString("WEBVTT\n\n")
	}
	n := 0
	last := 0.0
	for _, s := range segs {
		text := strings.TrimSpace(s.Text)
		if text == "" {
			continue
		}
		start := math.Max(s.Start, last)
		end := math.Max(s.End, start)
		last = end
		n++
		if !vtt {
			fmt.Fprintf(&b, "%d\n", n)
		}
		fmt.Fprintf(&b, "%s --> %s\n%s\n\n", cueTime(start, vtt), cueTime(end, vtt), text)
	}
	return b.String()
}

func cueTime(sec float64, vtt bool) string {
	ms := int64(math.Round(sec * 1000))
	h, m, s, frac := ms/3600000, ms/60000%60, ms/1000%60, ms%1000
	sep := ","
	if vtt {
		sep = "."
	}
	return fmt.Sprintf("%02d:%02d:%02d%s%03d", h, m, s, sep, frac)
}

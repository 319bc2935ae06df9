package api

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
)

// Live transcription over WebSocket: GET /v1/audio/transcriptions/stream.
// The protocol is described in docs/audio.md ("Live transcription").

// Limits of one live transcription session.
const (
	// LiveMaxMessage bounds one client message (binary or text).
	LiveMaxMessage = 256 << 10
	// LiveMaxDuration is the default bound of one session's wall-clock
	// time (SessionLimits.MaxDuration).
	LiveMaxDuration = 30 * time.Minute
	// LiveMaxBytes bounds the bytes one session may receive (about two
	// hours of 16 kHz PCM).
	LiveMaxBytes = 256 << 20
	// LiveSubprotocol is the WebSocket subprotocol the server selects when
	// offered; browsers that pass the key as a subprotocol must offer it
	// too (see node/auth.KeyFromRequest).
	LiveSubprotocol = "infermesh.live"
	// liveJSONRate is the rate of base64 audio in JSON frames when the
	// query names no sample_rate: OpenAI Realtime's pcm16.
	liveJSONRate = 24000
)

// liveParams are the query parameters of a live session.
type liveParams struct {
	model    string
	language string
	binRate  int // binary frames
	jsonRate int // input_audio_buffer.append
}

func parseLiveParams(q url.Values) (liveParams, error) {
	p := liveParams{model: strings.TrimSpace(q.Get("model")), language: strings.TrimSpace(q.Get("language")),
		binRate: engine.SpeechSampleRate, jsonRate: liveJSONRate}
	switch {
	case p.model == "":
		return p, apierr.BadRequest(apierr.CodeMissingParam, "model", "You must provide a model query parameter.")
	case p.language != "" && !languageCode.MatchString(p.language):
		return p, apierr.BadRequest(apierr.CodeInvalidValue, "language", "language must be an ISO-639-1 code such as en or de.")
	}
	if v := q.Get("sample_rate"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 8000 || n > 48000 {
			return p, apierr.BadRequest(apierr.CodeInvalidValue, "sample_rate", "sample_rate must be an integer from 8000 to 48000.")
		}
		p.binRate, p.jsonRate = n, n
	}
	return p, nil
}

// stripLiveKey removes an API key carried in the query (api_key) or as a
// WebSocket subprotocol (infermesh.key.<key>) once authentication has
// read it, so it is neither forwarded to a peer nor logged.
func stripLiveKey(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if q := r.URL.Query(); q.Has("api_key") {
			q.Del("api_key")
			u := *r.URL
			u.RawQuery = q.Encode()
			r.URL = &u
			r.RequestURI = u.RequestURI()
		}
		if vs := r.Header.Values("Sec-WebSocket-Protocol"); len(vs) > 0 {
			var keep []string
			for _, v := range vs {
				for _, p := range strings.Split(v, ",") {
					if p = strings.TrimSpace(p); p != "" && !strings.HasPrefix(p, "infermesh.key.") {
						keep = append(keep, p)
					}
				}
			}
			r.Header.Del("Sec-WebSocket-Protocol")
			if len(keep) > 0 {
				r.Header.Set("Sec-WebSocket-Protocol", strings.Join(keep, ", "))
			}
		}
		next(w, r)
	}
}

// liveTranscriptions serves GET /v1/audio/transcriptions/stream on the
// node that holds the model: everything that can fail before the upgrade
// is an HTTP error; after it, errors are close codes and error events.
func (s *Server) liveTranscriptions(w http.ResponseWriter, r *http.Request) {
	p, err := parseLiveParams(r.URL.Query())
	if err != nil {
		writeErr(w, err)
		return
	}
	eng, id, ok := s.taskEngine(w, r, engine.TaskSpeechToText, p.model)
	if !ok {
		return
	}
	tr := eng.(engine.Transcriber)
	if p.language != "" && !slices.Contains(tr.Languages(), p.language) {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, "language", fmt.Sprintf("Model %s does not know the language %q.", id, p.language)))
		return
	}
	veng, _, err := s.opt.Backend.TaskEngine(r.Context(), engine.TaskVoiceActivity, "")
	if errors.Is(err, ErrModelNotFound) {
		apierr.Write(w, apierr.New(http.StatusNotImplemented, apierr.TypeInvalidRequest, apierr.CodeNoProviderConfigured, "model",
			"Live transcription needs a voice activity detection model (silero-vad) on the node that serves "+id+"."))
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	vad := veng.(engine.VoiceDetector)
	release, e := s.sessions.serve()
	if e != nil {
		apierr.Write(w, e)
		return
	}
	defer release()
	vs, err := vad.NewStream()
	if err != nil {
		writeErr(w, err)
		return
	}
	defer vs.Close()

	opts := &websocket.AcceptOptions{Subprotocols: []string{LiveSubprotocol}}
	for _, o := range s.opt.CORSOrigins {
		if o == "*" {
			opts.InsecureSkipVerify = true
			break
		}
		if u, err := url.Parse(o); err == nil && u.Host != "" {
			opts.OriginPatterns = append(opts.OriginPatterns, u.Host)
		}
	}
	conn, err := websocket.Accept(w, r, opts)
	if err != nil {
		return // Accept answered the client
	}
	defer conn.CloseNow()
	conn.SetReadLimit(LiveMaxMessage)
	lim := s.sessions.lim
	ctx, cancel := context.WithTimeout(r.Context(), lim.MaxDuration)
	defer cancel()
	ls := &liveSession{
		conn: conn, tr: tr, vad: vs, frame: vad.FrameSize(), p: p, clock: s.opt.Clock, lim: lim,
		seg:   newSegmenter(defaultSegmenter),
		binRS: newResampler(p.binRate), jsonRS: newResampler(p.jsonRate),
		deltaEvery: engine.SpeechSampleRate,
	}
	ls.run(ctx)
}

// liveSession is one connection's state. It runs on one goroutine: read a
// message, run the detector over the new frames, transcribe when an
// utterance ends (or a partial transcript is due), answer, read the next.
// A slow transcription holds back reading, which holds back the client
// (TCP flow control) instead of queueing audio without bound.
type liveSession struct {
	conn  *websocket.Conn
	tr    engine.Transcriber
	vad   engine.VoiceStream
	frame int
	p     liveParams
	clock func() time.Time
	lim   SessionLimits

	seg           *segmenter
	binRS, jsonRS *resampler
	pending       []float32 // 16 kHz samples not yet a whole detector frame
	bytes         int64
	events        int
	items         int
	item, prev    string
	sinceDelta    int // speech samples since the last partial transcript
	deltaEvery    int // samples of new speech between partial transcripts
}

// liveClose is a close code with its reason.
type liveClose struct {
	code   websocket.StatusCode
	reason string
}

func (c *liveClose) Error() string { return fmt.Sprintf("close %d: %s", c.code, c.reason) }

func closeWith(code websocket.StatusCode, format string, args ...any) *liveClose {
	return &liveClose{code: code, reason: fmt.Sprintf(format, args...)}
}

// run serves the session until the client leaves or a limit or bad input
// closes it.
func (ls *liveSession) run(ctx context.Context) {
	for {
		// Each message must arrive whole within the idle timeout: a silent
		// client, a frame header without its mask and a frame trickled a
		// byte at a time are all closed then.
		// The timer closes the session with 1008 (a deadline on Read's
		// context would drop the connection without a close frame).
		var idle atomic.Bool
		timer := time.AfterFunc(ls.lim.Idle, func() {
			idle.Store(true)
			ls.conn.Close(websocket.StatusPolicyViolation, fmt.Sprintf("no whole message for %s: the session is closed as idle", ls.lim.Idle))
		})
		typ, data, err := ls.conn.Read(ctx)
		if !timer.Stop() || idle.Load() {
			return // closed as idle
		}
		if err != nil {
			switch {
			case errors.Is(ctx.Err(), context.DeadlineExceeded):
				ls.conn.Close(websocket.StatusPolicyViolation, fmt.Sprintf("the session reached its time limit (%s)", ls.lim.MaxDuration))
			case websocket.CloseStatus(err) == websocket.StatusMessageTooBig:
				// The library already closed with 1009.
			default:
				ls.conn.CloseNow()
			}
			return
		}
		ls.bytes += int64(len(data))
		if ls.bytes > LiveMaxBytes {
			ls.conn.Close(websocket.StatusPolicyViolation, "the session reached its byte limit")
			return
		}
		done, err := ls.handle(ctx, typ, data)
		var lc *liveClose
		switch {
		case errors.As(err, &lc):
			ls.conn.Close(lc.code, lc.reason)
			return
		case err != nil:
			ls.conn.CloseNow()
			return
		case done:
			ls.conn.Close(websocket.StatusNormalClosure, "session closed")
			return
		}
	}
}

// handle processes one client message; done is set by session.close.
func (ls *liveSession) handle(ctx context.Context, typ websocket.MessageType, data []byte) (done bool, err error) {
	if typ == websocket.MessageBinary {
		if len(data)%2 != 0 {
			return false, closeWith(websocket.StatusInvalidFramePayloadData, "binary frames must be 16-bit PCM: %d bytes is odd", len(data))
		}
		return false, ls.feed(ctx, ls.binRS, data)
	}
	var ev struct {
		Type  string  `json:"type"`
		Audio *string `json:"audio"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		return false, closeWith(websocket.StatusInvalidFramePayloadData, "text frames must be JSON events")
	}
	switch ev.Type {
	case "input_audio_buffer.append":
		if ev.Audio == nil {
			return false, closeWith(websocket.StatusInvalidFramePayloadData, "input_audio_buffer.append needs audio")
		}
		pcm, err := base64.StdEncoding.DecodeString(*ev.Audio)
		if err != nil {
			return false, closeWith(websocket.StatusInvalidFramePayloadData, "audio is not valid base64")
		}
		if len(pcm)%2 != 0 {
			return false, closeWith(websocket.StatusInvalidFramePayloadData, "audio must be 16-bit PCM: %d bytes is odd", len(pcm))
		}
		return false, ls.feed(ctx, ls.jsonRS, pcm)
	case "input_audio_buffer.commit":
		return false, ls.emit(ctx, ls.seg.commit())
	case "session.close":
		return true, ls.emit(ctx, ls.seg.commit())
	default:
		return false, closeWith(websocket.StatusUnsupportedData, "unknown event type %.40q", ev.Type)
	}
}

// feed converts PCM16 at the resampler's rate to 16 kHz and runs the
// detector over every whole frame.
func (ls *liveSession) feed(ctx context.Context, rs *resampler, pcm []byte) error {
	in := make([]float32, len(pcm)/2)
	for i := range in {
		in[i] = float32(int16(binary.LittleEndian.Uint16(pcm[2*i:]))) / 32768
	}
	ls.pending = rs.push(ls.pending, in)
	n := 0
	for ; len(ls.pending)-n >= ls.frame; n += ls.frame {
		f := ls.pending[n : n+ls.frame]
		prob, err := ls.vad.ProcessFrame(ctx, f)
		if err != nil {
			return err
		}
		if err := ls.emit(ctx, ls.seg.push(f, prob)); err != nil {
			return err
		}
		if sp := ls.seg.speech(); sp != nil {
			ls.sinceDelta += ls.frame
			// Only on a speech frame: a partial started in the silence
			// that may end the utterance would delay its final transcript.
			if ls.sinceDelta >= ls.deltaEvery && prob >= ls.seg.cfg.NegThreshold {
				if err := ls.delta(ctx, sp); err != nil {
					return err
				}
			}
		}
	}
	ls.pending = append(ls.pending[:0], ls.pending[n:]...)
	return nil
}

// emit answers the segmenter's events.
func (ls *liveSession) emit(ctx context.Context, evs []segEvent) error {
	for _, ev := range evs {
		switch ev.Kind {
		case segStarted:
			ls.items++
			ls.prev, ls.item = ls.item, fmt.Sprintf("item_%04d", ls.items)
			ls.sinceDelta = 0
			if err := ls.send(ctx, map[string]any{"type": "input_audio_buffer.speech_started",
				"audio_start_ms": ms(ev.Start), "item_id": ls.item}); err != nil {
				return err
			}
		case segStopped:
			if err := ls.send(ctx, map[string]any{"type": "input_audio_buffer.speech_stopped",
				"audio_end_ms": ms(ev.End), "item_id": ls.item}); err != nil {
				return err
			}
			var prev any
			if ls.prev != "" {
				prev = ls.prev
			}
			if err := ls.send(ctx, map[string]any{"type": "input_audio_buffer.committed",
				"previous_item_id": prev, "item_id": ls.item}); err != nil {
				return err
			}
			text, err := ls.transcribe(ctx, ev.Audio)
			if err != nil {
				if ctx.Err() != nil {
					return err
				}
				if err := ls.sendError(ctx, ls.item, err); err != nil {
					return err
				}
				continue
			}
			if err := ls.send(ctx, map[string]any{"type": "conversation.item.input_audio_transcription.completed",
				"item_id": ls.item, "content_index": 0, "transcript": text}); err != nil {
				return err
			}
		}
	}
	return nil
}

// delta sends the partial transcript of the open utterance. The next one
// is due after at least a second of new speech, and after twice as long
// as this transcription took, so partial transcripts never take more than
// half of the machine's real time.
func (ls *liveSession) delta(ctx context.Context, speech []float32) error {
	start := ls.clock()
	text, err := ls.transcribe(ctx, speech)
	took := ls.clock().Sub(start)
	ls.sinceDelta = 0
	ls.deltaEvery = max(engine.SpeechSampleRate, int(2*took.Seconds()*engine.SpeechSampleRate))
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		return ls.sendError(ctx, ls.item, err)
	}
	return ls.send(ctx, map[string]any{"type": "conversation.item.input_audio_transcription.delta",
		"item_id": ls.item, "content_index": 0, "delta": text})
}

func (ls *liveSession) transcribe(ctx context.Context, samples []float32) (string, error) {
	res, err := ls.tr.Transcribe(ctx, engine.TranscribeRequest{Samples: samples, Language: ls.p.language}, nil)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(res.Text), nil
}

// sendError reports a failed transcription; the session goes on.
func (ls *liveSession) sendError(ctx context.Context, item string, err error) error {
	msg := "The transcription failed."
	var ie *engine.InputError
	if errors.As(err, &ie) {
		msg = ie.Error()
	}
	return ls.send(ctx, map[string]any{"type": "error", "error": map[string]any{
		"type": apierr.TypeServer, "code": apierr.CodeInternal, "message": msg, "item_id": item}})
}

// send writes one server event with a fresh event_id.
func (ls *liveSession) send(ctx context.Context, ev map[string]any) error {
	ls.events++
	ev["event_id"] = fmt.Sprintf("event_%06d", ls.events)
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return ls.conn.Write(ctx, websocket.MessageText, b)
}

// ms converts a sample position at 16 kHz to whole milliseconds.
func ms(samples int64) int64 {
	return int64(math.Round(float64(samples) * 1000 / engine.SpeechSampleRate))
}

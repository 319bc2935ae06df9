package upstream

import (
	"context"
	"errors"
	"io"
	"slices"

	"github.com/infermesh/infermesh/node/engine"
)

// Provider text-to-speech: the node asks the provider's /audio/speech for
// response_format "pcm" (OpenAI's raw format: mono signed 16-bit
// little-endian at 24 kHz) and reads the body as it arrives, so the audio
// streams through this node (and through a forwarding node) while the
// provider is still speaking; the node then encodes it in whatever format
// its client asked for, like local speech. Providers that cannot answer
// pcm are not supported.

// SpeechSampleRate is the rate of OpenAI's "pcm" speech format, in Hz.
const SpeechSampleRate = 24000

// openAIVoices are the voices a provider speech model offers when its
// config lists none: OpenAI's, the first its default.
var openAIVoices = []string{"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse"}

// speechChunk is how many samples Synthesize collects before calling emit
// (0.1 s), unless the body ends or pauses first.
const speechChunk = SpeechSampleRate / 10

// speechEngine serves one provider text-to-speech model.
type speechEngine struct{ providerModel }

var _ engine.Speaker = (*speechEngine)(nil)

// Voices lists the model's configured voices (OpenAI's when the config
// lists none), the first the default. Languages and genders are unknown.
func (e *speechEngine) Voices() []engine.Voice {
	names := e.m.Voices
	if len(names) == 0 {
		names = openAIVoices
	}
	out := make([]engine.Voice, len(names))
	for i, n := range names {
		out[i] = engine.Voice{ID: n}
	}
	return out
}

// SampleRate is 24000, the rate of the pcm format the provider is asked for.
func (e *speechEngine) SampleRate() int { return SpeechSampleRate }

// Synthesize sends the request to the provider's /audio/speech and emits
// the audio as it arrives. An empty voice is the default voice; a voice
// the config does not list is an InputError when the config lists voices
// (with OpenAI's default list any voice is passed on for the provider to
// judge). Instructions are passed on. Provider errors are
// *engine.ProviderError as for chat.
func (e *speechEngine) Synthesize(ctx context.Context, req engine.SpeechRequest, emit func(pcm []float32) error) error {
	voice := req.Voice
	if voice == "" {
		voice = e.Voices()[0].ID
	} else if len(e.m.Voices) > 0 && !slices.Contains(e.m.Voices, voice) {
		return &engine.InputError{Param: "voice", Msg: "unknown voice " + voice + " for model " + e.m.id}
	}
	body := map[string]any{"model": e.m.Model, "input": req.Text, "voice": voice, "response_format": "pcm"}
	if req.Speed != 0 && req.Speed != 1 {
		body["speed"] = req.Speed
	}
	if req.Instructions != "" {
		body["instructions"] = req.Instructions
	}
	cl, err := e.c.post(ctx, "/audio/speech", body, false)
	if err != nil {
		return err
	}
	defer cl.Close()
	buf := make([]byte, 2*speechChunk)
	pcm := make([]float32, 0, speechChunk)
	odd, haveOdd := byte(0), false
	total := 0
	for {
		n, rerr := cl.resp.Body.Read(buf)
		cl.touch()
		b := buf[:n]
		if haveOdd && len(b) > 0 {
			pcm = append(pcm, s16(odd, b[0]))
			b, haveOdd = b[1:], false
		}
		for len(b) >= 2 {
			pcm = append(pcm, s16(b[0], b[1]))
			b = b[2:]
		}
		if len(b) == 1 {
			odd, haveOdd = b[0], true
		}
		// Emit what arrived: a full chunk, or anything when the provider
		// paused (a short read) or ended.
		if len(pcm) >= speechChunk || (len(pcm) > 0 && (n < len(buf) || rerr != nil)) {
			total += len(pcm)
			if err := emit(pcm); err != nil {
				return err
			}
			pcm = pcm[:0]
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return e.c.failure(ctx, cl.ctx, rerr)
		}
	}
	if total == 0 {
		return e.c.badResponse("the speech answer holds no audio")
	}
	return ctx.Err()
}

// s16 converts one little-endian signed 16-bit sample to [-1, 1).
func s16(lo, hi byte) float32 {
	return float32(int16(uint16(lo)|uint16(hi)<<8)) / 32768
}

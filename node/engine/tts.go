package engine

import "context"

// ---------------------------------------------------------------------------
// Text to speech and voice cloning.
//
// The types below are what the engines behind POST /v1/audio/speech and
// POST /v1/audio/clone take and give back. Engines produce mono float32 PCM,
// nominally in [-1, 1], at their SampleRate; the API layer encodes it
// (node/audioenc) in the asked response_format and may stream it. Audio is
// emitted chunk by chunk, one sentence (or group of short sentences) at a
// time, so the first bytes can leave before the whole text is synthesized.

// Text-to-speech tasks.
const (
	// TaskTextToSpeech turns text into speech with one of the model's
	// voices (/v1/audio/speech).
	TaskTextToSpeech Task = "text-to-speech"
	// TaskVoiceCloning speaks text in the voice of a short reference
	// recording (/v1/audio/clone).
	TaskVoiceCloning Task = "voice-cloning"
)

// Bounds shared by speech engines and the API layer. Values outside them
// are InputErrors (param "input" or "speed").
const (
	// MaxSpeechInput is the longest Text accepted, in characters (runes),
	// OpenAI's limit for /v1/audio/speech.
	MaxSpeechInput = 4096
	// MinSpeechSpeed and MaxSpeechSpeed bound SpeechRequest.Speed and
	// CloneRequest.Speed; 0 means 1.
	MinSpeechSpeed = 0.25
	MaxSpeechSpeed = 4.0
)

// Bounds of CloneRequest.Reference, in seconds. A clip outside them is an
// InputError (param "reference_audio").
const (
	MinReferenceSeconds = 3
	MaxReferenceSeconds = 30
)

// SpeechRequest is one text-to-speech request.
type SpeechRequest struct {
	// Text is what to say: 1 to MaxSpeechInput characters.
	Text string
	// Voice is a Voice.ID from the engine's Voices ("" = the engine's
	// default voice). An unknown voice is an InputError (param "voice").
	Voice string
	// Speed scales the speaking rate (1 = normal); 0 means 1. Values
	// outside [MinSpeechSpeed, MaxSpeechSpeed] are InputErrors (param
	// "speed").
	Speed float32
	// Language overrides the voice's language for text normalisation and
	// pronunciation, as a BCP-47-like code ("en-us", "es"); "" uses the
	// voice's. A language the engine cannot speak is an InputError (param
	// "language").
	Language string
	// Instructions asks for a speaking style (OpenAI's "instructions").
	// Provider models receive it; local models cannot follow it and
	// ignore it.
	Instructions string
}

// Voice is one voice a speech engine offers.
type Voice struct {
	// ID is what SpeechRequest.Voice names, e.g. "af_heart".
	ID string
	// Language is the voice's language, e.g. "en-us", "es", "fr-fr".
	Language string
	// Gender is "female", "male" or "" when unknown.
	Gender string
	// OpenAI lists the OpenAI voice names (alloy, echo, ...) that select
	// this voice on this engine (node/engine/tts/openai.go).
	OpenAI []string
}

// Speaker is implemented by engines whose Task is TaskTextToSpeech.
type Speaker interface {
	Engine
	// Voices lists the voices the engine offers; the first is the default.
	Voices() []Voice
	// SampleRate is the rate, in Hz, of the PCM Synthesize emits.
	SampleRate() int
	// Synthesize speaks req.Text and calls emit with consecutive chunks of
	// mono PCM at SampleRate, in order, each as soon as it is ready; the
	// concatenation of the chunks is the whole utterance. emit must not
	// keep the slice after it returns. An error from emit stops the work
	// and is returned. Caller errors are InputErrors (param "input",
	// "voice", "speed" or "language"), returned before any emit. A
	// cancelled ctx stops the work between and inside model runs and
	// returns ctx.Err().
	Synthesize(ctx context.Context, req SpeechRequest, emit func(pcm []float32) error) error
}

// CloneRequest is one voice-cloning request: say Text in the voice heard in
// Reference. The reference clip is used for this request only and never
// stored.
type CloneRequest struct {
	// Text is what to say: 1 to MaxSpeechInput characters.
	Text string
	// Reference is the voice sample: mono PCM at SpeechSampleRate (16 kHz),
	// MinReferenceSeconds to MaxReferenceSeconds long.
	Reference []float32
	// ReferenceText is the transcript of Reference when the caller knows
	// it ("" otherwise); engines that do not need it ignore it.
	ReferenceText string
	// Speed scales the speaking rate as in SpeechRequest.
	Speed float32
}

// Cloner is implemented by engines whose Task is TaskVoiceCloning.
type Cloner interface {
	Engine
	// SampleRate is the rate, in Hz, of the PCM Clone emits.
	SampleRate() int
	// Clone speaks req.Text in the reference voice and calls emit with
	// consecutive chunks of mono PCM at SampleRate, as Synthesize does.
	// Caller errors are InputErrors (param "input", "speed" or
	// "reference_audio"), returned before any emit.
	Clone(ctx context.Context, req CloneRequest, emit func(pcm []float32) error) error
}

package engine

import "context"

// ---------------------------------------------------------------------------
// Speech to text and voice activity detection.
//
// The API layer decodes the uploaded file (node/audiocodec) into 16 kHz mono
// samples, maps the multipart fields onto TranscribeRequest and renders the
// Transcript in the asked response_format (json, text, srt, vtt,
// verbose_json). Engines never see files or formats.

// TaskSpeechToText is a speech recognition model behind
// /v1/audio/transcriptions and /v1/audio/translations.
const TaskSpeechToText Task = "speech-to-text"

// TaskVoiceActivity is a voice activity detector, used by the live
// transcription route to cut a stream into utterances.
const TaskVoiceActivity Task = "voice-activity-detection"

// SpeechSampleRate is the sample rate, in Hz, of every sample slice that
// speech engines take.
const SpeechSampleRate = 16000

// TranscribeRequest is one transcription or translation.
type TranscribeRequest struct {
	// Samples is the audio, mono, at SpeechSampleRate, nominally in [-1, 1].
	Samples []float32
	// Language is the spoken language as an ISO-639-1 code ("en", "de");
	// "" detects it from the first 30 s.
	Language string
	// Translate asks for an English translation instead of a transcript
	// (/v1/audio/translations).
	Translate bool
	// Prompt is text that precedes the audio (previous transcript, spelling
	// of names); it conditions the model and is not part of the result.
	Prompt string
	// Temperature is the first sampling temperature; 0 is greedy and lets
	// the engine fall back to hotter temperatures when a window's output
	// looks degenerate. A value > 0 samples at that temperature only.
	Temperature float32
	// WordTimestamps asks for Transcript.Words (timestamp_granularities
	// includes "word"). Engines that cannot align words leave Words empty.
	WordTimestamps bool
}

// Segment is a stretch of the transcript with its time span, as
// verbose_json reports it. Times are seconds from the start of the audio.
type Segment struct {
	// ID numbers the segments from 0 in order.
	ID int
	// Start and End bound the segment in seconds; End >= Start, and a
	// segment never starts before the previous one ends.
	Start, End float64
	// Text is the segment's text (with its leading space, as Whisper
	// writes it).
	Text string
	// Tokens are the model's text token ids for the segment.
	Tokens []int
	// AvgLogprob is the mean log probability of the window's tokens.
	AvgLogprob float64
	// CompressionRatio is the gzip compression ratio of the window's text
	// (high means repetitive).
	CompressionRatio float64
	// NoSpeechProb is the probability the model gave to "no speech" for the
	// window.
	NoSpeechProb float64
	// Temperature is the temperature the window was decoded at.
	Temperature float32
}

// Word is one word with its time span in seconds.
type Word struct {
	// Word is the word's text, with its leading space if it had one.
	Word string
	// Start and End bound the word in seconds.
	Start, End float64
}

// Transcript is a finished transcription.
type Transcript struct {
	// Text is the whole transcript (segments joined, trimmed).
	Text string
	// Language is the language used: the requested one, or the detected
	// one as an ISO-639-1 code.
	Language string
	// Duration is the audio's length in seconds.
	Duration float64
	// Segments are the timed pieces of Text, in order.
	Segments []Segment
	// Words are the timed words, filled only when WordTimestamps was asked
	// and the engine can align words.
	Words []Word
	// Tokens counts the text tokens generated (usage).
	Tokens int
}

// Transcriber is implemented by engines whose Task is TaskSpeechToText.
type Transcriber interface {
	Engine
	// Transcribe turns req.Samples into text. onSegment, when non-nil, is
	// called with each segment as soon as it is final, in order (for
	// streamed responses). Caller errors are InputErrors (param "file",
	// "language", "prompt", "temperature"). A cancelled ctx stops the work
	// between model runs and returns ctx.Err().
	Transcribe(ctx context.Context, req TranscribeRequest, onSegment func(Segment)) (Transcript, error)
	// Languages lists the ISO-639-1 codes the model accepts in Language.
	Languages() []string
	// WordTimestamps reports whether the engine can fill Transcript.Words.
	WordTimestamps() bool
}

// VoiceDetector is implemented by engines whose Task is TaskVoiceActivity.
// The detector itself is stateless and shared; each audio stream gets its
// own VoiceStream.
type VoiceDetector interface {
	Engine
	// FrameSize is the number of samples (at SpeechSampleRate) that
	// VoiceStream.ProcessFrame takes.
	FrameSize() int
	// NewStream starts the state of one audio stream. The caller closes it.
	NewStream() (VoiceStream, error)
}

// VoiceStream is one audio stream's detector state (the model's recurrent
// state carried from frame to frame). It is not safe for concurrent use.
type VoiceStream interface {
	// ProcessFrame takes the next FrameSize samples and returns the
	// probability, in [0, 1], that they contain speech. A frame of another
	// length is an InputError (param "audio").
	ProcessFrame(ctx context.Context, samples []float32) (float32, error)
	// Reset forgets the stream's past, as if it had just started.
	Reset()
	// Close releases the stream.
	Close() error
}

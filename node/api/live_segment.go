package api

// Live transcription: cutting a stream of 16 kHz samples into utterances
// from per-frame speech probabilities (Silero VAD), and converting client
// PCM to 16 kHz.

// segmenterConfig tunes the utterance segmenter. Lengths are in samples at
// 16 kHz.
type segmenterConfig struct {
	// Threshold is the speech probability at which speech starts.
	Threshold float32
	// NegThreshold is the probability below which a frame counts as
	// silence inside an utterance (hysteresis; Silero's own is threshold
	// − 0.15).
	NegThreshold float32
	// MinSpeech is how much speech confirms an utterance; a shorter burst
	// (a click, a cough) followed by silence is dropped without events.
	MinSpeech int
	// MinSilence is how much silence ends an utterance.
	MinSilence int
	// Pad is the audio kept before the first and after the last speech
	// frame of an utterance.
	Pad int
	// MaxUtterance cuts an utterance that runs this long (Whisper's 30 s
	// window).
	MaxUtterance int
}

// defaultSegmenter: threshold 0.5, 250 ms of speech to start, 500 ms of
// silence to stop, 200 ms padding, 30 s at most.
var defaultSegmenter = segmenterConfig{
	Threshold: 0.5, NegThreshold: 0.35,
	MinSpeech: 4000, MinSilence: 8000, Pad: 3200, MaxUtterance: 30 * 16000,
}

// segKind is what happened to the current utterance.
type segKind int

const (
	segStarted segKind = iota + 1 // speech confirmed: an utterance began
	segStopped                    // the utterance ended; Audio holds it
)

// segEvent is one segmenter decision. Positions are sample offsets from
// the start of the stream.
type segEvent struct {
	Kind segKind
	// Start is where the utterance's audio begins (padding included).
	Start int64
	// End is where it ends (padding included); segStopped only.
	End int64
	// Audio is the utterance (segStopped only).
	Audio []float32
}

// segmenter turns frames and their speech probabilities into utterances.
// It is pure: the caller runs the detector and feeds each frame with its
// probability. Not safe for concurrent use.
type segmenter struct {
	cfg segmenterConfig
	pos int64 // samples consumed

	preroll []float32 // idle: the last Pad samples

	active    bool
	confirmed bool
	start     int64     // stream position of utt[0]
	utt       []float32 // the utterance so far
	voiced    int       // speech samples seen in the utterance
	lastVoice int       // length of utt at the end of the last speech frame
	silence   int       // silence samples since the last speech frame
}

func newSegmenter(cfg segmenterConfig) *segmenter { return &segmenter{cfg: cfg} }

// push feeds one frame with its speech probability and returns what it
// decided (zero, one or two events).
func (s *segmenter) push(frame []float32, prob float32) []segEvent {
	var out []segEvent
	at := s.pos
	s.pos += int64(len(frame))
	if !s.active {
		if prob < s.cfg.Threshold {
			s.keepPreroll(frame)
			return nil
		}
		s.active, s.confirmed = true, false
		s.start = at - int64(len(s.preroll))
		s.utt = append(append(s.utt[:0], s.preroll...), frame...)
		s.preroll = s.preroll[:0]
		s.voiced, s.lastVoice, s.silence = len(frame), len(s.utt), 0
	} else {
		s.utt = append(s.utt, frame...)
		if prob >= s.cfg.NegThreshold {
			s.voiced += len(frame)
			s.lastVoice, s.silence = len(s.utt), 0
		} else {
			s.silence += len(frame)
			if !s.confirmed {
				// A burst too short to be speech: back to idle.
				s.abort()
				return nil
			}
		}
	}
	if !s.confirmed && s.voiced >= s.cfg.MinSpeech {
		s.confirmed = true
		out = append(out, segEvent{Kind: segStarted, Start: s.start})
	}
	if s.confirmed && (s.silence >= s.cfg.MinSilence || len(s.utt) >= s.cfg.MaxUtterance) {
		out = append(out, s.finish())
	}
	return out
}

// commit ends the current utterance now (the client's
// input_audio_buffer.commit). It returns the stopped event, or nothing
// when no confirmed utterance is open.
func (s *segmenter) commit() []segEvent {
	if !s.active || !s.confirmed {
		return nil
	}
	return []segEvent{s.finish()}
}

// speech returns the open utterance's audio so far (nil when none is
// confirmed). The slice is valid until the next push.
func (s *segmenter) speech() []float32 {
	if !s.active || !s.confirmed {
		return nil
	}
	return s.utt[:s.lastVoice]
}

// finish closes the utterance, keeping Pad samples after the last speech
// frame, and moves the rest of the silence into the pre-roll.
func (s *segmenter) finish() segEvent {
	end := min(len(s.utt), s.lastVoice+s.cfg.Pad)
	audio := make([]float32, end)
	copy(audio, s.utt[:end])
	ev := segEvent{Kind: segStopped, Start: s.start, End: s.start + int64(end), Audio: audio}
	s.active = false
	s.keepPreroll(s.utt[end:])
	s.utt = s.utt[:0]
	return ev
}

// abort drops an unconfirmed utterance back into the pre-roll.
func (s *segmenter) abort() {
	s.active = false
	s.preroll = s.preroll[:0]
	s.keepPreroll(s.utt)
	s.utt = s.utt[:0]
}

// keepPreroll appends x to the pre-roll, keeping its last Pad samples.
func (s *segmenter) keepPreroll(x []float32) {
	s.preroll = append(s.preroll, x...)
	if n := len(s.preroll) - s.cfg.Pad; n > 0 {
		s.preroll = append(s.preroll[:0], s.preroll[n:]...)
	}
}

// resampler converts a stream from one rate to 16 kHz by linear
// interpolation. Speech recognition is not sensitive to the small
// aliasing this leaves above 8 kHz when downsampling.
type resampler struct {
	step  float64 // input samples per output sample
	frac  float64 // position of the next output sample after last
	last  float32
	begun bool
}

func newResampler(rate int) *resampler {
	return &resampler{step: float64(rate) / 16000}
}

// push converts the next input samples, appending output to dst.
func (r *resampler) push(dst, in []float32) []float32 {
	if r.step == 1 {
		return append(dst, in...)
	}
	for len(in) > 0 {
		if !r.begun {
			r.last, r.begun = in[0], true
			dst = append(dst, in[0])
			r.frac = r.step
			in = in[1:]
			continue
		}
		// Output positions between last (0) and in[0] (1).
		for r.frac <= 1 {
			dst = append(dst, r.last+(in[0]-r.last)*float32(r.frac))
			r.frac += r.step
		}
		r.frac--
		r.last = in[0]
		in = in[1:]
	}
	return dst
}

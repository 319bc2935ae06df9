// Package audiocodec turns an uploaded audio file into what speech engines
// take: mono float32 samples at 16 kHz.
//
// Formats are recognised by their content, never by a file name: WAV (RIFF
// WAVE: integer PCM of 8, 16, 24 or 32 bits, 32- or 64-bit float,
// WAVE_FORMAT_EXTENSIBLE, any channel count and rate), MP3 (MPEG-1/2 Layer
// III, with or without an ID3v2 tag), FLAC and Ogg Vorbis. Ogg Opus, MP4/M4A
// (AAC) and WebM are recognised and refused with an InputError: no pure-Go
// decoder for them is well kept enough to depend on.
//
// Channels are averaged; the rate is converted by a polyphase windowed-sinc
// resampler (resample.go).
//
// Limits: a file larger than MaxBytes, or longer than the caller's
// maxSeconds, is an *engine.InputError with Param "file", as are empty,
// truncated and malformed files. A declared length (WAV data chunk, FLAC
// stream info, Ogg end position) beyond the limit is refused before any
// sample buffer is allocated; formats without a reliable declared length
// (MP3) are decoded in blocks and stopped as soon as they pass the limit,
// so memory stays bounded by maxSeconds at 16 kHz.
package audiocodec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/infermesh/infermesh/node/engine"
)

// Limits.
const (
	// SampleRate is the rate of Decode's output, in Hz.
	SampleRate = 16000
	// MaxBytes is the largest file Decode reads: 25 MB, OpenAI's limit for
	// the audio endpoints.
	MaxBytes = 25 << 20
	// DefaultMaxSeconds is the suggested duration limit: 30 minutes
	// (115 MB of 16 kHz float32 samples).
	DefaultMaxSeconds = 1800
	// maxChannels bounds the channel count of any format.
	maxChannels = 64
	// minRate and maxRate bound the source sample rate.
	minRate, maxRate = 1000, 192000
)

// Format names a recognised container or codec.
type Format string

// Recognised formats.
const (
	FormatWAV     Format = "wav"
	FormatMP3     Format = "mp3"
	FormatFLAC    Format = "flac"
	FormatVorbis  Format = "ogg-vorbis"
	FormatOpus    Format = "ogg-opus"
	FormatMP4     Format = "mp4"
	FormatWebM    Format = "webm"
	FormatUnknown Format = ""
)

// ErrTooLong marks a file over the size or duration limit (answered 413
// by the API); such errors are also input errors for "file".
var ErrTooLong = errors.New("audio over the size or duration limit")

// limitErr is an InputError about the file that is also ErrTooLong.
func limitErr(format string, args ...any) error {
	return fmt.Errorf("%w%w", &engine.InputError{Param: "file", Msg: fmt.Sprintf(format, args...)}, tooLongMark{})
}

// tooLongMark makes errors.Is(err, ErrTooLong) hold without changing the
// message.
type tooLongMark struct{}

func (tooLongMark) Error() string   { return "" }
func (tooLongMark) Is(t error) bool { return t == ErrTooLong }

// inputErr is an InputError about the file.
func inputErr(format string, args ...any) error {
	return &engine.InputError{Param: "file", Msg: fmt.Sprintf(format, args...)}
}

// Detect names the format of data from its first bytes.
func Detect(data []byte) Format {
	switch {
	case len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WAVE":
		return FormatWAV
	case len(data) >= 4 && string(data[:4]) == "fLaC":
		return FormatFLAC
	case len(data) >= 4 && string(data[:4]) == "OggS":
		head := data[:min(len(data), 512)]
		if bytes.Contains(head, []byte("OpusHead")) {
			return FormatOpus
		}
		if bytes.Contains(head, []byte("\x01vorbis")) {
			return FormatVorbis
		}
		return FormatUnknown
	case len(data) >= 12 && string(data[4:8]) == "ftyp":
		return FormatMP4
	case len(data) >= 4 && string(data[:4]) == "\x1a\x45\xdf\xa3":
		return FormatWebM
	case len(data) >= 10 && string(data[:3]) == "ID3":
		// An ID3v2 tag; FLAC files rarely carry one too.
		size := int(data[6]&0x7f)<<21 | int(data[7]&0x7f)<<14 | int(data[8]&0x7f)<<7 | int(data[9]&0x7f)
		if rest := 10 + size; rest+4 <= len(data) && string(data[rest:rest+4]) == "fLaC" {
			return FormatFLAC
		}
		return FormatMP3
	case len(data) >= 4 && isMP3Sync(data):
		return FormatMP3
	}
	return FormatUnknown
}

// isMP3Sync reports whether data starts with an MPEG audio Layer III frame
// header.
func isMP3Sync(b []byte) bool {
	return b[0] == 0xff && b[1]&0xe0 == 0xe0 && // sync
		(b[1]>>3)&3 != 1 && // version not reserved
		(b[1]>>1)&3 == 1 && // layer III
		b[2]>>4 != 15 && (b[2]>>2)&3 != 3 // bitrate and rate not reserved
}

// Decode decodes an audio file into mono samples at SampleRate and returns
// them with the audio's duration in seconds. Caller errors are
// *engine.InputError with Param "file".
func Decode(data []byte, maxSeconds float64) (samples []float32, seconds float64, err error) {
	// The third-party decoders can panic on malformed input (an index out
	// of range was seen under fuzzing); that is the caller's bad file.
	defer func() {
		if p := recover(); p != nil {
			samples, seconds, err = nil, 0, inputErr("malformed audio (%v)", p)
		}
	}()
	if len(data) == 0 {
		return nil, 0, inputErr("the audio file is empty")
	}
	if len(data) > MaxBytes {
		return nil, 0, limitErr("the audio file is %d bytes; the limit is %d (25 MB)", len(data), MaxBytes)
	}
	if !(maxSeconds > 0) || math.IsInf(maxSeconds, 0) {
		maxSeconds = DefaultMaxSeconds
	}
	var src source
	switch f := Detect(data); f {
	case FormatWAV:
		src, err = newWAV(data, maxSeconds)
	case FormatMP3:
		src, err = newMP3(data)
	case FormatFLAC:
		src, err = newFLAC(data, maxSeconds)
	case FormatVorbis:
		src, err = newVorbis(data, maxSeconds)
	case FormatOpus, FormatMP4, FormatWebM:
		return nil, 0, inputErr("%s audio is not supported; send WAV, MP3, FLAC or Ogg Vorbis", f)
	default:
		return nil, 0, inputErr("unrecognised audio format; send WAV, MP3, FLAC or Ogg Vorbis")
	}
	if err != nil {
		return nil, 0, err
	}
	return convert(src, maxSeconds)
}

// source yields interleaved float32 frames block by block.
type source interface {
	rate() int
	channels() int
	// read appends up to about n frames, interleaved, to dst; io.EOF at
	// the end.
	read(dst []float32, n int) ([]float32, error)
}

// convert downmixes and resamples src, stopping with an InputError once
// it passes maxSeconds.
func convert(src source, maxSeconds float64) ([]float32, float64, error) {
	rate, ch := src.rate(), src.channels()
	if rate < minRate || rate > maxRate {
		return nil, 0, inputErr("unsupported sample rate %d Hz", rate)
	}
	if ch < 1 || ch > maxChannels {
		return nil, 0, inputErr("unsupported channel count %d", ch)
	}
	limit := int64(math.Ceil(maxSeconds * float64(rate)))
	var rs *resampler
	if rate != SampleRate {
		rs = newResampler(rate, SampleRate)
	}
	var frames int64
	var out []float32
	var block, mono []float32
	const blockFrames = 8192
	for {
		var err error
		block, err = src.read(block[:0], blockFrames)
		if len(block)%ch != 0 {
			return nil, 0, inputErr("malformed audio: partial frame")
		}
		n := len(block) / ch
		frames += int64(n)
		if frames > limit {
			return nil, 0, limitErr("the audio is longer than %g seconds", maxSeconds)
		}
		mono = mono[:0]
		for i := range n {
			var s float32
			for c := range ch {
				s += block[i*ch+c]
			}
			mono = append(mono, s/float32(ch))
		}
		if rs != nil {
			rs.push(mono)
		} else {
			out = append(out, mono...)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			var ie *engine.InputError
			if errors.As(err, &ie) {
				return nil, 0, err
			}
			return nil, 0, inputErr("malformed audio: %v", err)
		}
	}
	if rs != nil {
		out = rs.finish()
	}
	if frames == 0 {
		return nil, 0, inputErr("the audio has no samples")
	}
	for i, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			out[i] = 0
		}
	}
	return out, float64(frames) / float64(rate), nil
}

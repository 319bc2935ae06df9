// Package audioenc turns mono float32 PCM into the files /v1/audio/speech
// returns: wav (16-bit PCM), pcm (raw signed 16-bit little-endian), flac,
// mp3, opus (in Ogg) and aac (ADTS).
//
// wav, pcm and flac are written in Go (FLAC with github.com/mewkiz/flac's
// encoder, fixed-predictor analysis, 16-bit, 4096-sample blocks). mp3, opus
// and aac come from the ffmpeg program (Debian package ffmpeg), run as a
// separate process with the PCM on stdin and the encoded stream on stdout,
// under a time limit and an output bound; Available reports whether the
// node can produce a format, so the API can refuse the others with a 400.
//
// Every format can be streamed: NewWriter returns a writer that takes PCM
// chunk by chunk and writes encoded bytes to the destination as soon as the
// encoder produces them. Streamed wav declares an unknown length (0xFFFFFFFF
// sizes, as streaming servers do); streamed flac leaves the total sample
// count at 0 (unknown), which the format allows.
//
// Samples are clipped to [-1, 1] and rounded to 16 bits. Opus streams are
// always encoded at 48 kHz (the Opus decoding rate), whatever the input
// rate; the other formats keep the input rate.
package audioenc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
)

// Format is an output format, named as OpenAI's response_format.
type Format string

// Formats.
const (
	WAV  Format = "wav"
	PCM  Format = "pcm"
	FLAC Format = "flac"
	MP3  Format = "mp3"
	Opus Format = "opus"
	AAC  Format = "aac"
)

// Formats lists every format the package knows, in OpenAI's order.
func Formats() []Format { return []Format{MP3, Opus, AAC, FLAC, WAV, PCM} }

// ParseFormat maps a response_format value ("" means mp3, OpenAI's
// default) to a Format.
func ParseFormat(s string) (Format, error) {
	if s == "" {
		return MP3, nil
	}
	f := Format(strings.ToLower(s))
	for _, k := range Formats() {
		if f == k {
			return f, nil
		}
	}
	return "", fmt.Errorf("audioenc: unknown format %q (want one of mp3, opus, aac, flac, wav, pcm)", s)
}

// ContentType is the MIME type of the format's bytes.
func (f Format) ContentType() string {
	switch f {
	case WAV:
		return "audio/wav"
	case PCM:
		return "audio/pcm"
	case FLAC:
		return "audio/flac"
	case MP3:
		return "audio/mpeg"
	case Opus:
		return "audio/ogg; codecs=opus"
	case AAC:
		return "audio/aac"
	}
	return "application/octet-stream"
}

// OutputRate is the sample rate of the encoded stream for input at rate:
// 48000 for Opus, rate otherwise.
func (f Format) OutputRate(rate int) int {
	if f == Opus {
		return 48000
	}
	return rate
}

// Limits.
const (
	// MinRate and MaxRate bound the input sample rate.
	MinRate = 8000
	MaxRate = 192000
)

// ErrUnavailable is returned for a format the node cannot produce (no
// ffmpeg, or an ffmpeg without the encoder).
var ErrUnavailable = errors.New("audioenc: format not available on this node")

// Writer encodes a stream of PCM chunks.
type Writer interface {
	// Write encodes the next chunk of mono samples.
	Write(pcm []float32) error
	// Close flushes the encoder and finishes the stream; it does not close
	// the destination.
	Close() error
}

// Encoder produces every format; it knows where ffmpeg is and which of its
// encoders exist. It is safe for concurrent use.
type Encoder struct {
	ffmpeg string          // "" when ffmpeg is absent
	codecs map[Format]bool // ffmpeg formats whose encoder exists
}

// Available reports whether e can produce f.
func (e *Encoder) Available(f Format) bool {
	switch f {
	case WAV, PCM, FLAC:
		return true
	}
	return e.codecs[f]
}

// Encode encodes the whole of pcm (mono, at rate Hz) as f.
func (e *Encoder) Encode(ctx context.Context, f Format, pcm []float32, rate int) ([]byte, error) {
	if err := checkRate(rate); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	switch f {
	case WAV:
		buf.Grow(44 + 2*len(pcm))
		writeWAVHeader(&buf, rate, uint32(2*len(pcm)))
		buf.Write(toS16(pcm, nil))
		return buf.Bytes(), nil
	case PCM:
		return toS16(pcm, nil), nil
	case FLAC:
		w, err := newFLACWriter(&buf, rate, uint64(len(pcm)))
		if err != nil {
			return nil, err
		}
		if err := w.Write(pcm); err != nil {
			return nil, err
		}
		if err := w.Close(); err != nil {
			return nil, err
		}
		return buf.Bytes(), nil
	}
	w, err := e.newFFmpegWriter(ctx, &buf, f, rate, len(pcm))
	if err != nil {
		return nil, err
	}
	if err := w.Write(pcm); err != nil {
		w.abort()
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// NewWriter starts a stream of format f at rate Hz into dst. Cancelling ctx
// stops an ffmpeg encoder; the caller must Close the writer either way.
func (e *Encoder) NewWriter(ctx context.Context, dst io.Writer, f Format, rate int) (Writer, error) {
	if err := checkRate(rate); err != nil {
		return nil, err
	}
	switch f {
	case WAV:
		var h bytes.Buffer
		writeWAVHeader(&h, rate, 0xFFFFFFFF)
		if _, err := dst.Write(h.Bytes()); err != nil {
			return nil, err
		}
		return &s16Writer{dst: dst}, nil
	case PCM:
		return &s16Writer{dst: dst}, nil
	case FLAC:
		return newFLACWriter(dst, rate, 0)
	}
	return e.newFFmpegWriter(ctx, dst, f, rate, -1)
}

func checkRate(rate int) error {
	if rate < MinRate || rate > MaxRate {
		return fmt.Errorf("audioenc: sample rate %d outside [%d, %d]", rate, MinRate, MaxRate)
	}
	return nil
}

// toS16 appends pcm as clipped, rounded signed 16-bit little-endian samples.
func toS16(pcm []float32, dst []byte) []byte {
	if dst == nil {
		dst = make([]byte, 0, 2*len(pcm))
	}
	for _, v := range pcm {
		s := s16(v)
		dst = append(dst, byte(s), byte(uint16(s)>>8))
	}
	return dst
}

// s16 converts one sample; NaN becomes 0.
func s16(v float32) int16 {
	if v != v {
		return 0
	}
	x := math.Round(float64(v) * 32767)
	return int16(max(-32767, min(32767, x)))
}

// writeWAVHeader writes a 44-byte RIFF/WAVE header for mono 16-bit PCM with
// dataSize bytes of samples (0xFFFFFFFF: unknown, for streams).
func writeWAVHeader(b *bytes.Buffer, rate int, dataSize uint32) {
	riff := dataSize + 36
	if dataSize == 0xFFFFFFFF {
		riff = 0xFFFFFFFF
	}
	le32 := func(v uint32) { b.Write([]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)}) }
	le16 := func(v uint16) { b.Write([]byte{byte(v), byte(v >> 8)}) }
	b.WriteString("RIFF")
	le32(riff)
	b.WriteString("WAVEfmt ")
	le32(16)
	le16(1) // PCM
	le16(1) // mono
	le32(uint32(rate))
	le32(uint32(rate) * 2)
	le16(2)
	le16(16)
	b.WriteString("data")
	le32(dataSize)
}

// s16Writer streams raw s16le samples (after a header written beforehand).
type s16Writer struct {
	dst io.Writer
	buf []byte
}

func (w *s16Writer) Write(pcm []float32) error {
	w.buf = toS16(pcm, w.buf[:0])
	_, err := w.dst.Write(w.buf)
	return err
}

func (w *s16Writer) Close() error { return nil }

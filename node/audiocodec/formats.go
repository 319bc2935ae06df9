package audiocodec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"

	"github.com/hajimehoshi/go-mp3"
	"github.com/jfreymuth/oggvorbis"
	"github.com/mewkiz/flac"
)

// WAV format tags.
const (
	wavPCM        = 1
	wavFloat      = 3
	wavExtensible = 0xfffe
)

// wavSource reads the data chunk of a RIFF WAVE file.
type wavSource struct {
	data     []byte // the sample bytes (whole frames only)
	sr, ch   int
	bytesPer int // per sample
	float    bool
	pos      int
}

func newWAV(b []byte, maxSeconds float64) (source, error) {
	var (
		fmtFound bool
		tag      uint16
		ch, bits int
		sr       uint32
		align    int
	)
	p := 12
	for p+8 <= len(b) {
		id := string(b[p : p+4])
		size := int64(binary.LittleEndian.Uint32(b[p+4 : p+8]))
		body := p + 8
		switch id {
		case "fmt ":
			if size < 16 || int64(body)+size > int64(len(b)) {
				return nil, inputErr("malformed WAV: short fmt chunk")
			}
			f := b[body:]
			tag = binary.LittleEndian.Uint16(f[0:2])
			ch = int(binary.LittleEndian.Uint16(f[2:4]))
			sr = binary.LittleEndian.Uint32(f[4:8])
			align = int(binary.LittleEndian.Uint16(f[12:14]))
			bits = int(binary.LittleEndian.Uint16(f[14:16]))
			if tag == wavExtensible {
				if size < 40 {
					return nil, inputErr("malformed WAV: short extensible fmt chunk")
				}
				tag = binary.LittleEndian.Uint16(f[24:26]) // sub-format GUID's first field
			}
			fmtFound = true
		case "data":
			if !fmtFound {
				return nil, inputErr("malformed WAV: data before fmt")
			}
			if tag != wavPCM && tag != wavFloat {
				return nil, inputErr("WAV encoding %#x is not supported (only PCM and float)", tag)
			}
			bytesPer := bits / 8
			switch {
			case tag == wavPCM && bits != 8 && bits != 16 && bits != 24 && bits != 32,
				tag == wavFloat && bits != 32 && bits != 64:
				return nil, inputErr("WAV with %d-bit samples is not supported", bits)
			case ch < 1 || ch > maxChannels:
				return nil, inputErr("unsupported channel count %d", ch)
			case sr < minRate || sr > maxRate:
				return nil, inputErr("unsupported sample rate %d Hz", sr)
			case align != ch*bytesPer:
				return nil, inputErr("malformed WAV: block align %d for %d channels of %d bits", align, ch, bits)
			}
			avail := int64(len(b) - body)
			// 0 and 0xFFFFFFFF mean "unknown" (streamed writers).
			if size == 0 || size == 0xffffffff {
				size = avail
			}
			if secs := float64(size/int64(align)) / float64(sr); secs > maxSeconds {
				return nil, limitErr("the audio is %.0f seconds long; the limit is %g", secs, maxSeconds)
			}
			if size > avail {
				return nil, inputErr("truncated WAV: the data chunk declares %d bytes, the file has %d", size, avail)
			}
			size -= size % int64(align)
			if size == 0 {
				return nil, inputErr("the audio has no samples")
			}
			return &wavSource{data: b[body : body+int(size)], sr: int(sr), ch: ch, bytesPer: bytesPer, float: tag == wavFloat}, nil
		}
		if int64(body)+size+size%2 > int64(len(b)) {
			break
		}
		p = body + int(size+size%2)
	}
	if !fmtFound {
		return nil, inputErr("malformed WAV: no fmt chunk")
	}
	return nil, inputErr("malformed WAV: no data chunk")
}

func (w *wavSource) rate() int     { return w.sr }
func (w *wavSource) channels() int { return w.ch }

func (w *wavSource) read(dst []float32, n int) ([]float32, error) {
	end := min(len(w.data), w.pos+n*w.ch*w.bytesPer)
	d := w.data[w.pos:end]
	w.pos = end
	switch {
	case w.float && w.bytesPer == 4:
		for i := 0; i+4 <= len(d); i += 4 {
			dst = append(dst, math.Float32frombits(binary.LittleEndian.Uint32(d[i:])))
		}
	case w.float:
		for i := 0; i+8 <= len(d); i += 8 {
			dst = append(dst, float32(math.Float64frombits(binary.LittleEndian.Uint64(d[i:]))))
		}
	case w.bytesPer == 1:
		for _, v := range d {
			dst = append(dst, (float32(v)-128)/128)
		}
	case w.bytesPer == 2:
		for i := 0; i+2 <= len(d); i += 2 {
			dst = append(dst, float32(int16(binary.LittleEndian.Uint16(d[i:])))/32768)
		}
	case w.bytesPer == 3:
		for i := 0; i+3 <= len(d); i += 3 {
			v := int32(uint32(d[i])<<8|uint32(d[i+1])<<16|uint32(d[i+2])<<24) >> 8
			dst = append(dst, float32(v)/8388608)
		}
	default:
		for i := 0; i+4 <= len(d); i += 4 {
			dst = append(dst, float32(float64(int32(binary.LittleEndian.Uint32(d[i:])))/2147483648))
		}
	}
	if w.pos >= len(w.data) {
		return dst, io.EOF
	}
	return dst, nil
}

// mp3Source wraps go-mp3, which always yields 16-bit stereo.
type mp3Source struct {
	d   *mp3.Decoder
	buf []byte
}

func newMP3(b []byte) (source, error) {
	// A plain reader (not a Seeker) keeps go-mp3 from scanning the whole
	// file up front; convert stops at the duration limit instead.
	d, err := mp3.NewDecoder(struct{ io.Reader }{bytes.NewReader(b)})
	if err != nil {
		return nil, inputErr("malformed MP3: %v", err)
	}
	return &mp3Source{d: d}, nil
}

func (m *mp3Source) rate() int     { return m.d.SampleRate() }
func (m *mp3Source) channels() int { return 2 }

func (m *mp3Source) read(dst []float32, n int) ([]float32, error) {
	if cap(m.buf) < n*4 {
		m.buf = make([]byte, n*4)
	}
	got, err := io.ReadFull(m.d, m.buf[:n*4])
	got -= got % 4
	for i := 0; i < got; i += 2 {
		dst = append(dst, float32(int16(binary.LittleEndian.Uint16(m.buf[i:])))/32768)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return dst, io.EOF
	}
	return dst, err
}

// flacSource wraps mewkiz/flac, one frame at a time.
type flacSource struct {
	s     *flac.Stream
	sr    int
	ch    int
	scale float32
}

func newFLAC(b []byte, maxSeconds float64) (source, error) {
	if i := bytes.Index(b[:min(len(b), 1<<20)], []byte("fLaC")); i > 0 {
		b = b[i:] // skip an ID3 tag
	}
	s, err := flac.New(bytes.NewReader(b))
	if err != nil {
		return nil, inputErr("malformed FLAC: %v", err)
	}
	info := s.Info
	if info.SampleRate == 0 || info.NChannels == 0 || info.BitsPerSample == 0 {
		return nil, inputErr("malformed FLAC: empty stream info")
	}
	if secs := float64(info.NSamples) / float64(info.SampleRate); secs > maxSeconds {
		return nil, limitErr("the audio is %.0f seconds long; the limit is %g", secs, maxSeconds)
	}
	return &flacSource{s: s, sr: int(info.SampleRate), ch: int(info.NChannels), scale: float32(math.Ldexp(1, int(info.BitsPerSample)-1))}, nil
}

func (f *flacSource) rate() int     { return f.sr }
func (f *flacSource) channels() int { return f.ch }

func (f *flacSource) read(dst []float32, n int) ([]float32, error) {
	for len(dst) < n*f.ch {
		fr, err := f.s.ParseNext()
		if err != nil {
			return dst, err
		}
		if len(fr.Subframes) != f.ch {
			return dst, inputErr("malformed FLAC: a frame has %d channels, the stream %d", len(fr.Subframes), f.ch)
		}
		ns := len(fr.Subframes[0].Samples)
		for _, sf := range fr.Subframes {
			if len(sf.Samples) != ns {
				return dst, inputErr("malformed FLAC: uneven subframes")
			}
		}
		for i := range ns {
			for _, sf := range fr.Subframes {
				dst = append(dst, float32(sf.Samples[i])/f.scale)
			}
		}
	}
	return dst, nil
}

// vorbisSource wraps jfreymuth/oggvorbis.
type vorbisSource struct {
	r   *oggvorbis.Reader
	buf []float32
}

func newVorbis(b []byte, maxSeconds float64) (source, error) {
	r, err := oggvorbis.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, inputErr("malformed Ogg Vorbis: %v", err)
	}
	if r.SampleRate() <= 0 {
		return nil, inputErr("malformed Ogg Vorbis: sample rate %d", r.SampleRate())
	}
	if secs := float64(r.Length()) / float64(r.SampleRate()); secs > maxSeconds {
		return nil, limitErr("the audio is %.0f seconds long; the limit is %g", secs, maxSeconds)
	}
	return &vorbisSource{r: r}, nil
}

func (v *vorbisSource) rate() int     { return v.r.SampleRate() }
func (v *vorbisSource) channels() int { return v.r.Channels() }

func (v *vorbisSource) read(dst []float32, n int) ([]float32, error) {
	ch := v.r.Channels()
	if cap(v.buf) < n*ch {
		v.buf = make([]float32, n*ch)
	}
	got, err := v.r.Read(v.buf[:n*ch])
	dst = append(dst, v.buf[:got]...)
	return dst, err
}

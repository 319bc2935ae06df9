package audioenc

import (
	"bufio"
	"io"

	"github.com/mewkiz/flac"
	"github.com/mewkiz/flac/frame"
	"github.com/mewkiz/flac/meta"
)

// flacBlock is the number of samples per FLAC frame (libFLAC's default).
const flacBlock = 4096

// flacWriter buffers samples into fixed-size blocks and writes one FLAC
// frame per block; the encoder picks the best fixed predictor per frame.
type flacWriter struct {
	bw      *bufio.Writer
	enc     *flac.Encoder
	pending []int32
	rate    uint32
}

// newFLACWriter writes the FLAC header for mono 16-bit audio at rate;
// total is the sample count when known (0: unknown).
func newFLACWriter(dst io.Writer, rate int, total uint64) (*flacWriter, error) {
	bw := bufio.NewWriterSize(dst, 32<<10)
	info := &meta.StreamInfo{
		BlockSizeMin:  16,
		BlockSizeMax:  flacBlock,
		SampleRate:    uint32(rate),
		NChannels:     1,
		BitsPerSample: 16,
		NSamples:      total,
	}
	enc, err := flac.NewEncoder(bw, info)
	if err != nil {
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	return &flacWriter{bw: bw, enc: enc, rate: uint32(rate), pending: make([]int32, 0, flacBlock)}, nil
}

func (w *flacWriter) Write(pcm []float32) error {
	for _, v := range pcm {
		w.pending = append(w.pending, int32(s16(v)))
		if len(w.pending) == flacBlock {
			if err := w.frame(); err != nil {
				return err
			}
		}
	}
	return w.bw.Flush()
}

// frame encodes the pending samples as one frame.
func (w *flacWriter) frame() error {
	if len(w.pending) == 0 {
		return nil
	}
	samples := append([]int32(nil), w.pending...)
	w.pending = w.pending[:0]
	f := &frame.Frame{
		Header: frame.Header{
			HasFixedBlockSize: true,
			BlockSize:         uint16(len(samples)),
			SampleRate:        w.rate,
			Channels:          frame.ChannelsMono,
			BitsPerSample:     16,
		},
		Subframes: []*frame.Subframe{{
			SubHeader: frame.SubHeader{Pred: frame.PredVerbatim},
			Samples:   samples,
			NSamples:  len(samples),
		}},
	}
	return w.enc.WriteFrame(f)
}

// Close writes the last, shorter frame and flushes. The destination is not
// closed (the encoder's Close would close a closer, so it is not called:
// it only rewrites the header on seekable outputs).
func (w *flacWriter) Close() error {
	if err := w.frame(); err != nil {
		return err
	}
	return w.bw.Flush()
}

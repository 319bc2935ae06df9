package audioenc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ffmpeg limits.
const (
	// probeTimeout bounds `ffmpeg -encoders` at start-up.
	probeTimeout = 10 * time.Second
	// encodeTimeout bounds one whole-buffer Encode beyond the audio's own
	// duration (encoding runs many times faster than real time).
	encodeTimeout = 30 * time.Second
	// outputSlack is added to twice the PCM bytes given, the most encoded
	// bytes accepted from ffmpeg (compressed audio is far smaller).
	outputSlack = 1 << 20
	stderrMax   = 4096
)

// ffmpegCodec holds the ffmpeg arguments of each format.
var ffmpegCodec = map[Format]struct {
	encoder string   // the encoder that must exist
	args    []string // output options
}{
	MP3:  {"libmp3lame", []string{"-c:a", "libmp3lame", "-b:a", "128k", "-f", "mp3"}},
	Opus: {"libopus", []string{"-c:a", "libopus", "-b:a", "64k", "-ar", "48000", "-f", "ogg", "-page_duration", "20000"}},
	AAC:  {"aac", []string{"-c:a", "aac", "-b:a", "96k", "-f", "adts"}},
}

// FFmpegProgram is the encoder program looked up on PATH (Debian package
// ffmpeg; the container image installs it).
const FFmpegProgram = "ffmpeg"

// New returns an Encoder using the ffmpeg found on PATH (if any).
func New() *Encoder {
	p, err := exec.LookPath(FFmpegProgram)
	if err != nil {
		return &Encoder{}
	}
	return NewWithFFmpeg(p)
}

// NewWithFFmpeg returns an Encoder using the ffmpeg program at path ("":
// none); it asks that program, once, which encoders it has.
func NewWithFFmpeg(path string) *Encoder {
	e := &Encoder{codecs: map[Format]bool{}}
	if path == "" {
		return e
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "-hide_banner", "-encoders")
	out := &capped{max: 1 << 20}
	cmd.Stdout = out
	if err := cmd.Run(); err != nil {
		return e
	}
	have := map[string]bool{}
	for _, line := range strings.Split(out.b.String(), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && len(f[0]) == 6 && f[0][0] == 'A' {
			have[f[1]] = true
		}
	}
	e.ffmpeg = path
	for f, c := range ffmpegCodec {
		e.codecs[f] = have[c.encoder]
	}
	return e
}

// capped keeps the first max bytes written to it and drops the rest.
type capped struct {
	b   bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.b.Len(); room > 0 {
		c.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// feedQueue bounds the PCM chunks waiting for ffmpeg's input.
const feedQueue = 64

// ffmpegWriter feeds s16le PCM to an ffmpeg process and copies what it
// writes to dst as it comes.
//
// Write hands the chunk to a feeding goroutine and returns: the caller (a
// speech engine between two sentences) does not wait for ffmpeg to start
// (process start-up and codec loading take tens of milliseconds, more on a
// busy machine) or to take in the chunk, so the next model run overlaps the
// encoding instead of queueing behind it.
type ffmpegWriter struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	cancel   context.CancelFunc
	copyDone chan struct{}
	copyErr  error
	feed     chan []byte
	failed   chan struct{} // closed when a write to ffmpeg failed
	feedDone chan struct{} // closed when the feeder has ended
	feedErr  error
	closed   bool
	stderr   *capped
	mu       sync.Mutex
	inBytes  int64 // PCM bytes written
	outBytes int64 // encoded bytes read
	once     sync.Once
	err      error
}

// newFFmpegWriter starts ffmpeg for f. samples is the total input when
// known (then the run is bounded by encodeTimeout plus the audio's
// duration), or -1 for a stream bounded by ctx.
func (e *Encoder) newFFmpegWriter(ctx context.Context, dst io.Writer, f Format, rate, samples int) (*ffmpegWriter, error) {
	c, ok := ffmpegCodec[f]
	if !ok {
		return nil, fmt.Errorf("audioenc: unknown format %q", f)
	}
	if !e.Available(f) {
		return nil, fmt.Errorf("%w: %s", ErrUnavailable, f)
	}
	var cancel context.CancelFunc
	if samples >= 0 {
		ctx, cancel = context.WithTimeout(ctx, encodeTimeout+time.Duration(samples)*time.Second/time.Duration(rate))
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	args := []string{"-hide_banner", "-loglevel", "error", "-nostdin",
		"-f", "s16le", "-ar", strconv.Itoa(rate), "-ac", "1", "-i", "pipe:0"}
	args = append(args, c.args...)
	args = append(args, "-flush_packets", "1", "pipe:1")
	cmd := exec.CommandContext(ctx, e.ffmpeg, args...)
	w := &ffmpegWriter{cmd: cmd, cancel: cancel, copyDone: make(chan struct{}), stderr: &capped{max: stderrMax},
		feed: make(chan []byte, feedQueue), failed: make(chan struct{}), feedDone: make(chan struct{})}
	cmd.Stderr = w.stderr
	cmd.WaitDelay = 2 * time.Second
	var err error
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		cancel()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("audioenc: start ffmpeg: %w", err)
	}
	go w.copyOut(dst, stdout)
	go w.feedIn()
	return w, nil
}

// feedIn writes the queued chunks to ffmpeg's input, then closes it (after
// Close, or at the first failed write, which stops ffmpeg).
func (w *ffmpegWriter) feedIn() {
	defer close(w.feedDone)
	for b := range w.feed {
		if _, err := w.stdin.Write(b); err != nil {
			w.feedErr = err
			w.abort()
			close(w.failed)
			for range w.feed {
			}
			break
		}
	}
	w.stdin.Close()
}

// copyOut copies ffmpeg's output to dst, refusing more than twice the PCM
// bytes written so far plus outputSlack.
func (w *ffmpegWriter) copyOut(dst io.Writer, src io.Reader) {
	defer close(w.copyDone)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			w.mu.Lock()
			w.outBytes += int64(n)
			over := w.outBytes > 2*w.inBytes+outputSlack
			w.mu.Unlock()
			if over {
				w.copyErr = errors.New("audioenc: ffmpeg output over the limit")
				w.cancel()
				io.Copy(io.Discard, src)
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				w.copyErr = werr
				w.cancel()
				io.Copy(io.Discard, src)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Write queues the chunk for ffmpeg (waiting only when feedQueue chunks are
// already queued). A failure of an earlier chunk is returned here or by
// Close.
func (w *ffmpegWriter) Write(pcm []float32) error {
	if w.closed {
		return errors.New("audioenc: write after close")
	}
	b := toS16(pcm, nil)
	w.mu.Lock()
	w.inBytes += int64(len(b))
	w.mu.Unlock()
	select {
	case w.feed <- b:
		return nil
	case <-w.failed:
		return w.Close()
	}
}

// Close ends the input, waits for ffmpeg to take in every queued chunk and
// to write the rest of its output, and reports the first error.
func (w *ffmpegWriter) Close() error {
	if !w.closed {
		w.closed = true
		close(w.feed)
	}
	<-w.feedDone
	return w.finish(w.feedErr)
}

// abort kills ffmpeg.
func (w *ffmpegWriter) abort() { w.cancel() }

// finish waits for the copy and the process, once, and reports the first
// error.
func (w *ffmpegWriter) finish(first error) error {
	w.once.Do(func() {
		<-w.copyDone
		werr := w.cmd.Wait()
		w.cancel()
		switch {
		case w.copyErr != nil:
			w.err = w.copyErr
		case werr != nil:
			w.err = fmt.Errorf("audioenc: ffmpeg: %w: %s", werr, strings.TrimSpace(w.stderr.b.String()))
		case first != nil:
			w.err = first
		}
	})
	return w.err
}

package audioenc

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"
)

// gatedWriter blocks every Write until open is closed, then keeps the
// bytes.
type gatedWriter struct {
	open chan struct{}
	mu   sync.Mutex
	b    bytes.Buffer
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	<-g.open
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.b.Write(p)
}

// TestFFmpegWriterQueues: Write hands chunks to ffmpeg without waiting for
// it, even while its output is stuck (a slow client): the caller is not
// held up by ffmpeg's start-up or by the pipe. Close then delivers
// everything, and the stream decodes to the whole duration.
func TestFFmpegWriterQueues(t *testing.T) {
	e := New()
	if !e.Available(MP3) {
		t.Fatal("mp3 not available (install the Debian package ffmpeg)")
	}
	dst := &gatedWriter{open: make(chan struct{})}
	w, err := e.NewWriter(context.Background(), dst, MP3, 24000)
	if err != nil {
		t.Fatal(err)
	}
	chunk := tone(24000, 24000) // 1 s, 48 KB of s16: far more than a pipe holds in all
	wrote := make(chan error, 1)
	go func() {
		for range 8 {
			if err := w.Write(chunk); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		close(dst.open)
		t.Fatal("writes blocked while the output was stuck")
	}
	close(dst.open)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rate, secs := probe(t, dst.b.Bytes())
	if rate != 24000 || secs < 7.9 || secs > 8.2 {
		t.Fatalf("decoded %d Hz, %.2f s; want 24000 Hz, 8 s", rate, secs)
	}
}

// TestFFmpegWriterReportsFailure: when ffmpeg stops (its context is
// cancelled), a later Write or Close reports it.
func TestFFmpegWriterReportsFailure(t *testing.T) {
	e := New()
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	w, err := e.NewWriter(ctx, &out, MP3, 24000)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(tone(2400, 24000)); err != nil {
		t.Fatal(err)
	}
	cancel()
	var werr error
	for i := 0; i < 200 && werr == nil; i++ {
		werr = w.Write(tone(24000, 24000))
		time.Sleep(10 * time.Millisecond)
	}
	cerr := w.Close()
	if werr == nil || cerr == nil {
		t.Fatalf("after ffmpeg was stopped: write error %v, close error %v", werr, cerr)
	}
}

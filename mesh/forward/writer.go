package forward

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"connectrpc.com/connect"

	forwardv1 "github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1"
	"github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1/forwardv1connect"
)

// flushGate wraps the http.ResponseWriter Connect writes the stream to and
// holds back Connect's flush after every message. The stream writer flushes
// through it only when the local handler flushed, so a plain response
// travels as one burst (head, body, trailer) and a streamed one as the
// handler paces it. The HTTP server flushes the rest when the call ends.
type flushGate struct {
	http.ResponseWriter
}

type gateKey struct{}

// tlsPeerKey marks the context of a Multiplex call that arrived over mutual
// TLS: its frames need no MACs.
type tlsPeerKey struct{}

// gateFlushes puts a flushGate in front of h.
func gateFlushes(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The client's own response gets a Date from its node's server;
		// this internal one needs none.
		w.Header()["Date"] = nil
		switch r.URL.Path {
		case forwardv1connect.ForwardServiceForwardUnaryProcedure:
			h.ServeHTTP(w, r) // one message: Connect flushes once, at the end
			return
		case forwardv1connect.ForwardServiceRelayProcedure:
			h.ServeHTTP(w, r) // every relayed frame must leave at once
			return
		}
		g := &flushGate{ResponseWriter: w}
		ctx := context.WithValue(r.Context(), gateKey{}, g)
		if r.URL.Path == forwardv1connect.ForwardServiceMultiplexProcedure {
			if channelAuthenticated(r.TLS) {
				ctx = context.WithValue(ctx, tlsPeerKey{}, true)
			}
			r.Body = bufferedBody(r.Body)
		}
		h.ServeHTTP(g, r.WithContext(ctx))
	})
}

func flushGateFrom(ctx context.Context) *flushGate {
	g, _ := ctx.Value(gateKey{}).(*flushGate)
	return g
}

// Flush is what Connect calls after each message; it is held back.
func (g *flushGate) Flush() {}

// Unwrap exposes the underlying writer to http.ResponseController.
func (g *flushGate) Unwrap() http.ResponseWriter { return g.ResponseWriter }

// flushNow really flushes.
func (g *flushGate) flushNow() error {
	if g == nil {
		return nil
	}
	return http.NewResponseController(g.ResponseWriter).Flush()
}

// streamWriter is the http.ResponseWriter the local handler writes to. It
// turns the handler's output into head, chunk and trailer messages.
type streamWriter struct {
	send  func(*forwardv1.ForwardResponse) error
	flush func() error // pushes what was sent to the wire
	chunk int

	mu        sync.Mutex
	header    http.Header
	status    int                 // 0 until WriteHeader or the first Write
	head      []*forwardv1.Header // headers captured at WriteHeader
	headSent  bool
	buf       []byte
	unflushed bool  // messages sent since the last flush mark
	err       error // first send error; later writes fail with it
	usage     Usage
	done      bool
	unary     int  // > 0: collect the whole body (at most this many bytes) for one Whole message
	noFlush   bool // ignore the handler's flushes (a multiplexed unary call)
}

func newStreamWriter(send func(*forwardv1.ForwardResponse) error, flush func() error, chunk int) *streamWriter {
	return &streamWriter{send: send, flush: flush, chunk: chunk, header: http.Header{}}
}

// newUnaryWriter returns a writer that sends nothing until the handler
// returns, then the whole response as one Whole message; flushes are
// ignored and a body over limit bytes fails the writes.
func newUnaryWriter(send func(*forwardv1.ForwardResponse) error, limit int) *streamWriter {
	return &streamWriter{send: send, header: http.Header{}, unary: limit}
}

// errUnaryTooLarge fails a ForwardUnary call whose response outgrew the
// limit; the refusal header tells the client to ask again as a stream. A
// new error each time: a *connect.Error carries mutable metadata.
func errUnaryTooLarge() *connect.Error {
	err := connect.NewError(connect.CodeResourceExhausted, errors.New("forward: response too large for a unary forward"))
	err.Meta().Set(RefusalHeader, refusalTooLarge)
	return err
}

// refusalTooLarge is the RefusalHeader value of errUnaryTooLarge.
const refusalTooLarge = "unary-too-large"

// sent reports whether any frame of the response was sent.
func (w *streamWriter) sent() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.headSent
}

// Header returns the response headers the handler sets.
func (w *streamWriter) Header() http.Header { return w.header }

// WriteHeader fixes the status and headers. Informational (1xx) statuses
// are not forwarded; a second call is ignored, as net/http does.
func (w *streamWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writeHeaderLocked(code)
}

func (w *streamWriter) writeHeaderLocked(code int) {
	if w.status != 0 || (code >= 100 && code < 200) {
		return
	}
	if code < 100 || code > 999 {
		code = http.StatusInternalServerError
	}
	w.status = code
	w.head = headersToProto(w.header) // later header changes are ignored, as in net/http
}

// Write buffers body bytes and sends a chunk whenever ChunkSize is reached.
func (w *streamWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return 0, errors.New("forward: write after the handler returned")
	}
	w.writeHeaderLocked(http.StatusOK)
	if w.err != nil {
		return 0, w.err
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if w.unary > 0 {
		if len(w.buf)+len(p) > w.unary {
			w.err = errUnaryTooLarge()
			return 0, w.err
		}
		w.buf = append(w.buf, p...)
		return len(p), nil
	}
	n := len(p)
	for len(p) > 0 {
		room := w.chunk - len(w.buf)
		take := min(room, len(p))
		w.buf = append(w.buf, p[:take]...)
		p = p[take:]
		if len(w.buf) >= w.chunk {
			if err := w.sendLocked(false); err != nil {
				return n - len(p), err
			}
		}
	}
	return n, nil
}

// Flush sends the head and any buffered body now. It makes SSE work.
func (w *streamWriter) Flush() { _ = w.FlushError() }

// FlushError is Flush reporting failure (used by http.ResponseController).
func (w *streamWriter) FlushError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return nil
	}
	w.writeHeaderLocked(http.StatusOK)
	if w.unary > 0 || w.noFlush {
		return w.err
	}
	return w.sendLocked(true)
}

// SetUsage records the request's token usage for the trailer.
func (w *streamWriter) SetUsage(promptTokens, completionTokens int64) {
	w.mu.Lock()
	w.usage = Usage{PromptTokens: promptTokens, CompletionTokens: completionTokens}
	w.mu.Unlock()
}

// sendLocked sends the head if it has not gone yet and the buffered body.
// With flush set, the last message sent carries the flush mark (an empty
// chunk when only earlier, unmarked chunks are outstanding) and the stream
// is flushed to the wire.
func (w *streamWriter) sendLocked(flush bool) error {
	if w.err != nil {
		return w.err
	}
	if !w.headSent {
		w.headSent = true
		w.unflushed = true
		err := w.send(&forwardv1.ForwardResponse{Frame: &forwardv1.ForwardResponse_Head{Head: &forwardv1.Head{
			Status:  int32(w.status),
			Headers: w.head,
			Flush:   flush && len(w.buf) == 0,
		}}})
		if err != nil {
			w.err = err
			return err
		}
		if flush && len(w.buf) == 0 {
			w.unflushed = false
		}
	}
	if len(w.buf) > 0 || (flush && w.unflushed) {
		err := w.send(&forwardv1.ForwardResponse{Frame: &forwardv1.ForwardResponse_Chunk{Chunk: &forwardv1.Chunk{Data: w.buf, Flush: flush}}})
		w.buf = w.buf[:0] // Send has marshalled the message; the buffer is free
		w.unflushed = !flush
		if err != nil {
			w.err = err
			return err
		}
	}
	if flush {
		if err := w.flush(); err != nil {
			w.err = err
			return err
		}
	}
	return nil
}

// serve runs the handler and completes the stream: what is left of the
// head and body, then the trailer. A handler panic before anything was sent
// fails the call; after the head it ends the stream with the error in the
// trailer. http.ErrAbortHandler is treated like any other panic.
func (w *streamWriter) serve(h http.Handler, r *http.Request) (err error) {
	var failure string
	func() {
		defer func() {
			if p := recover(); p != nil {
				failure = fmt.Sprintf("handler panic: %v", p)
			}
		}()
		h.ServeHTTP(w, r)
	}()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
	if failure != "" && !w.headSent {
		return errors.New(failure)
	}
	if w.unary > 0 && w.err != nil {
		return w.err
	}
	t := &forwardv1.Trailer{Error: failure}
	if w.usage != (Usage{}) {
		t.Usage = &forwardv1.Usage{PromptTokens: w.usage.PromptTokens, CompletionTokens: w.usage.CompletionTokens}
	}
	if failure == "" {
		w.writeHeaderLocked(http.StatusOK)
		if !w.headSent && w.err == nil {
			// Nothing was sent yet: the whole response goes in one frame.
			w.headSent = true
			return w.send(&forwardv1.ForwardResponse{Frame: &forwardv1.ForwardResponse_Whole{Whole: &forwardv1.Whole{
				Head:    &forwardv1.Head{Status: int32(w.status), Headers: w.head},
				Body:    w.buf,
				Trailer: t,
			}}})
		}
		if err := w.sendLocked(false); err != nil {
			return err
		}
	}
	return w.send(&forwardv1.ForwardResponse{Frame: &forwardv1.ForwardResponse_Trailer{Trailer: t}})
}

func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified && (status < 100 || status >= 200)
}

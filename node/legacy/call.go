package legacy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// How much of an in-process /v1 answer Close still reads, and for how
// long, before it cuts the call off.
const (
	drainLimit = 1 << 20
	drainWait  = 2 * time.Second
)

// v1Response is the head and the streamed body of an in-process /v1 call.
type v1Response struct {
	status int
	header http.Header
	body   io.Reader
	close  func()
}

// Close stops the call: the /v1 handler's next write fails and its
// context is cancelled.
func (r *v1Response) Close() { r.close() }

// v1Error is a /v1 answer with an error status.
type v1Error struct {
	status int
	msg    string
}

// Error is the /v1 error message.
func (e *v1Error) Error() string { return e.msg }

// call runs method path with a JSON body (nil for none) through the /v1
// handler in-process, on behalf of the legacy request orig. It returns once
// the head is written; the body streams through a pipe as the handler
// writes it. A non-2xx answer is returned as a *v1Error with the OpenAI
// error message.
func (s *Server) call(orig *http.Request, method, path string, body any) (*v1Response, error) {
	var rd io.Reader = http.NoBody
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithCancel(context.WithValue(orig.Context(), legacyKey{}, true))
	req, err := http.NewRequestWithContext(ctx, method, path, rd)
	if err != nil {
		cancel()
		return nil, err
	}
	req.RemoteAddr, req.Host = orig.RemoteAddr, orig.Host
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if id := orig.Header.Get("X-Request-Id"); id != "" {
		req.Header.Set("X-Request-Id", id)
	}
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, pw: pw, head: make(chan struct{})}
	go func() {
		defer func() {
			if p := recover(); p != nil {
				// The /v1 handler aborted (e.g. a peer's stream broke off).
				w.WriteHeader(http.StatusBadGateway)
				pw.CloseWithError(fmt.Errorf("the /v1 call broke off: %v", p))
				return
			}
			w.WriteHeader(http.StatusOK)
			pw.Close()
		}()
		s.opt.V1.ServeHTTP(w, req)
	}()
	<-w.head
	res := &v1Response{status: w.status, header: w.sent, body: pr, close: func() {
		// A caller that read what it needed (one JSON object, a stream up
		// to its last event) leaves the /v1 handler a few bytes and, for a
		// response forwarded from a peer, the stream's trailer: let it
		// finish, so the call is not logged and counted as broken off.
		// Bounded, and skipped when the legacy caller is gone.
		if orig.Context().Err() == nil {
			drained := make(chan struct{})
			go func() {
				io.Copy(io.Discard, io.LimitReader(pr, drainLimit))
				close(drained)
			}()
			select {
			case <-drained:
			case <-time.After(drainWait):
			}
		}
		pr.Close()
		cancel()
	}}
	if res.status/100 != 2 {
		defer res.Close()
		raw, _ := io.ReadAll(io.LimitReader(pr, 1<<20))
		return nil, &v1Error{status: res.status, msg: openAIMessage(raw, res.status)}
	}
	return res, nil
}

// getJSON runs a GET through /v1 and decodes the answer.
func (s *Server) getJSON(orig *http.Request, path string, v any) error {
	res, err := s.call(orig, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	defer res.Close()
	if err := json.NewDecoder(res.body).Decode(v); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	return nil
}

// openAIMessage extracts the message of an OpenAI error body.
func openAIMessage(raw []byte, status int) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	if s := strings.TrimSpace(string(raw)); s != "" {
		return s
	}
	return http.StatusText(status)
}

// fail writes err in Ollama's error shape: a /v1 error with its status,
// anything else as 500.
func (s *Server) fail(w http.ResponseWriter, err error) {
	var ve *v1Error
	if errors.As(err, &ve) {
		writeError(w, ve.status, ve.msg)
		return
	}
	s.log.Warn("legacy API call failed", "err", err)
	writeError(w, http.StatusInternalServerError, err.Error())
}

// pipeWriter is the http.ResponseWriter the /v1 handler writes into: the
// head is handed over once through the head channel, the body through a
// pipe, so streams reach the legacy caller event by event.
type pipeWriter struct {
	header http.Header
	sent   http.Header
	status int
	once   sync.Once
	head   chan struct{}
	pw     *io.PipeWriter
}

// Header returns the header map the handler fills.
func (w *pipeWriter) Header() http.Header { return w.header }

// WriteHeader hands the status and headers over (once).
func (w *pipeWriter) WriteHeader(code int) {
	if code < 200 {
		return
	}
	w.once.Do(func() {
		w.status, w.sent = code, w.header.Clone()
		close(w.head)
	})
}

// Write passes body bytes to the reader; it blocks until they are read.
func (w *pipeWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(b)
}

// Flush is a no-op: every write already reaches the reader.
func (w *pipeWriter) Flush() { w.WriteHeader(http.StatusOK) }

// sseReader reads the data fields of server-sent events.
type sseReader struct{ sc *bufio.Scanner }

func newSSEReader(r io.Reader) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 8<<20)
	return &sseReader{sc: sc}
}

// next returns the next event's data, or io.EOF.
func (s *sseReader) next() ([]byte, error) {
	var data [][]byte
	for s.sc.Scan() {
		line := s.sc.Bytes()
		if len(line) == 0 {
			if data != nil {
				return bytes.Join(data, []byte("\n")), nil
			}
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		if string(field) == "data" {
			data = append(data, bytes.Clone(bytes.TrimPrefix(value, []byte(" "))))
		}
	}
	if err := s.sc.Err(); err != nil {
		return nil, err
	}
	if data != nil {
		return bytes.Join(data, []byte("\n")), nil
	}
	return nil, io.EOF
}

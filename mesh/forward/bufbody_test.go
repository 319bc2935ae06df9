package forward

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1/forwardv1connect"
)

// countingBody counts the reads that reach a body.
type countingBody struct {
	r     io.Reader
	reads int
}

func (b *countingBody) Read(p []byte) (int, error) { b.reads++; return b.r.Read(p) }
func (b *countingBody) Close() error               { return nil }

// envelopes returns n Connect envelopes of size bytes each, back to back.
func envelopes(n, size int) []byte {
	var out []byte
	for i := range n {
		var prefix [5]byte
		binary.BigEndian.PutUint32(prefix[1:], uint32(size))
		out = append(out, prefix[:]...)
		out = append(out, bytes.Repeat([]byte{byte(i)}, size)...)
	}
	return out
}

// readEnvelopes reads envelopes from r as Connect does: the 5-byte
// prefix, then the payload, each with reads of its own.
func readEnvelopes(t *testing.T, r io.Reader) int {
	t.Helper()
	n := 0
	for {
		var prefix [5]byte
		if _, err := io.ReadFull(r, prefix[:]); err == io.EOF {
			return n
		} else if err != nil {
			t.Fatal(err)
		}
		payload := make([]byte, binary.BigEndian.Uint32(prefix[1:]))
		if _, err := io.ReadFull(r, payload); err != nil {
			t.Fatal(err)
		}
		n++
	}
}

// TestMultiplexBodiesBuffered: the server reads a Multiplex stream's
// request body, and the client its response body, through a buffer, so
// that twenty messages that have arrived cost one read of the HTTP/2
// body instead of forty; other procedures' bodies are left alone.
func TestMultiplexBodiesBuffered(t *testing.T) {
	const n = 20
	data := envelopes(n, 100)

	for _, tc := range []struct {
		path     string
		buffered bool
	}{
		{forwardv1connect.ForwardServiceMultiplexProcedure, true},
		{forwardv1connect.ForwardServiceForwardProcedure, false},
	} {
		body := &countingBody{r: bytes.NewReader(data)}
		var got int
		h := gateFlushes(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got = readEnvelopes(t, r.Body)
		}))
		req := httptest.NewRequest(http.MethodPost, tc.path, nil)
		req.Body = body
		h.ServeHTTP(httptest.NewRecorder(), req)
		if got != n {
			t.Fatalf("%s: read %d messages, want %d", tc.path, got, n)
		}
		if tc.buffered && body.reads > 2 {
			t.Errorf("server, %s: %d reads of the body for %d messages, want at most 2 (one, then EOF)", tc.path, body.reads, n)
		}
		if !tc.buffered && body.reads < 2*n {
			t.Errorf("server, %s: %d reads of the body, want the handler's own %d or more", tc.path, body.reads, 2*n)
		}
	}

	body := &countingBody{r: bytes.NewReader(data)}
	rt := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Body: body, Header: http.Header{}}, nil
	})
	req := httptest.NewRequest(http.MethodPost, "http://peer"+forwardv1connect.ForwardServiceMultiplexProcedure, nil)
	resp, err := memBody{rt}.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := readEnvelopes(t, resp.Body); got != n {
		t.Fatalf("client: read %d messages, want %d", got, n)
	}
	if body.reads > 2 {
		t.Errorf("client: %d reads of the response body for %d messages, want at most 2", body.reads, n)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

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
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if _, ok := r.Body.(*wholeEnvelopes); !ok {
			t.Errorf("client: the transport reads the request body as %T, want *wholeEnvelopes", r.Body)
		}
		return &http.Response{StatusCode: http.StatusOK, Body: body, Header: http.Header{}}, nil
	})
	req := httptest.NewRequest(http.MethodPost, "http://peer"+forwardv1connect.ForwardServiceMultiplexProcedure, nil)
	req.Body = io.NopCloser(bytes.NewReader(nil))
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

// TestWholeEnvelopes: a Multiplex stream's request body, written as
// Connect writes it (each message's prefix and payload in writes of
// their own, through a pipe), reads as whole messages — one DATA frame
// each for the HTTP/2 transport — and the bytes come through unchanged,
// also when the reader's buffer is smaller than a message.
func TestWholeEnvelopes(t *testing.T) {
	var msgs [][]byte
	for _, size := range []int{100, 0, 3, 70000, 1} {
		msgs = append(msgs, envelopes(1, size))
	}
	write := func() *io.PipeReader {
		pr, pw := io.Pipe()
		go func() {
			for _, m := range msgs {
				if _, err := pw.Write(m[:5]); err != nil {
					return
				}
				if len(m) > 5 {
					if _, err := pw.Write(m[5:]); err != nil {
						return
					}
				}
			}
			pw.Close()
		}()
		return pr
	}
	var all []byte
	for _, m := range msgs {
		all = append(all, m...)
	}

	got := readThrough(t, &wholeEnvelopes{body: write()}, 256<<10, func(i, n int) {
		if i < len(msgs) && n != len(msgs[i]) {
			t.Fatalf("read %d returned %d bytes, want message %d whole (%d bytes)", i, n, i, len(msgs[i]))
		}
	})
	if !bytes.Equal(got, all) {
		t.Fatal("bytes changed on the way")
	}
	for _, size := range []int{7, 512} {
		if got := readThrough(t, &wholeEnvelopes{body: write()}, size, nil); !bytes.Equal(got, all) {
			t.Fatalf("%d-byte reads: bytes changed on the way", size)
		}
	}
}

// readThrough reads r to its end with reads of size bytes, calling each
// (when set) with every read's index and length, and returns the bytes.
func readThrough(t *testing.T, r io.Reader, size int, each func(i, n int)) []byte {
	t.Helper()
	buf := make([]byte, size)
	var got []byte
	for i := 0; ; i++ {
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		if each != nil {
			each(i, n)
		}
	}
}

// FuzzWholeEnvelopes: whatever bytes a body holds and however they are
// split into writes, they come through wholeEnvelopes unchanged and the
// reads end.
func FuzzWholeEnvelopes(f *testing.F) {
	f.Add(envelopes(3, 10), uint8(5), uint8(64))
	f.Add([]byte{0, 0, 0, 1, 0, 7}, uint8(1), uint8(3))
	f.Add([]byte{0, 255, 255, 255, 255, 1, 2}, uint8(2), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, split, bufSize uint8) {
		pr, pw := io.Pipe()
		go func() {
			rest := data
			for len(rest) > 0 {
				k := min(int(split)+1, len(rest))
				if _, err := pw.Write(rest[:k]); err != nil {
					return
				}
				rest = rest[k:]
			}
			pw.Close()
		}()
		got := readThrough(t, &wholeEnvelopes{body: pr}, int(bufSize)+1, nil)
		if !bytes.Equal(got, data) {
			t.Fatalf("got %d bytes, want the %d written", len(got), len(data))
		}
	})
}

package forward

import (
	"bufio"
	"encoding/binary"
	"io"
)

// The bodies of a Multiplex stream, as HTTP/2 reads them on either end
// (gateFlushes on the server, memBody on the client).

// streamReadBuffer is the read buffer of either end of a Multiplex
// stream.
const streamReadBuffer = 64 << 10

// bufferedBody puts a read buffer in front of a Multiplex stream's body.
// Connect reads each message with two or more reads (its 5-byte prefix,
// then the payload), and on HTTP/2 every read of a body costs: on the
// server a message to the connection's serve goroutine (which wakes it),
// on the client the transport's locks and flow-control bookkeeping. One
// buffered read takes whatever has arrived, often several messages.
func bufferedBody(body io.ReadCloser) io.ReadCloser {
	return struct {
		*bufio.Reader
		io.Closer
	}{bufio.NewReaderSize(body, streamReadBuffer), body}
}

// wholeEnvelopes is a Multiplex stream's request body as the HTTP/2
// transport reads it. Connect writes each message into its pipe in two
// writes (the 5-byte prefix, then the payload), and the transport sends
// every read of the body as a DATA frame with a flush of its own: two
// frames and two write system calls per message, and two frames for the
// peer's reader. Read returns only once the envelopes it read are whole
// (or p is full, or the body fails), so a message leaves in one frame.
// The rest of an envelope is always on its way: Connect writes the
// payload right after the prefix, in the same Send.
type wholeEnvelopes struct {
	body   io.ReadCloser
	prefix [5]byte
	have   int // prefix bytes read of the envelope in progress
	left   int // its payload bytes not yet read
}

// Read implements io.Reader.
func (w *wholeEnvelopes) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := w.body.Read(p[n:])
		w.track(p[n : n+m])
		n += m
		if err != nil || (w.have == 0 && w.left == 0) {
			return n, err
		}
	}
	return n, nil
}

// track follows the envelope framing over b.
func (w *wholeEnvelopes) track(b []byte) {
	for len(b) > 0 {
		if w.left > 0 {
			k := min(w.left, len(b))
			w.left -= k
			b = b[k:]
			continue
		}
		k := copy(w.prefix[w.have:], b)
		w.have += k
		b = b[k:]
		if w.have == len(w.prefix) {
			w.left = int(binary.BigEndian.Uint32(w.prefix[1:]))
			w.have = 0
		}
	}
}

// Close implements io.Closer.
func (w *wholeEnvelopes) Close() error { return w.body.Close() }

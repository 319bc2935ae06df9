package forward_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/mesh/peerauth"
	forwardv1 "github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1"
	"github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1/forwardv1connect"
)

const secret = "s3cret"

type peer struct {
	srv  *forward.Server
	addr string
	http *http.Server
}

// startPeer serves h as a node's local-only handler behind a forward server.
func startPeer(t *testing.T, h http.Handler) *peer { return startPeerChunk(t, 1024, h) }

func startPeerChunk(t testing.TB, chunk int, h http.Handler) *peer {
	return startPeerConfig(t, forward.ServerConfig{NodeID: "srv", ClusterSecret: secret, ChunkSize: chunk}, h)
}

func startPeerConfig(t testing.TB, cfg forward.ServerConfig, h http.Handler) *peer {
	t.Helper()
	srv, err := forward.NewServer(cfg, h, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(srv.Handler())
	hs := forward.NewHTTPServer(mux, nil)
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return &peer{srv: srv, addr: ln.Addr().String(), http: hs}
}

func newClient(t *testing.T, sec string) *forward.Client {
	return newClientConfig(t, forward.ClientConfig{NodeID: "origin", ClusterSecret: sec})
}

func newClientConfig(t *testing.T, cfg forward.ClientConfig) *forward.Client {
	t.Helper()
	c, err := forward.NewClient(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// readAll reads a whole forwarded response.
func readAll(t testing.TB, s *forward.Stream) (forward.Head, []byte, forward.Trailer, error) {
	t.Helper()
	h, err := s.Head()
	if err != nil {
		return h, nil, forward.Trailer{}, err
	}
	var body bytes.Buffer
	for {
		chunk, _, err := s.Next()
		if err == io.EOF {
			return h, body.Bytes(), s.Trailer(), nil
		}
		if err != nil {
			return h, body.Bytes(), forward.Trailer{}, err
		}
		body.Write(chunk)
	}
}

// TestForwardRoundTrip checks the replay and the response through both
// calls: the stream (Forward) and the one-message call (ForwardUnary).
func TestForwardRoundTrip(t *testing.T) {
	for _, unary := range []bool{false, true} {
		t.Run(fmt.Sprintf("unary=%v", unary), func(t *testing.T) { testForwardRoundTrip(t, unary) })
	}
}

func testForwardRoundTrip(t *testing.T, unary bool) {
	var seen atomic.Pointer[http.Request]
	var seenBody atomic.Value
	p := startPeer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seenBody.Store(string(b))
		seen.Store(r)
		info, ok := forward.InfoFrom(r.Context())
		if !ok {
			http.Error(w, "not marked as forwarded", 500)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Info", fmt.Sprintf("%s|%s|%s|%s|%d|%d", info.Caller.KeyID, info.Caller.App, info.RequestID, info.OriginNodeID, info.HopCount, info.Caller.Priority))
		w.Header().Set("Connection", "X-Secret-Hop")
		w.Header().Set("X-Secret-Hop", "must not travel")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Add("Set-Cookie", "a=1")
		w.Header().Add("Set-Cookie", "b=2")
		w.WriteHeader(http.StatusCreated)
		w.(forward.UsageSetter).SetUsage(12, 34)
		fmt.Fprintf(w, `{"path":%q,"query":%q,"method":%q,"host":%q,"remote":%q}`, r.URL.Path, r.URL.RawQuery, r.Method, r.Host, r.RemoteAddr)
	}))
	c := newClient(t, secret)
	hdr := http.Header{}
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Connection", "close, X-Hop")
	hdr.Set("X-Hop", "drop me")
	hdr.Set("Transfer-Encoding", "chunked")
	hdr.Set("Te", "trailers")
	hdr.Set("X-Keep", "yes")
	s, err := c.Forward(context.Background(), p.addr, &forward.Request{
		Method: "POST", Path: "/v1/embeddings?user=1&x=%20y", Host: "api.example", Header: hdr,
		Body:      []byte(`{"input":"hello"}`),
		Caller:    forward.Caller{KeyID: "key-1", App: "app-1", ClientAddress: "203.0.113.9:5555", Priority: 2},
		RequestID: "req-42", Model: "embed/m", Unary: unary,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	head, body, trailer, err := readAll(t, s)
	if err != nil {
		t.Fatal(err)
	}
	if head.Status != http.StatusCreated {
		t.Fatalf("status %d", head.Status)
	}
	if got := head.Header.Get("X-Info"); got != "key-1|app-1|req-42|origin|1|2" {
		t.Fatalf("forwarded info seen by the handler: %q", got)
	}
	if got := head.Header.Values("Set-Cookie"); len(got) != 2 {
		t.Fatalf("multi-value header lost: %v", got)
	}
	for _, h := range []string{"Connection", "X-Secret-Hop", "Keep-Alive"} {
		if head.Header.Get(h) != "" {
			t.Fatalf("hop-by-hop response header %s was forwarded", h)
		}
	}
	want := `{"path":"/v1/embeddings","query":"user=1\u0026x=%20y","method":"POST","host":"api.example","remote":"203.0.113.9:5555"}`
	if string(body) != strings.ReplaceAll(want, `\u0026`, "&") {
		t.Fatalf("body %s", body)
	}
	if trailer.Usage != (forward.Usage{PromptTokens: 12, CompletionTokens: 34}) || trailer.Err != "" {
		t.Fatalf("trailer %+v", trailer)
	}
	r := seen.Load()
	if seenBody.Load() != `{"input":"hello"}` || r.ContentLength != int64(len(`{"input":"hello"}`)) {
		t.Fatalf("request body %q (len %d)", seenBody.Load(), r.ContentLength)
	}
	if r.Header.Get("X-Keep") != "yes" {
		t.Fatal("end-to-end request header lost")
	}
	for _, h := range []string{"Connection", "X-Hop", "Transfer-Encoding", "Te", peerauth.Header} {
		if r.Header.Get(h) != "" {
			t.Fatalf("request header %s reached the local handler", h)
		}
	}
}

func TestForwardStreamsChunkByChunk(t *testing.T) {
	next := make(chan struct{})
	handlerDone := make(chan struct{})
	p := startPeer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(handlerDone)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 1; i <= 3; i++ {
			fmt.Fprintf(w, "data: event %d\n\n", i)
			w.(http.Flusher).Flush()
			if i < 3 {
				<-next // the client must have seen event i before event i+1 exists
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	c := newClient(t, secret)
	s, err := c.Forward(context.Background(), p.addr, &forward.Request{Method: "POST", Path: "/v1/chat/completions"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	head, err := s.Head()
	if err != nil || head.Status != 200 || head.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("head %+v %v", head, err)
	}
	for i := 1; i <= 2; i++ {
		chunk, flush, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !flush {
			t.Fatalf("event %d arrived without the flush mark", i)
		}
		if want := fmt.Sprintf("data: event %d\n\n", i); string(chunk) != want {
			t.Fatalf("chunk %d = %q, want %q", i, chunk, want)
		}
		select {
		case <-handlerDone:
			t.Fatal("handler finished before the client read its first events")
		default:
		}
		next <- struct{}{}
	}
	var rest bytes.Buffer
	for {
		chunk, _, err := s.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		rest.Write(chunk)
	}
	if rest.String() != "data: event 3\n\ndata: [DONE]\n\n" {
		t.Fatalf("rest %q", rest.String())
	}
}

func TestForwardLargeBodyIsChunked(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789abcdef"), 5000) // 80 000 bytes, chunk size 1024
	p := startPeer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b[:33333])
		w.Write(b[33333:])
	}))
	s, err := newClient(t, secret).Forward(context.Background(), p.addr, &forward.Request{Method: "PUT", Path: "/echo", Body: payload})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Head(); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	chunks := 0
	for {
		c, _, err := s.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(c) > 1024 {
			t.Fatalf("chunk of %d bytes exceeds the chunk size", len(c))
		}
		chunks++
		got.Write(c)
	}
	if !bytes.Equal(got.Bytes(), payload) || chunks < 79 {
		t.Fatalf("echo mismatch: %d bytes in %d chunks", got.Len(), chunks)
	}
}

func TestForwardRefusesWrongSecret(t *testing.T) {
	var calls atomic.Int32
	p := startPeer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	s, err := newClient(t, "not-the-secret").Forward(context.Background(), p.addr, &forward.Request{Method: "GET", Path: "/"})
	if err == nil {
		defer s.Close()
		_, err = s.Head()
	}
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("wrong secret: %v, want unauthenticated", err)
	}
	// No secret at all, with a raw Connect client.
	raw := forwardv1connect.NewForwardServiceClient(h2cClient(), "http://"+p.addr)
	rs, err := raw.Forward(context.Background(), connect.NewRequest(&forwardv1.ForwardRequest{Method: "GET", Path: "/", HopCount: 1}))
	if err == nil {
		rs.Receive()
		err = rs.Err()
	}
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("no secret: %v, want unauthenticated", err)
	}
	if calls.Load() != 0 {
		t.Fatal("the local handler ran for an unauthenticated call")
	}
	if _, err := forward.NewServer(forward.ServerConfig{}, http.NotFoundHandler(), nil, nil); err == nil {
		t.Fatal("a server without a cluster secret was built")
	}
}

func h2cClient() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p}}
}

func TestForwardHopLimit(t *testing.T) {
	var calls atomic.Int32
	p := startPeer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	sign, err := peerauth.NewSigner(secret, peerauth.Options{})
	if err != nil {
		t.Fatal(err)
	}
	raw := forwardv1connect.NewForwardServiceClient(h2cClient(), "http://"+p.addr, connect.WithInterceptors(sign))
	req := connect.NewRequest(&forwardv1.ForwardRequest{Method: "GET", Path: "/", HopCount: 2})
	rs, err := raw.Forward(context.Background(), req)
	if err == nil {
		rs.Receive()
		err = rs.Err()
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("hop count 2: %v, want invalid argument", err)
	}
	if forward.Retryable(err) {
		t.Fatal("a hop-limit refusal must not be retried elsewhere")
	}
	if calls.Load() != 0 {
		t.Fatal("the local handler ran for a request over the hop limit")
	}
}

func TestForwardDrainRefusesNewWorkAndFinishesInFlight(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{})
	p := startPeer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		io.WriteString(w, "finished")
	}))
	c := newClient(t, secret)
	type result struct {
		body []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		// Forward returns once the response starts; the handler holds it.
		s1, err := c.Forward(context.Background(), p.addr, &forward.Request{Method: "GET", Path: "/slow"})
		if err != nil {
			done <- result{nil, err}
			return
		}
		defer s1.Close()
		h, err := s1.Head()
		if err != nil {
			done <- result{nil, err}
			return
		}
		var body bytes.Buffer
		for {
			chunk, _, err := s1.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				done <- result{body.Bytes(), err}
				return
			}
			body.Write(chunk)
		}
		_ = h
		done <- result{body.Bytes(), nil}
	}()
	<-started
	p.srv.SetDraining(true)
	if p.srv.InFlight() != 1 {
		t.Fatalf("in flight = %d, want 1", p.srv.InFlight())
	}
	s2, err := c.Forward(context.Background(), p.addr, &forward.Request{Method: "GET", Path: "/new"})
	if err == nil {
		defer s2.Close()
		_, err = s2.Head()
	}
	if !forward.IsDraining(err) || !forward.Retryable(err) || connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("new work while draining: %v, want a retryable draining refusal", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- p.srv.Wait(context.Background()) }()
	select {
	case <-waited:
		t.Fatal("Wait returned while a request was in flight")
	default:
	}
	close(release)
	r := <-done
	if r.err != nil || string(r.body) != "finished" {
		t.Fatalf("in-flight request: %q %v", r.body, r.err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
}

func TestForwardHandlerPanics(t *testing.T) {
	p := startPeer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/late" {
			io.WriteString(w, "partial")
			w.(http.Flusher).Flush()
		}
		panic("engine blew up")
	}))
	c := newClient(t, secret)
	s, err := c.Forward(context.Background(), p.addr, &forward.Request{Method: "GET", Path: "/early"})
	if err == nil {
		defer s.Close()
		_, err = s.Head()
	}
	if err == nil || forward.Retryable(err) {
		t.Fatalf("panic before the head: %v, want a non-retryable error", err)
	}
	s2, err := c.Forward(context.Background(), p.addr, &forward.Request{Method: "GET", Path: "/late"})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	_, body, trailer, err := readAll(t, s2)
	if err != nil {
		t.Fatal(err)
	}
	if string(body) != "partial" || !strings.Contains(trailer.Err, "engine blew up") {
		t.Fatalf("panic after the head: body %q trailer %+v", body, trailer)
	}
}

func TestForwardNoBodyStatuses(t *testing.T) {
	p := startPeer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
		if _, err := w.Write([]byte("x")); !errors.Is(err, http.ErrBodyNotAllowed) {
			panic("write on 204 did not fail")
		}
	}))
	s, err := newClient(t, secret).Forward(context.Background(), p.addr, &forward.Request{Method: "DELETE", Path: "/x"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	head, body, tr, err := readAll(t, s)
	if err != nil || head.Status != 204 || len(body) != 0 || tr.Err != "" {
		t.Fatalf("204: %+v %q %+v %v", head, body, tr, err)
	}
}

func TestForwardConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s, err := newClient(t, secret).Forward(context.Background(), addr, &forward.Request{Method: "GET", Path: "/"})
	if err == nil {
		defer s.Close()
		_, err = s.Head()
	}
	if !forward.IsRefused(err) || !forward.Retryable(err) {
		t.Fatalf("dialing a closed port: %v, want refused and retryable", err)
	}
}

func TestForwardOverH2C(t *testing.T) {
	next := make(chan struct{})
	p := startPeer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 1 {
			panic("the local handler must see a plain HTTP/1.1 request")
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		<-next
		io.WriteString(w, "data: two\n\n")
	}))
	c := newClientConfig(t, forward.ClientConfig{NodeID: "origin", ClusterSecret: secret, H2C: true})
	for i := 0; i < 3; i++ { // several calls share the multiplexed connection
		s, err := c.Forward(context.Background(), p.addr, &forward.Request{Method: "GET", Path: "/sse"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Head(); err != nil {
			t.Fatal(err)
		}
		chunk, flush, err := s.Next()
		if err != nil || string(chunk) != "data: one\n\n" || !flush {
			t.Fatalf("first event %q %v %v", chunk, flush, err)
		}
		next <- struct{}{}
		chunk, _, err = s.Next()
		if err != nil || string(chunk) != "data: two\n\n" {
			t.Fatalf("second event %q %v", chunk, err)
		}
		if _, _, err := s.Next(); err != io.EOF {
			t.Fatalf("end: %v", err)
		}
		s.Close()
	}
}

// TestForwardUnary checks what only the one-message call does: a handler's
// flushes do not send anything early, a response over the unary limit fails
// before any of it is sent, and refusals (secret, draining) are the
// stream's.
func TestForwardUnary(t *testing.T) {
	var calls atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		n := 10
		if r.URL.Path == "/big" {
			n = 3000
		}
		for range n {
			io.WriteString(w, "0123456789")
			w.(http.Flusher).Flush()
		}
	})
	p := startPeerConfig(t, forward.ServerConfig{NodeID: "srv", ClusterSecret: secret, ChunkSize: 16, MaxUnaryBytes: 20000}, h)
	srv, addr := p.srv, p.addr
	// The per-call path: ForwardUnary (mux_test.go covers the stream's).
	c := newClientConfig(t, forward.ClientConfig{NodeID: "origin", ClusterSecret: secret, MuxMaxBody: -1})

	s, err := c.Forward(context.Background(), addr, &forward.Request{Method: "GET", Path: "/small", Unary: true})
	if err != nil {
		t.Fatal(err)
	}
	head, err := s.Head()
	if err != nil || head.Status != 200 || head.Flush {
		t.Fatalf("head %+v, %v", head, err)
	}
	chunk, flush, err := s.Next()
	if err != nil || flush || string(chunk) != strings.Repeat("0123456789", 10) {
		t.Fatalf("one chunk with the whole body and no flush mark, got %q flush=%v err=%v", chunk, flush, err)
	}
	if _, _, err := s.Next(); err != io.EOF {
		t.Fatalf("after the body: %v, want EOF", err)
	}
	s.Close()

	// Over the unary limit the client asks again for a stream: the body
	// arrives whole and the handler ran twice.
	before := calls.Load()
	s, err = c.Forward(context.Background(), addr, &forward.Request{Method: "GET", Path: "/big", Unary: true})
	if err != nil {
		t.Fatal(err)
	}
	_, body, _, err := readAll(t, s)
	s.Close()
	if err != nil || string(body) != strings.Repeat("0123456789", 3000) {
		t.Fatalf("30000-byte body over a 20000-byte unary limit: %d bytes, %v", len(body), err)
	}
	if n := calls.Load() - before; n != 2 {
		t.Fatalf("handler ran %d times, want 2 (unary refused, then the stream)", n)
	}

	if _, err := newClient(t, "wrong").Forward(context.Background(), addr, &forward.Request{Method: "GET", Path: "/small", Unary: true}); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("wrong secret: %v", err)
	}
	before = calls.Load()
	srv.SetDraining(true)
	_, err = c.Forward(context.Background(), addr, &forward.Request{Method: "GET", Path: "/small", Unary: true})
	if !forward.IsDraining(err) || !forward.Retryable(err) {
		t.Fatalf("draining: %v, want a retryable draining refusal", err)
	}
	if calls.Load() != before {
		t.Fatal("the handler ran for a refused call")
	}
}

package forward_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/mesh/forward"
)

// muxClient is a client with its registry, to see which path calls took.
type muxClient struct {
	*forward.Client
	reg *prometheus.Registry
}

func newMuxClient(t *testing.T, cfg forward.ClientConfig) *muxClient {
	t.Helper()
	if cfg.NodeID == "" {
		cfg.NodeID = "origin"
	}
	if cfg.ClusterSecret == "" {
		cfg.ClusterSecret = secret
	}
	reg := prometheus.NewRegistry()
	c, err := forward.NewClient(cfg, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &muxClient{Client: c, reg: reg}
}

// muxCalls is how many calls went over a Multiplex stream.
func (c *muxClient) muxCalls(t *testing.T) float64 {
	t.Helper()
	mfs, err := c.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "infermesh_forward_client_mux_calls_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no infermesh_forward_client_mux_calls_total metric")
	return 0
}

// warm sends requests to addr until one goes over the stream (it opens in
// the background on first use). The 30 s limit is a hang guard.
func (c *muxClient) warm(t *testing.T, addr string) {
	t.Helper()
	before := c.muxCalls(t)
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
		s, err := c.Forward(context.Background(), addr, &forward.Request{Method: "GET", Path: "/warm", Unary: true})
		if err == nil {
			_, _, _, err = readAll(t, s)
			s.Close()
		}
		if err != nil {
			t.Fatalf("warm-up call: %v", err)
		}
		if c.muxCalls(t) > before {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the multiplexed stream never opened")
}

// echo answers with what it saw, streams when asked (?sse=n), and reports
// usage.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	info, _ := forward.InfoFrom(r.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Echo-Id", info.RequestID)
	w.Header().Add("X-Multi", "1")
	w.Header().Add("X-Multi", "2")
	w.(forward.UsageSetter).SetUsage(int64(len(b)), 7)
	if n := r.URL.Query().Get("sse"); n != "" {
		var k int
		fmt.Sscan(n, &k)
		for i := range k {
			fmt.Fprintf(w, "data: %d %s\n\n", i, r.Header.Get("X-Tag"))
			w.(http.Flusher).Flush()
		}
		return
	}
	if r.URL.Path == "/big" {
		w.Write(bytes.Repeat([]byte("x"), 200<<10))
		return
	}
	w.WriteHeader(http.StatusAccepted)
	fmt.Fprintf(w, `{"m":%q,"p":%q,"h":%q,"tag":%q,"body":%q,"caller":%q}`, r.Method, r.URL.RequestURI(), r.Host, r.Header.Get("X-Tag"), b, info.Caller.KeyID)
})

// answer is everything a client sees of one forwarded response.
type answer struct {
	status  int
	header  http.Header
	body    string
	trailer forward.Trailer
	flushes int
}

func call(t *testing.T, c *forward.Client, addr string, req *forward.Request) (answer, error) {
	t.Helper()
	s, err := c.Forward(context.Background(), addr, req)
	if err != nil {
		return answer{}, err
	}
	defer s.Close()
	h, err := s.Head()
	if err != nil {
		return answer{}, err
	}
	a := answer{status: h.Status, header: h.Header}
	var body strings.Builder
	for {
		chunk, flush, err := s.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return a, err
		}
		if flush {
			a.flushes++
		}
		body.Write(chunk)
	}
	a.body, a.trailer = body.String(), s.Trailer()
	return a, nil
}

// TestMultiplexSameAnswers sends many concurrent requests of every kind
// (plain, unary, streamed, large answers) over the stream and over calls of
// their own, and checks the answers match.
func TestMultiplexSameAnswers(t *testing.T) {
	p := startPeerConfig(t, forward.ServerConfig{NodeID: "srv", ClusterSecret: secret}, echo)
	mux := newMuxClient(t, forward.ClientConfig{})
	perCall := newMuxClient(t, forward.ClientConfig{MuxMaxBody: -1})
	mux.warm(t, p.addr)
	before := mux.muxCalls(t)

	const n = 200
	reqs := make([]*forward.Request, n)
	for i := range reqs {
		r := &forward.Request{Method: "POST", Path: fmt.Sprintf("/v1/x?i=%d", i), Host: "api.example",
			Header: http.Header{"X-Tag": {fmt.Sprint("t", i)}, "Content-Type": {"application/json"}},
			Body:   []byte(fmt.Sprintf(`{"n":%d}`, i)), Caller: forward.Caller{KeyID: fmt.Sprint("k", i)},
			RequestID: fmt.Sprint("r", i), Unary: i%2 == 0}
		switch i % 5 {
		case 1:
			r.Path, r.Unary = fmt.Sprintf("/v1/x?sse=%d", 1+i%4), false
		case 2:
			r.Path = "/big"
		}
		reqs[i] = r
	}
	got := [2][]answer{make([]answer, n), make([]answer, n)}
	for k, c := range []*muxClient{mux, perCall} {
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a, err := call(t, c.Client, p.addr, reqs[i])
				if err != nil {
					errs <- fmt.Errorf("request %d: %w", i, err)
				}
				got[k][i] = a
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	if m := mux.muxCalls(t) - before; m != n {
		t.Fatalf("%v of %d calls went over the stream", m, n)
	}
	if perCall.muxCalls(t) != 0 {
		t.Fatal("the per-call client used a stream")
	}
	for i := range n {
		a, b := got[0][i], got[1][i]
		if a.status != b.status || a.body != b.body || a.trailer != b.trailer || fmt.Sprint(a.header) != fmt.Sprint(b.header) {
			t.Fatalf("request %d: multiplexed %+v, per call %+v", i, a, b)
		}
		if !reqs[i].Unary && a.flushes != b.flushes {
			t.Fatalf("request %d: %d flushes multiplexed, %d per call", i, a.flushes, b.flushes)
		}
		if !strings.Contains(a.body, fmt.Sprint("t", i)) && reqs[i].Path != "/big" {
			t.Fatalf("request %d: answer %q is another request's", i, a.body)
		}
	}
}

// TestMultiplexLargeBodyTakesOwnCall checks that a body over MuxMaxBody
// does not travel on the stream.
func TestMultiplexLargeBodyTakesOwnCall(t *testing.T) {
	p := startPeerConfig(t, forward.ServerConfig{NodeID: "srv", ClusterSecret: secret}, echo)
	c := newMuxClient(t, forward.ClientConfig{MuxMaxBody: 1024})
	c.warm(t, p.addr)
	before := c.muxCalls(t)
	big := bytes.Repeat([]byte("y"), 1025)
	a, err := call(t, c.Client, p.addr, &forward.Request{Method: "POST", Path: "/v1/x", Body: big})
	if err != nil || !strings.Contains(a.body, string(big)) {
		t.Fatalf("large body: %v %.80q", err, a.body)
	}
	if c.muxCalls(t) != before {
		t.Fatal("a body over MuxMaxBody went over the stream")
	}
	if _, err := call(t, c.Client, p.addr, &forward.Request{Method: "POST", Path: "/v1/x", Body: big[:1024]}); err != nil {
		t.Fatal(err)
	}
	if c.muxCalls(t) != before+1 {
		t.Fatal("a body of MuxMaxBody did not go over the stream")
	}
}

// TestMultiplexPeerKilled kills the serving peer (every connection closed)
// while calls are on the stream: the calls it had not answered fail
// retryably (the dispatcher moves them to the next candidate), the one it
// had begun to answer fails mid-body (an error for the client, no retry).
func TestMultiplexPeerKilled(t *testing.T) {
	release := make(chan struct{})
	started := make(chan string, 16)
	p := startPeerConfig(t, forward.ServerConfig{NodeID: "srv", ClusterSecret: secret}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/warm" {
			return
		}
		if r.URL.Path == "/partial" {
			io.WriteString(w, "data: first\n\n")
			w.(http.Flusher).Flush()
		}
		started <- r.URL.Path
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	c := newMuxClient(t, forward.ClientConfig{})
	c.warm(t, p.addr)
	before := c.muxCalls(t)

	partial, err := c.Forward(context.Background(), p.addr, &forward.Request{Method: "GET", Path: "/partial"})
	if err != nil {
		t.Fatal(err)
	}
	defer partial.Close()
	if _, err := partial.Head(); err != nil {
		t.Fatal(err)
	}
	if chunk, _, err := partial.Next(); err != nil || string(chunk) != "data: first\n\n" {
		t.Fatalf("first chunk %q, %v", chunk, err)
	}
	var waiting []*forward.Stream
	for range 5 {
		s, err := c.Forward(context.Background(), p.addr, &forward.Request{Method: "GET", Path: "/pending"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		waiting = append(waiting, s)
	}
	for range 6 {
		<-started
	}
	if c.muxCalls(t)-before != 6 {
		t.Fatal("the calls did not go over the stream")
	}
	p.http.Close() // the peer dies: its connections close
	defer close(release)
	for i, s := range waiting {
		_, err := s.Head()
		if err == nil || !forward.Retryable(err) {
			t.Fatalf("unanswered call %d: %v, want a retryable failure", i, err)
		}
	}
	if _, _, err := partial.Next(); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("call answered in part: %v, want the body to fail", err)
	}
}

// TestMultiplexCancelReachesPeer checks that abandoning a call (the client
// went away) cancels the handler on the peer while the stream carries on.
func TestMultiplexCancelReachesPeer(t *testing.T) {
	canceled := make(chan struct{})
	started := make(chan struct{}, 1)
	p := startPeerConfig(t, forward.ServerConfig{NodeID: "srv", ClusterSecret: secret}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/wait" {
			return
		}
		started <- struct{}{}
		<-r.Context().Done()
		close(canceled)
	}))
	c := newMuxClient(t, forward.ClientConfig{})
	c.warm(t, p.addr)
	before := c.muxCalls(t)
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.Forward(ctx, p.addr, &forward.Request{Method: "GET", Path: "/wait"})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	cancel()
	if _, err := s.Head(); err == nil || forward.Retryable(err) {
		t.Fatalf("canceled call: %v, want a non-retryable cancellation", err)
	}
	s.Close()
	<-canceled // the handler saw its context end (the test hangs otherwise)
	if _, err := call(t, c.Client, p.addr, &forward.Request{Method: "GET", Path: "/after"}); err != nil {
		t.Fatalf("the stream after a cancel: %v", err)
	}
	if c.muxCalls(t)-before != 2 {
		t.Fatal("the calls did not go over the stream")
	}
}

// TestMultiplexDeadline checks that the caller's deadline reaches the peer.
func TestMultiplexDeadline(t *testing.T) {
	p := startPeerConfig(t, forward.ServerConfig{NodeID: "srv", ClusterSecret: secret}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dl, ok := r.Context().Deadline()
		fmt.Fprint(w, ok, time.Until(dl) > 0 && time.Until(dl) <= time.Hour)
	}))
	c := newMuxClient(t, forward.ClientConfig{})
	c.warm(t, p.addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	s, err := c.Forward(ctx, p.addr, &forward.Request{Method: "GET", Path: "/dl"})
	if err != nil {
		t.Fatal(err)
	}
	_, body, _, err := readAll(t, s)
	s.Close()
	if err != nil || string(body) != "true true" {
		t.Fatalf("deadline on the peer: %q, %v", body, err)
	}
}

// TestMultiplexDraining checks a draining peer's refusal over the stream is
// the per-call one (retryable, IsDraining) and that the handler never runs.
func TestMultiplexDraining(t *testing.T) {
	var runs atomic.Int32
	p := startPeerConfig(t, forward.ServerConfig{NodeID: "srv", ClusterSecret: secret}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
	}))
	c := newMuxClient(t, forward.ClientConfig{})
	c.warm(t, p.addr)
	before, n := c.muxCalls(t), runs.Load()
	p.srv.SetDraining(true)
	_, err := call(t, c.Client, p.addr, &forward.Request{Method: "GET", Path: "/x"})
	if !forward.IsDraining(err) || !forward.Retryable(err) {
		t.Fatalf("draining: %v", err)
	}
	if runs.Load() != n || c.muxCalls(t) != before+1 {
		t.Fatal("the refused call ran, or did not go over the stream")
	}
}

// freezer relays TCP connections to a target and, once frozen, stops
// carrying the clients' bytes (a peer that stopped reading: paused or cut
// off without a reset). Nothing written after freeze returns reaches the
// target: freeze interrupts reads in progress.
type freezer struct {
	ln     net.Listener
	frozen chan struct{}
	once   sync.Once

	mu    sync.Mutex
	conns []net.Conn
}

func startFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, frozen: make(chan struct{})}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c)
			f.mu.Unlock()
			go func() { io.Copy(c, s); c.Close() }()
			go func() {
				defer s.Close()
				buf := make([]byte, 32<<10)
				for {
					select {
					case <-f.frozen:
						<-done // hold the connection, read nothing more
						return
					default:
					}
					n, err := c.Read(buf)
					if errors.Is(err, os.ErrDeadlineExceeded) {
						continue // interrupted by freeze
					}
					// A read that was already past its deadline check when
					// freeze set the deadline can still return bytes the
					// client wrote after freeze returned (seen about once
					// in a hundred runs): frozen is closed by then, so
					// checking it again drops them.
					select {
					case <-f.frozen:
						<-done
						return
					default:
					}
					if n > 0 {
						if _, werr := s.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return f
}

func (f *freezer) freeze() {
	f.once.Do(func() {
		close(f.frozen)
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.conns {
			_ = c.SetReadDeadline(time.Now())
		}
	})
}

// TestMultiplexStalledWritesEndTheStream freezes the path to the peer
// while calls with large bodies fill the stream's window: once callers
// give up, the stream ends and every caller, the one stuck writing
// included, gets an error instead of waiting for pings (set to an hour
// here, so only the stall rule can release them).
func TestMultiplexStalledWritesEndTheStream(t *testing.T) {
	p := startPeerConfig(t, forward.ServerConfig{NodeID: "srv", ClusterSecret: secret}, echo)
	f := startFreezer(t, p.addr)
	addr := f.ln.Addr().String()
	c := newMuxClient(t, forward.ClientConfig{PingAfter: time.Hour, PingTimeout: time.Hour, MuxPingAfter: time.Hour, MuxPingTimeout: time.Hour})
	c.warm(t, addr)
	f.freeze()

	const n = 40 // 40 × 60 KiB is more than the peer's 1 MiB stream window
	body := bytes.Repeat([]byte("z"), 60<<10)
	ctx, cancel := context.WithCancel(context.Background())
	sent := make(chan struct{}, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			s, err := c.Forward(ctx, addr, &forward.Request{Method: "POST", Path: "/v1/x", Body: body})
			sent <- struct{}{}
			if err == nil {
				_, err = s.Head()
				s.Close()
			}
			errs <- err
		}()
	}
	// All but the caller stuck writing for everyone hand their frames
	// over and return from Forward.
	for range n - 1 {
		<-sent
	}
	select {
	case <-sent:
		t.Fatal("no write stalled: the frozen path took every frame")
	default:
	}
	// Give up on them all (and keep giving up on new calls, each from a
	// goroutine of its own, which may become the stuck writer too) until
	// the stalled writer is released. The 30 s limit is a hang guard.
	cancel()
	got := 0
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for limit := time.After(30 * time.Second); got < n; {
		select {
		case err := <-errs:
			if err == nil {
				t.Fatal("a call through a frozen path succeeded")
			}
			got++
		case <-tick.C:
			go func() {
				cctx, ccancel := context.WithCancel(context.Background())
				ccancel()
				if s, err := c.Forward(cctx, addr, &forward.Request{Method: "GET", Path: "/x"}); err == nil {
					s.Close()
				}
			}()
		case <-limit:
			t.Fatalf("%d of %d callers still stuck behind a stalled write", n-got, n)
		}
	}
}

// TestMultiplexStuckSenderHonoursItsContext: the caller that is itself
// the stream's writer, blocked on a peer that stopped reading (as in a
// partition), returns once its own context ends while no other caller
// gives up: the stalled write ends the stream and every call fails
// retryably. (Before, only another caller's abandonment armed the stall
// check, so a stuck writer hung until the client's own timeout.)
func TestMultiplexStuckSenderHonoursItsContext(t *testing.T) {
	p := startPeerConfig(t, forward.ServerConfig{NodeID: "srv", ClusterSecret: secret}, echo)
	f := startFreezer(t, p.addr)
	addr := f.ln.Addr().String()
	c := newMuxClient(t, forward.ClientConfig{PingAfter: time.Hour, PingTimeout: time.Hour, MuxPingAfter: time.Hour, MuxPingTimeout: time.Hour})
	c.warm(t, addr)
	f.freeze()

	const n = 40 // 40 × 60 KiB is more than the peer's 1 MiB stream window
	body := bytes.Repeat([]byte("z"), 60<<10)
	ctxs := make([]context.Context, n)
	cancels := make([]context.CancelFunc, n)
	for i := range n {
		ctxs[i], cancels[i] = context.WithCancel(context.Background())
		defer cancels[i]()
	}
	sent := make(chan int, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			s, err := c.Forward(ctxs[i], addr, &forward.Request{Method: "POST", Path: "/v1/x", Body: body})
			sent <- i
			if err == nil {
				_, err = s.Head()
				s.Close()
			}
			errs <- err
		}()
	}
	returned := make([]bool, n)
	for range n - 1 {
		returned[<-sent] = true
	}
	select {
	case <-sent:
		t.Fatal("no write stalled: the frozen path took every frame")
	default:
	}
	// Only the stuck writer gives up.
	for i, ok := range returned {
		if !ok {
			cancels[i]()
		}
	}
	awaitFailures(t, errs, n, false, "callers still stuck behind a stalled write")
}

// TestMultiplexSilentPeerFailsCallsRetryably: calls waiting on the stream
// of a peer that went silent (a partition: nothing is closed, nothing
// answers) fail retryably once the stream's connection misses its ping,
// so the dispatcher moves them to the next candidate. Before, the stream
// shared the 10 s + 5 s pings of the per-call connections, and requests
// forwarded just as a partition began outlived the client's timeout
// (the secured chaos suite's minority-partition and split-writes). The
// writes here are small, so the stalled-write rule plays no part; the
// per-call pings are set to an hour.
func TestMultiplexSilentPeerFailsCallsRetryably(t *testing.T) {
	p := startPeerConfig(t, forward.ServerConfig{NodeID: "srv", ClusterSecret: secret}, echo)
	f := startFreezer(t, p.addr)
	addr := f.ln.Addr().String()
	c := newMuxClient(t, forward.ClientConfig{PingAfter: time.Hour, PingTimeout: time.Hour,
		MuxPingAfter: 200 * time.Millisecond, MuxPingTimeout: 500 * time.Millisecond})
	c.warm(t, addr)
	f.freeze()

	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() {
			s, err := c.Forward(context.Background(), addr, &forward.Request{Method: "POST", Path: "/v1/x", Body: []byte("small")})
			if err == nil {
				_, err = s.Head()
				s.Close()
			}
			errs <- err
		}()
	}
	awaitFailures(t, errs, n, true, "calls still wait on a silent peer")
}

// awaitFailures reads n call results from errs: every call through the
// frozen path must fail (retryably, with retryable set). stuck describes
// the calls that have not answered when the hang guard fires.
func awaitFailures(t *testing.T, errs <-chan error, n int, retryable bool, stuck string) {
	t.Helper()
	limit := time.After(30 * time.Second) // a hang guard, not a timing assertion
	for got := 0; got < n; got++ {
		select {
		case err := <-errs:
			if err == nil {
				t.Fatal("a call through a frozen path succeeded")
			}
			if retryable && !forward.Retryable(err) {
				t.Fatalf("call through a frozen path failed with a final error: %v", err)
			}
		case <-limit:
			t.Fatalf("%d of %d %s", n-got, n, stuck)
		}
	}
}

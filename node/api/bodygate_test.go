package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// gateServer serves gated bodies; the client address the gate charges is
// the request's X-Test-Addr header.
func gateServer(t *testing.T, lim BodyLimits) (*httptest.Server, *Server) {
	s := &Server{opt: Options{Clock: time.Now}, metrics: newMetrics(prometheus.NewRegistry())}
	s.bodyLim = lim.withDefaults()
	s.bodies = newBodyBudget(s.bodyLim)
	h := s.gateBodies(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := readBody(r, MaxImageBody); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	addr := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxClientAddr, r.Header.Get("X-Test-Addr"))))
	})
	srv := httptest.NewServer(addr)
	t.Cleanup(srv.Close)
	return srv, s
}

// A body that stops arriving is answered 408 once the minimum rate says
// it is overdue; its budget is returned.
func TestGateCutsStalledBody(t *testing.T) {
	srv, s := gateServer(t, BodyLimits{Grace: 200 * time.Millisecond, MinRate: 1 << 20})
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
	c.SetReadDeadline(time.Now().Add(time.Minute)) // hang guard
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.Contains(line, "408") {
		t.Fatalf("stalled body: %q %v, want 408", line, err)
	}
	if n := s.bodies.inUse(); n != 0 {
		t.Fatalf("%d bytes still charged after the request", n)
	}
}

// post sends body from client address addr and returns the status and
// error code.
func post(t *testing.T, url, addr string, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("X-Test-Addr", addr)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Error.Code
}

// A body that would cross what the node-wide budget has left is refused
// 503 with Retry-After while it arrives; a body that fits is served.
func TestGateRefusesOverBudget(t *testing.T) {
	srv, s := gateServer(t, BodyLimits{Budget: 2 << 20, Share: 2 << 20})
	if err := s.bodies.take(1<<20, []string{"other"}); err != nil { // another request holds half
		t.Fatal(err)
	}
	if code, _ := post(t, srv.URL, "a", strings.Repeat("a", 1<<20+1)); code != 503 {
		t.Fatalf("over budget: %d, want 503", code)
	}
	if code, _ := post(t, srv.URL, "a", strings.Repeat("a", 1000)); code != 204 {
		t.Fatalf("within budget: %d", code)
	}
	if n := s.bodies.inUse(); n != 1<<20 {
		t.Fatalf("budget holds %d, want only the other request's %d", n, 1<<20)
	}
}

// One client address holding its whole share gets 429
// body_share_exceeded for more; another address is served meanwhile.
func TestGateKeepsSharesPerHolder(t *testing.T) {
	srv, s := gateServer(t, BodyLimits{Budget: 4 << 20, Share: 1 << 20})
	if err := s.bodies.take(1<<20-10, []string{"client address greedy"}); err != nil {
		t.Fatal(err)
	}
	if code, c := post(t, srv.URL, "greedy", strings.Repeat("a", 100)); code != 429 || c != "body_share_exceeded" {
		t.Fatalf("greedy address over its share: %d %s, want 429 body_share_exceeded", code, c)
	}
	if code, c := post(t, srv.URL, "other", strings.Repeat("a", 2<<20)); code != 429 || c != "body_share_exceeded" {
		t.Fatalf("one body larger than a share: %d %s, want 429 body_share_exceeded", code, c)
	}
	if code, _ := post(t, srv.URL, "other", strings.Repeat("a", 1<<19)); code != 204 {
		t.Fatalf("other address within its share: %d, want 204", code)
	}
	if n := s.bodies.inUse(); n != 1<<20-10 {
		t.Fatalf("budget holds %d after the requests, want %d", n, 1<<20-10)
	}
}

// Connections that only declare large bodies hold nothing of the budget,
// and other requests are served meanwhile.
func TestGateDeclaredLengthReservesNothing(t *testing.T) {
	srv, s := gateServer(t, BodyLimits{Budget: 64 << 20})
	for i := 0; i < 16; i++ {
		c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nX-Test-Addr: greedy\r\nContent-Length: %d\r\n\r\n", 32<<20)
	}
	for i := 0; i < 5; i++ {
		if code, _ := post(t, srv.URL, "other", strings.Repeat("a", 1<<20)); code != 204 {
			t.Fatalf("request %d beside 16 declared 32 MiB bodies: %d, want 204", i, code)
		}
	}
	if n := s.bodies.inUse(); n != 0 {
		t.Fatalf("declared-only bodies hold %d bytes of the budget", n)
	}
}

// A body that arrives fast and then stalls is cut Grace after its last
// byte, however much of it arrived (the rate deadline alone would give a
// large body minutes).
func TestGateCutsLateStallFromLastProgress(t *testing.T) {
	srv, s := gateServer(t, BodyLimits{Grace: 300 * time.Millisecond, MinRate: 1})
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", 4<<20)
	c.Write([]byte(strings.Repeat("a", 2<<20)))
	c.SetReadDeadline(time.Now().Add(time.Minute)) // hang guard: the rate deadline is weeks away
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.Contains(line, "408") {
		t.Fatalf("stalled body: %q %v, want 408", line, err)
	}
	if n := s.bodies.inUse(); n != 0 {
		t.Fatalf("%d bytes still charged after the request", n)
	}
}

// A body read to its end lifts the deadline: a handler that keeps working
// long after the body's due time keeps its request context.
func TestGateLiftsDeadlineAfterBody(t *testing.T) {
	s := &Server{opt: Options{Clock: time.Now}, metrics: newMetrics(prometheus.NewRegistry())}
	s.bodyLim = BodyLimits{Grace: 50 * time.Millisecond, MinRate: 1 << 30}.withDefaults()
	s.bodies = newBodyBudget(s.bodyLim)
	srv := httptest.NewServer(s.gateBodies(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := readBody(r, MaxJSONBody); err != nil {
			writeErr(w, err)
			return
		}
		time.Sleep(300 * time.Millisecond) // well past the body's due time
		if err := r.Context().Err(); err != nil {
			w.WriteHeader(http.StatusGone)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})))
	defer srv.Close()
	for _, body := range []string{"{}", strings.Repeat("x", 100000)} {
		resp, err := http.Post(srv.URL, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 204 {
			t.Fatalf("%d-byte body: status %d, want 204 (context kept)", len(body), resp.StatusCode)
		}
	}
}

// inUse reports the bytes the budget holds now.
func (b *bodyBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

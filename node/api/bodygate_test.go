package api

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func gateServer(t *testing.T, lim BodyLimits) (*httptest.Server, *Server) {
	s := &Server{opt: Options{Clock: time.Now}, metrics: newMetrics(prometheus.NewRegistry())}
	s.bodyLim = lim.withDefaults()
	s.bodies = &bodyBudget{max: s.bodyLim.Budget}
	h := s.gateBodies(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := readBody(r, MaxImageBody); err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	srv := httptest.NewServer(h)
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

// A declared length over what the budget has left is refused 503 with
// Retry-After before the body is read; a body that fits is served.
func TestGateRefusesOverBudget(t *testing.T) {
	srv, s := gateServer(t, BodyLimits{Budget: 2 << 20})
	s.bodies.take(1 << 20) // another request holds half
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(strings.Repeat("a", 1<<20+1)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("over budget: %d retry-after %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	resp, err = http.Post(srv.URL, "application/json", strings.NewReader(strings.Repeat("a", 1000)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 {
		t.Fatalf("within budget: %d", resp.StatusCode)
	}
	if n := s.bodies.inUse(); n != 1<<20 {
		t.Fatalf("budget holds %d, want only the other request's %d", n, 1<<20)
	}
}

// A body read to its end lifts the deadline: a handler that keeps working
// long after the body's due time keeps its request context.
func TestGateLiftsDeadlineAfterBody(t *testing.T) {
	s := &Server{opt: Options{Clock: time.Now}, metrics: newMetrics(prometheus.NewRegistry())}
	s.bodyLim = BodyLimits{Grace: 50 * time.Millisecond, MinRate: 1 << 30}.withDefaults()
	s.bodies = &bodyBudget{max: s.bodyLim.Budget}
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

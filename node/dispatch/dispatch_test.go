package dispatch_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infermesh/infermesh/consensus/routing"
	"github.com/infermesh/infermesh/mesh"
	"github.com/infermesh/infermesh/mesh/meshtest"
	"github.com/infermesh/infermesh/mesh/route"
	"github.com/infermesh/infermesh/node/dispatch"
)

var three = []string{"n1", "n2", "n3"}

func TestForwardsToTheNodeThatHasTheModel(t *testing.T) {
	c := start(t, spec{
		ids:    three,
		models: map[string][]string{"n1": {"local-only"}, "n2": {"m"}, "n3": {"other"}},
		engine: echo,
	})
	for _, from := range three {
		resp, body := c.send(t, from, "m", "k", "hello")
		if resp.StatusCode != 200 || resp.Header.Get(dispatch.BackendHeader) != "n2" {
			t.Fatalf("from %s: %d backend %q", from, resp.StatusCode, resp.Header.Get(dispatch.BackendHeader))
		}
		// The client gets the serving node's bytes; the client's bearer key
		// does not travel to the peer.
		if want := `n2 served POST /v1/test?x=1 auth="" body=hello`; body != want && from != "n2" {
			t.Fatalf("from %s: body %q, want %q", from, body, want)
		}
		o := c.nodes[from].lastOutcome()
		if o.Backend != "n2" || o.Forwarded != (from != "n2") || o.Usage.PromptTokens != 5 || o.Usage.CompletionTokens != 7 || o.Err != nil {
			t.Fatalf("from %s: outcome %+v", from, o)
		}
	}
	if got := c.nodes["n2"].calls.Load(); got != 3 {
		t.Fatalf("n2 served %d requests, want 3", got)
	}
	resp, _ := c.send(t, "n2", "local-only", "k", "x")
	if resp.Header.Get(dispatch.BackendHeader) != "n1" {
		t.Fatalf("local-only model served by %q", resp.Header.Get(dispatch.BackendHeader))
	}
	// A request tied to no model is served where it arrived.
	resp, _ = c.send(t, "n3", "", "k", "x")
	if resp.Header.Get(dispatch.BackendHeader) != "n3" {
		t.Fatalf("model-less request served by %q", resp.Header.Get(dispatch.BackendHeader))
	}
	// A model nobody has goes to the local handler, which answers.
	resp, body := c.send(t, "n3", "missing", "k", "x")
	if resp.Header.Get(dispatch.BackendHeader) != "n3" || !strings.HasPrefix(body, "n3 served") {
		t.Fatalf("unknown model: backend %q body %q", resp.Header.Get(dispatch.BackendHeader), body)
	}
}

func TestStreamArrivesChunkByChunkThroughAForwardingNode(t *testing.T) {
	next := make(chan struct{})
	c := start(t, spec{
		ids:    []string{"n1", "n2"},
		models: map[string][]string{"n2": {"chat"}},
		engine: func(n *tnode) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				for i := 1; i <= 3; i++ {
					fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
					w.(http.Flusher).Flush()
					<-next // event i+1 is not written until the client has read event i
				}
				fmt.Fprint(w, "data: [DONE]\n\n")
			})
		},
	})
	req, _ := http.NewRequest("POST", c.nodes["n1"].front.URL+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
	req.Header.Set("X-Model", "chat")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get(dispatch.BackendHeader) != "n2" || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("headers %v", resp.Header)
	}
	rd := bufio.NewReader(resp.Body)
	for i := 1; i <= 3; i++ {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("data: {\"n\":%d}\n", i); line != want {
			t.Fatalf("event %d: %q, want %q", i, line, want)
		}
		if blank, _ := rd.ReadString('\n'); blank != "\n" {
			t.Fatalf("event %d not terminated: %q", i, blank)
		}
		next <- struct{}{}
	}
	rest, err := io.ReadAll(rd)
	if err != nil || string(rest) != "data: [DONE]\n\n" {
		t.Fatalf("rest %q %v", rest, err)
	}
}

func TestFailoverOnDeadPeerEjectsIt(t *testing.T) {
	c := start(t, spec{
		ids:    three,
		models: map[string][]string{"n2": {"m"}, "n3": {"m"}},
		policy: dispatch.Policy{Strategy: route.Sticky},
		engine: echo,
	})
	key := keyFor(t, "n2", "n2", "n3")
	sub := c.nodes["n1"].Mesh.Subscribe(mesh.EventUpdate)
	defer sub.Close()
	c.nodes["n2"].Kill() // n1 still believes n2 is ready until memberlist notices
	resp, body := c.send(t, "n1", "m", key, "x")
	if resp.StatusCode != 200 || resp.Header.Get(dispatch.BackendHeader) != "n3" || !strings.HasPrefix(body, "n3 served") {
		t.Fatalf("after n2 died: %d %q %q", resp.StatusCode, resp.Header.Get(dispatch.BackendHeader), body)
	}
	if o := c.nodes["n1"].lastOutcome(); o.Attempts != 2 {
		t.Fatalf("attempts %d, want 2", o.Attempts)
	}
	// The ejection happened during the request, before memberlist could
	// declare n2 dead: the first event about n2 is its ejection.
	for e := range sub.C {
		if e.Peer.ID == "n2" && !e.Peer.Ejected {
			t.Fatalf("first event about n2 is not its ejection: %+v", e)
		}
		if e.Peer.ID == "n2" && e.Peer.Ejected {
			break
		}
	}
	// While ejected, n2 is not tried at all.
	c.send(t, "n1", "m", key, "y")
	if o := c.nodes["n1"].lastOutcome(); o.Attempts != 1 || o.Backend != "n3" {
		t.Fatalf("ejected peer still tried: %+v", o)
	}
}

func TestRetryableStatusesFailOverAndTheLastPassesThrough(t *testing.T) {
	for _, status := range []int{502, 503, 504} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			c := start(t, spec{
				ids:    three,
				models: map[string][]string{"n1": {"m"}, "n2": {"m"}, "n3": {"m"}},
				policy: dispatch.Policy{Strategy: route.Sticky},
				engine: func(n *tnode) http.Handler {
					if n.ID == "n3" {
						return echo(n)
					}
					return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						w.Header().Set("X-Failed-On", n.ID)
						http.Error(w, "busy", status)
					})
				},
			})
			// n1 (local) first, then n2 (remote); both fail, n3 serves.
			key := ""
			for i := 0; key == ""; i++ {
				k := fmt.Sprint("k", i)
				r := route.Rank(route.Sticky, route.Facts{Model: "m", Caller: "key:" + k}, []route.Peer{
					{ID: "n1", Health: route.HealthReady, Models: map[string]route.Model{"m": {Warm: true}}},
					{ID: "n2", Health: route.HealthReady, Models: map[string]route.Model{"m": {Warm: true}}},
					{ID: "n3", Health: route.HealthReady, Models: map[string]route.Model{"m": {Warm: true}}},
				})
				if r.Candidates[0].ID == "n1" && r.Candidates[1].ID == "n2" {
					key = k
				}
			}
			resp, body := c.send(t, "n1", "m", key, "x")
			if resp.StatusCode != 200 || resp.Header.Get(dispatch.BackendHeader) != "n3" || resp.Header.Get("X-Failed-On") != "" {
				t.Fatalf("got %d from %q (%q), body %q", resp.StatusCode, resp.Header.Get(dispatch.BackendHeader), resp.Header.Get("X-Failed-On"), body)
			}
			if o := c.nodes["n1"].lastOutcome(); o.Attempts != 3 {
				t.Fatalf("attempts %d, want 3", o.Attempts)
			}
			// When every candidate answers with that status, the last answer
			// reaches the client verbatim.
			c.nodes["n3"].Kill()
			meshtest.WaitFor(t, c.nodes["n1"].Node, "n3 gone", func(ps []route.Peer) bool { return len(ps) == 2 })
			resp, body = c.send(t, "n1", "m", key, "x")
			if resp.StatusCode != status || body != "busy\n" || resp.Header.Get("X-Failed-On") != "n2" || resp.Header.Get(dispatch.BackendHeader) != "n2" {
				t.Fatalf("last candidate: %d %q failed-on %q backend %q", resp.StatusCode, body, resp.Header.Get("X-Failed-On"), resp.Header.Get(dispatch.BackendHeader))
			}
		})
	}
}

func TestClientErrorsPassThroughOnce(t *testing.T) {
	c := start(t, spec{
		ids:    three,
		models: map[string][]string{"n2": {"m"}, "n3": {"m"}},
		policy: dispatch.Policy{Strategy: route.Sticky},
		engine: func(n *tnode) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("X-Node", n.ID)
				w.WriteHeader(http.StatusBadRequest)
				io.WriteString(w, `{"error":{"message":"bad input","type":"invalid_request_error"}}`)
			})
		},
	})
	key := keyFor(t, "n2", "n2", "n3")
	resp, body := c.send(t, "n1", "m", key, "x")
	if resp.StatusCode != 400 || body != `{"error":{"message":"bad input","type":"invalid_request_error"}}` ||
		resp.Header.Get("X-Node") != "n2" || resp.Header.Get(dispatch.BackendHeader) != "n2" {
		t.Fatalf("4xx: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if n2, n3 := c.nodes["n2"].calls.Load(), c.nodes["n3"].calls.Load(); n2 != 1 || n3 != 0 {
		t.Fatalf("engine calls n2=%d n3=%d, want 1 and 0", n2, n3)
	}
}

func TestDrainingPeerRefusesAndRequestMovesOn(t *testing.T) {
	c := start(t, spec{
		ids:    three,
		models: map[string][]string{"n2": {"m"}, "n3": {"m"}},
		policy: dispatch.Policy{Strategy: route.Sticky},
		engine: echo,
	})
	key := keyFor(t, "n2", "n2", "n3")
	c.nodes["n2"].Forward.SetDraining(true) // before gossip says so
	resp, _ := c.send(t, "n1", "m", key, "x")
	if resp.StatusCode != 200 || resp.Header.Get(dispatch.BackendHeader) != "n3" {
		t.Fatalf("draining peer: %d from %q", resp.StatusCode, resp.Header.Get(dispatch.BackendHeader))
	}
	if c.nodes["n2"].calls.Load() != 0 {
		t.Fatal("a draining node served new forwarded work")
	}
	if p, _ := c.nodes["n1"].Mesh.Peer("n2"); p.Ejected {
		t.Fatal("a draining peer was ejected; only refused connections eject")
	}
}

func TestWrongClusterSecretIsRefusedAndRoutedAround(t *testing.T) {
	c := start(t, spec{
		ids:       three,
		models:    map[string][]string{"n2": {"m"}, "n3": {"m"}},
		policy:    dispatch.Policy{Strategy: route.Sticky},
		engine:    echo,
		secretFor: func(id string) string { return map[string]string{"n2": "a-different-secret"}[id] },
	})
	key := keyFor(t, "n2", "n2", "n3")
	resp, _ := c.send(t, "n1", "m", key, "x")
	if resp.StatusCode != 200 || resp.Header.Get(dispatch.BackendHeader) != "n3" {
		t.Fatalf("got %d from %q", resp.StatusCode, resp.Header.Get(dispatch.BackendHeader))
	}
	if c.nodes["n2"].calls.Load() != 0 {
		t.Fatal("a node served a call with the wrong cluster secret")
	}
	if o := c.nodes["n1"].lastOutcome(); o.Attempts != 2 || o.Err != nil {
		t.Fatalf("outcome %+v", c.nodes["n1"].lastOutcome())
	}
}

func TestForwardedRequestIsNeverForwardedAgain(t *testing.T) {
	// n2's forward server replays into a chain that (wrongly) routes again;
	// the forwarded request must still be served on n2 although only n3 has
	// the model.
	c := start(t, spec{
		ids:    three,
		models: map[string][]string{"n2": {"m"}, "n3": {"m", "only-n3"}},
		engine: echo,
		chain: func(n *tnode) http.Handler {
			if n.ID != "n2" {
				return nil
			}
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				n.d.Serve(w, r, dispatch.Facts{Model: r.Header.Get("X-Model")}, body)
			})
		},
	})
	s, err := c.nodes["n1"].Client.Forward(meshtest.Context(t), c.nodes["n2"].RPCAddr, forwardRequest{model: "only-n3"}.req())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	head, err := s.Head()
	if err != nil {
		t.Fatal(err)
	}
	if c.nodes["n3"].calls.Load() != 0 || c.nodes["n2"].calls.Load() != 1 {
		t.Fatalf("a forwarded request was forwarded again (n2 %d, n3 %d calls)", c.nodes["n2"].calls.Load(), c.nodes["n3"].calls.Load())
	}
	if head.Header.Get(dispatch.BackendHeader) != "n2" {
		t.Fatalf("served by %q, want n2", head.Header.Get(dispatch.BackendHeader))
	}
}

func TestAllSaturatedAnswers503WithRetryAfter(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	c := start(t, spec{
		ids:     []string{"n1"},
		models:  map[string][]string{"n1": {"m"}},
		maxInFl: 1,
		engine: func(n *tnode) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				entered <- struct{}{}
				<-release
				io.WriteString(w, "done")
			})
		},
	})
	first := make(chan int, 1)
	go func() {
		resp, _ := c.send(t, "n1", "m", "a", "x")
		first <- resp.StatusCode
	}()
	<-entered
	resp, body := c.send(t, "n1", "m", "b", "x")
	if resp.StatusCode != 503 {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || ra < 1 {
		t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
	if !strings.Contains(body, `"type":"service_unavailable"`) {
		t.Fatalf("body %q", body)
	}
	if o := c.nodes["n1"].lastOutcome(); !o.Saturated || o.Backend != "" {
		t.Fatalf("outcome %+v", o)
	}
	close(release)
	if s := <-first; s != 200 {
		t.Fatalf("the admitted request got %d", s)
	}
	if got := c.nodes["n1"].calls.Load(); got != 1 {
		t.Fatalf("engine ran %d times, want 1", got)
	}
}

func TestServingNodeEnforcesItsCap(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	c := start(t, spec{
		ids:    three,
		models: map[string][]string{"n2": {"m"}, "n3": {"m"}},
		policy: dispatch.Policy{Strategy: route.Sticky, Nodes: map[string]routing.Node{"n2": {InflightCap: 1}}},
		engine: func(n *tnode) http.Handler {
			if n.ID == "n3" {
				return echo(n)
			}
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				entered <- struct{}{}
				<-release
			})
		},
	})
	key := keyFor(t, "n2", "n2", "n3")
	done := make(chan struct{})
	go func() {
		c.send(t, "n2", "m", key, "x") // occupies n2's only slot, locally
		close(done)
	}()
	<-entered
	// A forwarded request reaching n2 now is refused at n2's cap.
	s, err := c.nodes["n1"].Client.Forward(meshtest.Context(t), c.nodes["n2"].RPCAddr, forwardRequest{model: "m"}.req())
	if err != nil {
		t.Fatal(err)
	}
	head, err := s.Head()
	s.Close()
	if err != nil || head.Status != 503 || head.Header.Get("Retry-After") == "" {
		t.Fatalf("n2 at its cap answered %+v %v, want 503 with Retry-After", head, err)
	}
	// Through dispatch: n1 may or may not have heard of n2's load yet;
	// either it skips n2, or n2 refuses and n1 fails over. Both end on n3.
	resp, _ := c.send(t, "n1", "m", key, "y")
	if resp.StatusCode != 200 || resp.Header.Get(dispatch.BackendHeader) != "n3" {
		t.Fatalf("got %d from %q", resp.StatusCode, resp.Header.Get(dispatch.BackendHeader))
	}
	close(release)
	<-done
	if got := c.nodes["n2"].calls.Load(); got != 1 {
		t.Fatalf("n2's engine ran %d times, want 1", got)
	}
}

func TestFailureAfterTheHeadIsReported(t *testing.T) {
	c := start(t, spec{
		ids:    []string{"n1", "n2"},
		models: map[string][]string{"n2": {"m"}},
		engine: func(n *tnode) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "partial")
				w.(http.Flusher).Flush()
				panic("engine failed mid-stream")
			})
		},
	})
	// A stream: the head and "partial" reached the client before the
	// failure, so the client sees an incomplete body, never a retry.
	resp, body := c.send(t, "n1", "m", "k", `{"stream":true}`)
	if resp.StatusCode != 200 || body != "partial" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	o := c.nodes["n1"].lastOutcome()
	if !errors.Is(o.Err, dispatch.ErrIncomplete) || !strings.Contains(o.Err.Error(), "engine failed mid-stream") || o.Attempts != 1 {
		t.Fatalf("outcome %+v", o)
	}
	if c.nodes["n2"].calls.Load() != 1 {
		t.Fatal("a request was retried after its head reached the client")
	}
	// One piece: nothing left the serving node before the failure, so the
	// client gets a clean 502 instead of a cut body, and it is not retried.
	resp, body = c.send(t, "n1", "m", "k", "x")
	if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, "partial") {
		t.Fatalf("one-piece failure: %d %q", resp.StatusCode, body)
	}
	if o := c.nodes["n1"].lastOutcome(); o.Status != http.StatusBadGateway || errors.Is(o.Err, dispatch.ErrIncomplete) {
		t.Fatalf("one-piece outcome %+v", o)
	}
	if c.nodes["n2"].calls.Load() != 2 {
		t.Fatal("a failed one-piece request was retried")
	}
}

func TestInFlightIsTrackedAndGossiped(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 3)
	c := start(t, spec{
		ids:    []string{"n1", "n2"},
		models: map[string][]string{"n2": {"m"}},
		engine: func(n *tnode) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				entered <- struct{}{}
				<-release
			})
		},
	})
	done := make(chan struct{}, 3)
	for i := 0; i < 3; i++ {
		go func() {
			c.send(t, "n1", "m", fmt.Sprint(i), "x")
			done <- struct{}{}
		}()
	}
	for i := 0; i < 3; i++ {
		<-entered
	}
	if got := c.nodes["n2"].d.InFlight(); got != 3 {
		t.Fatalf("n2 in flight = %d, want 3", got)
	}
	meshtest.WaitFor(t, c.nodes["n1"].Node, "n2's in-flight count", func(ps []route.Peer) bool {
		for _, p := range ps {
			if p.ID == "n2" {
				return p.InFlight == 3
			}
		}
		return false
	})
	close(release)
	for i := 0; i < 3; i++ {
		<-done
	}
	if got := c.nodes["n2"].d.InFlight(); got != 0 {
		t.Fatalf("n2 in flight after = %d", got)
	}
	meshtest.WaitFor(t, c.nodes["n1"].Node, "n2's latency for m", func(ps []route.Peer) bool {
		for _, p := range ps {
			if p.ID == "n2" {
				return p.InFlight == 0 && p.Models["m"].Latency > 0
			}
		}
		return false
	})
}

// TestAttemptAbandonedWhenPeerLeavesRouting: a forwarded attempt waiting for
// its head is abandoned when gossip stops listing the peer as routable (a
// partitioned or paused peer looks like this), and the request moves on to
// the next holder instead of waiting for the client's timeout.
func TestAttemptAbandonedWhenPeerLeavesRouting(t *testing.T) {
	entered := make(chan struct{}, 16)
	c := start(t, spec{
		ids:    three,
		models: map[string][]string{"n2": {"m"}, "n3": {"m"}},
		engine: func(n *tnode) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if n.ID == "n2" {
					entered <- struct{}{}
					<-r.Context().Done() // never answers; ends when the caller gives up
					return
				}
				fmt.Fprintf(w, "%s served", n.ID)
			})
		},
	})
	type result struct {
		backend, body string
		err           error
	}
	// Send until an attempt lands on n2 first (round-robin alternates).
	for try := 0; try < 10; try++ {
		done := make(chan result, 1)
		go func() {
			// The 60 s bound is a hang guard (a regression would
			// otherwise wait for the suite's timeout), not a timing
			// expectation.
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", c.nodes["n1"].front.URL+"/v1/test", strings.NewReader("x"))
			req.Header.Set("X-Model", "m")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- result{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			done <- result{resp.Header.Get(dispatch.BackendHeader), string(b), err}
		}()
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.backend != "n3" {
				t.Fatalf("served by %q: %q", r.backend, r.body)
			}
			continue // n3 came first; try again
		case <-entered:
		}
		// n2 holds the attempt. It stops being routable.
		c.nodes["n2"].Mesh.SetHealth(route.HealthAlive)
		r := <-done
		if r.err != nil || r.backend != "n3" || r.body != "n3 served" {
			t.Fatalf("after n2 left routing: served by %q: %q (%v)", r.backend, r.body, r.err)
		}
		if o := c.nodes["n1"].lastOutcome(); o.Attempts != 2 || o.Err != nil {
			t.Fatalf("outcome %+v, want 2 attempts and success", o)
		}
		return
	}
	t.Fatal("no attempt went to n2 first in 10 requests")
}

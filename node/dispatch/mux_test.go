package dispatch_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/infermesh/infermesh/mesh/route"
	"github.com/infermesh/infermesh/node/dispatch"
)

// muxCalls is how many forwarded calls node n sent over a peer's
// multiplexed stream.
func muxCalls(t *testing.T, n *tnode) float64 {
	t.Helper()
	mfs, err := n.Registry.Gather()
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

// TestUnansweredCallsOnTheStreamFailOver kills the serving peer while
// requests wait on it over the multiplexed stream: each moves to the next
// holder, and the client never sees the failure.
func TestUnansweredCallsOnTheStreamFailOver(t *testing.T) {
	hold := make(chan struct{})
	started := make(chan struct{}, 8)
	c := start(t, spec{
		ids:    three,
		models: map[string][]string{"n2": {"m"}, "n3": {"m"}},
		policy: dispatch.Policy{Strategy: route.Sticky},
		engine: func(n *tnode) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				if n.ID == "n2" && string(b) == "hold" {
					started <- struct{}{}
					select {
					case <-hold:
					case <-r.Context().Done():
					}
					return
				}
				fmt.Fprintf(w, "%s served %s", n.ID, b)
			})
		},
	})
	defer close(hold)
	key := keyFor(t, "n2", "n2", "n3")
	n1 := c.nodes["n1"]
	// The stream opens in the background on first use; the 30 s limit
	// is a hang guard.
	for end := time.Now().Add(30 * time.Second); muxCalls(t, n1) == 0; {
		if time.Now().After(end) {
			t.Fatal("n1 never forwarded over a multiplexed stream")
		}
		if resp, body := c.send(t, "n1", "m", key, "warm"); resp.StatusCode != 200 || body != "n2 served warm" {
			t.Fatalf("warm-up: %d %q", resp.StatusCode, body)
		}
	}
	before := muxCalls(t, n1)

	const held = 3
	type result struct {
		status  int
		backend string
		body    string
		err     error
	}
	results := make(chan result, held)
	for range held {
		go func() {
			req, _ := http.NewRequest("POST", n1.front.URL+"/v1/test", strings.NewReader("hold"))
			req.Header.Set("X-Model", "m")
			req.Header.Set("X-Key", key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				results <- result{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			results <- result{resp.StatusCode, resp.Header.Get(dispatch.BackendHeader), string(b), err}
		}()
	}
	for range held {
		<-started
	}
	if got := muxCalls(t, n1) - before; got != held {
		t.Fatalf("%v of %d held requests went over the stream", got, held)
	}
	c.nodes["n2"].Kill()
	for range held {
		r := <-results
		if r.err != nil || r.status != 200 || r.backend != "n3" || r.body != "n3 served hold" {
			t.Fatalf("held request after n2 died: %+v", r)
		}
	}
}

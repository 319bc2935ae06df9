package dispatch_test

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infermesh/infermesh/consensus/routing"
	"github.com/infermesh/infermesh/node/dispatch"
)

// capCluster is n1 (no model) forwarding to n2 (the model, cap 64).
func capCluster(t *testing.T, engine func(n *tnode) http.Handler) *cluster {
	return start(t, spec{
		ids:    []string{"n1", "n2"},
		models: map[string][]string{"n2": {"m"}},
		policy: dispatch.Policy{Nodes: map[string]routing.Node{"n2": {InflightCap: 64}}},
		engine: engine,
	})
}

// 64 closed-loop clients through a forwarding node against a holder whose
// cap is 64 never see a 503: the holder's gossiped count, up to a record
// old, says 64 whenever every client waits, and must not stop the next
// request from being sent.
func TestClosedLoopAtTheCapSeesNo503(t *testing.T) {
	c := capCluster(t, func(n *tnode) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(20 * time.Millisecond)
			w.Write([]byte("ok"))
		})
	})
	const clients, each = 64, 25
	var wg sync.WaitGroup
	var ok, refused, other atomic.Int64
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < each; j++ {
				resp, _ := c.send(t, "n1", "m", "", "x")
				switch resp.StatusCode {
				case 200:
					ok.Add(1)
				case 503:
					refused.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d clients x %d requests: %d ok, %d refused, %d other", clients, each, ok.Load(), refused.Load(), other.Load())
	if refused.Load() != 0 || other.Load() != 0 {
		t.Fatalf("%d 503s and %d other answers at exactly the cap, want none", refused.Load(), other.Load())
	}
}

// With 64 requests held at the holder, a 65th is the excess: it alone is
// refused 503 with Retry-After, and the 64 finish.
func TestOnlyTheExcessOverTheCapIsRefused(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 128)
	c := capCluster(t, func(n *tnode) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			<-release
			w.Write([]byte("ok"))
		})
	})
	codes := make(chan int, 64)
	for i := 0; i < 64; i++ {
		go func() {
			resp, _ := c.send(t, "n1", "m", "", "x")
			codes <- resp.StatusCode
		}()
	}
	for i := 0; i < 64; i++ {
		<-entered
	}
	resp, _ := c.send(t, "n1", "m", "", "x")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("65th request: %d (Retry-After %q), want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	close(release)
	for i := 0; i < 64; i++ {
		if code := <-codes; code != 200 {
			t.Fatalf("a request within the cap got %d", code)
		}
	}
}

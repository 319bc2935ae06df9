package dispatch_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/mesh/meshtest"
	"github.com/infermesh/infermesh/mesh/route"
	"github.com/infermesh/infermesh/node/dispatch"
)

// tnode is a test node: mesh, forward server and client from meshtest, a
// dispatcher, and a client-facing HTTP server in front of it.
type tnode struct {
	*meshtest.Node
	d     *dispatch.Dispatcher
	front *httptest.Server
	calls atomic.Int64 // requests the node's engine served

	mu       sync.Mutex
	outcomes []dispatch.Outcome
}

func (n *tnode) lastOutcome() dispatch.Outcome {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.outcomes[len(n.outcomes)-1]
}

// cluster starts nodes whose engines are built by engine(id) and waits
// until every node is ready with its models and seen by all.
type cluster struct {
	*meshtest.Cluster
	nodes map[string]*tnode
}

type spec struct {
	ids       []string
	models    map[string][]string // node -> warm models
	policy    dispatch.Policy
	maxInFl   int
	engine    func(n *tnode) http.Handler
	secretFor func(id string) string
	// chain, when set, is what a node's forward server replays into
	// instead of the dispatcher's Local handler.
	chain func(n *tnode) http.Handler
}

func start(t *testing.T, s spec) *cluster {
	t.Helper()
	pol := fixedPolicy(s.policy)
	c := &cluster{nodes: map[string]*tnode{}}
	var mu sync.Mutex
	c.Cluster = meshtest.Start(t, meshtest.Options{
		IDs:       s.ids,
		SecretFor: s.secretFor,
		Local: func(n *meshtest.Node) http.Handler {
			tn := &tnode{Node: n}
			eng := s.engine(tn)
			counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tn.calls.Add(1)
				eng.ServeHTTP(w, r)
			})
			d, err := dispatch.New(dispatch.Config{NodeID: n.ID, MaxInFlight: s.maxInFl}, counted, n.Mesh, n.Client, pol, n.Mesh, n.Logger, n.Registry)
			if err != nil {
				t.Fatal(err)
			}
			tn.d = d
			tn.front = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				o := d.Serve(w, r, dispatch.Facts{
					Model:     r.Header.Get("X-Model"),
					RequestID: r.Header.Get("X-Request-Id"),
					Caller:    forward.Caller{KeyID: r.Header.Get("X-Key")},
					// As the API layer decides it: one piece unless the
					// body asks for a stream.
					OnePiece: !strings.Contains(string(body), `"stream":true`),
				}, body)
				tn.mu.Lock()
				tn.outcomes = append(tn.outcomes, o)
				tn.mu.Unlock()
			}))
			t.Cleanup(tn.front.Close)
			mu.Lock()
			c.nodes[n.ID] = tn
			mu.Unlock()
			if s.chain != nil {
				if h := s.chain(tn); h != nil {
					return h
				}
			}
			return d.Local()
		},
	})
	for _, id := range s.ids {
		c.nodes[id].Ready(s.models[id]...)
	}
	c.WaitConverged()
	return c
}

// send posts to node id's front end.
func (c *cluster) send(t *testing.T, id, model, key, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", c.nodes[id].front.URL+"/v1/test?x=1", strings.NewReader(body))
	req.Header.Set("X-Model", model)
	req.Header.Set("X-Key", key)
	req.Header.Set("Authorization", "Bearer sk-client-secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// keyFor finds an API key id that sticky routing sends to target first
// among the holders of a model.
func keyFor(t *testing.T, target string, holders ...string) string {
	t.Helper()
	var peers []route.Peer
	for _, h := range holders {
		peers = append(peers, route.Peer{ID: h, Health: route.HealthReady, Models: map[string]route.Model{"m": {Warm: true}}})
	}
	for i := 0; i < 10000; i++ {
		k := fmt.Sprint("key", i)
		if route.Rank(route.Sticky, route.Facts{Model: "m", Caller: "key:" + k}, peers).Candidates[0].ID == target {
			return k
		}
	}
	t.Fatalf("no key routes to %s", target)
	return ""
}

// echo is an engine that names the serving node and reports usage.
func echo(n *tnode) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if u, ok := w.(forward.UsageSetter); ok {
			u.SetUsage(int64(len(body)), 7)
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "%s served %s %s auth=%q body=%s", n.ID, r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), body)
	})
}

type forwardRequest struct{ model string }

func (f forwardRequest) req() *forward.Request {
	h := http.Header{}
	h.Set("X-Model", f.model)
	return &forward.Request{Method: "POST", Path: "/v1/test", Header: h, Model: f.model}
}

package mesh_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/mesh/meshtest"
	"github.com/infermesh/infermesh/mesh/route"
)

// capture collects the bytes a node's listeners receive.
type capture struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (c *capture) tap(b []byte) {
	c.mu.Lock()
	c.buf.Write(b)
	c.mu.Unlock()
}

func (c *capture) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes())
}

func (c *capture) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.Len()
}

// TestIntruderWithAnotherSecretNeverJoins starts a node with a wrong
// cluster secret (and no explicit gossip key) next to a cluster. It never
// becomes a member of anyone's table, is never a routing candidate, gets
// no forwarded request served, and no byte it receives — from its own join
// attempts, from a member asked to join it, or from a request sent to it
// by mistake — contains the cluster secret.
func TestIntruderWithAnotherSecretNeverJoins(t *testing.T) {
	const prompt = "a prompt only members may read"
	var served sync.Map // node id -> *atomic.Int32
	count := func(id string) *atomic.Int32 {
		v, _ := served.LoadOrStore(id, new(atomic.Int32))
		return v.(*atomic.Int32)
	}
	c := meshtest.Start(t, meshtest.Options{
		Nodes: 3,
		Local: func(n *meshtest.Node) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				count(n.ID).Add(1)
				io.Copy(io.Discard, r.Body)
				w.Write([]byte(n.ID))
			})
		},
	})
	for _, n := range c.Nodes() {
		n.Ready("m")
	}
	c.WaitConverged()

	var seen capture
	rogue := c.StartIntruder("rogue", "a-wrong-secret", seen.tap)
	rogue.Ready("m")
	// Its background join keeps failing: wait for several attempts.
	waitFailedJoins(t, rogue, 3)

	n1 := c.Node("n1")
	// A member told to join the intruder (a stale --join entry) fails too,
	// and sends it only gossip it cannot read.
	if k, err := n1.Mesh.Join([]string{rogue.Mesh.GossipAddr()}); err == nil || k > 0 {
		t.Fatalf("a member joined the intruder: %d, %v", k, err)
	}
	if seen.len() == 0 {
		t.Fatal("the tap saw no gossip bytes; the test would prove nothing")
	}

	for _, n := range c.Nodes() {
		for _, p := range n.Mesh.Peers() {
			if p.ID == "rogue" {
				t.Fatalf("%s lists the intruder: %s", n.ID, meshtest.Describe(n.Mesh.Peers()))
			}
		}
	}
	if peers := rogue.Mesh.Peers(); len(peers) != 1 {
		t.Fatalf("the intruder sees members: %s", meshtest.Describe(peers))
	}

	// Routing as dispatch does it never picks the intruder.
	for i := range 30 {
		res := route.Rank(route.RoundRobin, route.Facts{Model: "m", Counter: uint64(i)}, n1.Mesh.Peers())
		if len(res.Candidates) != 3 {
			t.Fatalf("candidates %s", meshtest.Describe(res.Candidates))
		}
		first := res.Candidates[0]
		if first.ID == "rogue" {
			t.Fatal("the intruder is a routing candidate")
		}
		s, err := n1.Client.Forward(meshtest.Context(t), first.RPCAddr, &forward.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(prompt), Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Head(); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}

	// Even a request sent straight to the intruder's RPC address (routing
	// never does this) carries no secret: the intruder receives it, cannot
	// verify the signature under its own secret and refuses it.
	s, err := n1.Client.Forward(meshtest.Context(t), rogue.RPCAddr, &forward.Request{Method: "POST", Path: "/v1/chat/completions", Body: []byte(prompt), Model: "m"})
	if err == nil {
		_, err = s.Head()
		s.Close()
	}
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("the intruder accepted a request signed under another secret: %v", err)
	}
	if got := count("rogue").Load(); got != 0 {
		t.Fatalf("the intruder served %d requests", got)
	}
	if total := count("n1").Load() + count("n2").Load() + count("n3").Load(); total != 30 {
		t.Fatalf("members served %d of 30 requests", total)
	}

	all := seen.bytes()
	if !bytes.Contains(all, []byte(prompt)) {
		t.Fatal("the tap did not see the request sent to the intruder's RPC port")
	}
	secret := meshtest.DefaultSecret
	for _, form := range []string{secret, hex.EncodeToString([]byte(secret)), base64.StdEncoding.EncodeToString([]byte(secret)), strings.ToLower("X-Infermesh-Cluster-Secret")} {
		if bytes.Contains(bytes.ToLower(all), bytes.ToLower([]byte(form))) {
			t.Fatalf("the intruder received %q", form)
		}
	}
}

// waitFailedJoins waits until n's join loop failed at least k times, or n
// sees another member (which the caller then reports).
func waitFailedJoins(t *testing.T, n *meshtest.Node, k float64) {
	t.Helper()
	meshtest.WaitFor(t, n, "failed joins", func(peers []route.Peer) bool {
		if len(peers) > 1 {
			return true
		}
		mfs, _ := n.Registry.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "infermesh_mesh_join_attempts_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetValue() == "failed" && m.GetCounter().GetValue() >= k {
						return true
					}
				}
			}
		}
		return false
	})
}

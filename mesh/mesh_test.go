package mesh_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infermesh/infermesh/mesh"
	"github.com/infermesh/infermesh/mesh/meshtest"
	"github.com/infermesh/infermesh/mesh/route"
)

func peer(peers []route.Peer, id string) (route.Peer, bool) {
	for _, p := range peers {
		if p.ID == id {
			return p, true
		}
	}
	return route.Peer{}, false
}

func TestClusterConvergesAndAnswersWhoServes(t *testing.T) {
	c := meshtest.Start(t, meshtest.Options{Nodes: 3})
	n1, n2, n3 := c.Node("n1"), c.Node("n2"), c.Node("n3")
	n1.Ready("embed/a")
	n2.Ready("embed/a", "chat/b")
	n3.Mesh.SetModels([]string{"chat/b"}, nil) // installed, cold
	n3.Mesh.SetHealth(route.HealthReady)
	c.WaitConverged()

	for _, n := range c.Nodes() {
		peers := n.Mesh.Peers()
		if got := len(peers); got != 3 {
			t.Fatalf("%s sees %d members, want 3", n.ID, got)
		}
		var serving []string
		for _, p := range n.Mesh.Serving("chat/b") {
			serving = append(serving, p.ID)
		}
		if !slices.Equal(serving, []string{"n2", "n3"}) {
			t.Fatalf("%s: chat/b served by %v, want [n2 n3]", n.ID, serving)
		}
		p3, _ := peer(peers, "n3")
		if p3.Models["chat/b"].Warm {
			t.Fatalf("%s sees n3's cold model as warm", n.ID)
		}
		p1, _ := peer(peers, "n1")
		if p1.RPCAddr != n1.RPCAddr || p1.Version != "test" {
			t.Fatalf("%s: identity of n1 = %q %q, want %q test", n.ID, p1.RPCAddr, p1.Version, n1.RPCAddr)
		}
		for _, p := range peers {
			if p.Self != (p.ID == n.ID) {
				t.Fatalf("%s: Self flag wrong on %s", n.ID, p.ID)
			}
		}
	}

	// Load travels too: in-flight, cap, latency moving average.
	n2.Mesh.SetRouting(mesh.Routing{MaxInFlight: 8, Weight: 3, Canary: true, CanaryPercent: 15})
	n2.Mesh.SetInFlight(5)
	n2.Mesh.ObserveLatency("chat/b", 100*time.Millisecond)
	n2.Mesh.ObserveLatency("chat/b", 200*time.Millisecond) // 100 + 0.2*(200-100) = 120ms
	meshtest.WaitFor(t, n1, "n2's load", func(peers []route.Peer) bool {
		p, _ := peer(peers, "n2")
		return p.InFlight == 5 && p.MaxInFlight == 8 && p.Weight == 3 && p.Canary && p.CanaryPercent == 15 &&
			p.Models["chat/b"].Latency == 120*time.Millisecond
	})
}

func TestDrainingIsGossipedAndStopsRouting(t *testing.T) {
	c := meshtest.Start(t, meshtest.Options{Nodes: 2})
	n1, n2 := c.Node("n1"), c.Node("n2")
	n1.Ready("m")
	n2.Ready("m")
	c.WaitConverged()
	n2.Mesh.SetHealth(route.HealthDraining)
	meshtest.WaitFor(t, n1, "n2 draining", func(peers []route.Peer) bool {
		p, _ := peer(peers, "n2")
		return p.Health == route.HealthDraining
	})
	for _, p := range n1.Mesh.Serving("m") {
		if p.ID == "n2" {
			t.Fatal("a draining node is still offered for routing")
		}
	}
}

func TestWrongEncryptionKeyCannotJoin(t *testing.T) {
	keyA := []byte("0123456789abcdef")
	keyB := []byte("fedcba9876543210")
	a := meshtest.Start(t, meshtest.Options{IDs: []string{"a1", "a2"}, EncryptionKey: keyA})
	a.WaitConverged()
	seed := a.Node("a1").Mesh.GossipAddr()

	for name, key := range map[string][]byte{"wrong key": keyB, "no key": nil} {
		t.Run(name, func(t *testing.T) {
			cfg := meshtest.Config("intruder")
			cfg.EncryptionKey = key
			m, err := mesh.New(cfg, meshtest.Logger(t, "intruder"), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Shutdown()
			if n, err := m.Join([]string{seed}); err == nil || n != 0 {
				t.Fatalf("join with %s: n=%d err=%v, want a failure", name, n, err)
			}
			if got := len(m.Peers()); got != 1 {
				t.Fatalf("intruder sees %d members, want only itself", got)
			}
			for _, n := range a.Nodes() {
				if _, ok := peer(n.Mesh.Peers(), "intruder"); ok {
					t.Fatalf("%s admitted the intruder", n.ID)
				}
			}
		})
	}

	t.Run("right key", func(t *testing.T) {
		cfg := meshtest.Config("friend")
		cfg.EncryptionKey = keyA
		m, err := mesh.New(cfg, meshtest.Logger(t, "friend"), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Shutdown()
		if n, err := m.Join([]string{seed}); err != nil || n != 1 {
			t.Fatalf("join with the right key: n=%d err=%v", n, err)
		}
		if got := len(m.Peers()); got != 3 {
			t.Fatalf("friend sees %d members after join, want 3", got)
		}
	})
}

func TestJoinRetriesUntilSeedAnswers(t *testing.T) {
	// Reserve a gossip port, start a node that joins it before anyone
	// listens there, then start the seed on that port.
	probe, err := mesh.New(meshtest.Config("probe"), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	seedAddr := probe.GossipAddr()
	probe.Shutdown()

	cfg := meshtest.Config("late")
	cfg.Join = []string{seedAddr}
	late, err := mesh.New(cfg, meshtest.Logger(t, "late"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Shutdown()
	select {
	case <-late.Joined():
		t.Fatal("joined before the seed existed")
	default:
	}
	sub := late.Subscribe(mesh.EventJoin)
	defer sub.Close()

	scfg := meshtest.Config("seed")
	scfg.BindAddr = seedAddr
	seed, err := mesh.New(scfg, meshtest.Logger(t, "seed"), nil, nil)
	if err != nil {
		t.Skipf("could not rebind the reserved port: %v", err)
	}
	defer seed.Shutdown()
	select {
	case <-late.Joined():
	case <-time.After(meshtest.WaitLimit):
		t.Fatal("the late node never joined the seed")
	}
	for e := range sub.C {
		if e.Peer.ID == "seed" {
			break
		}
	}
}

func TestNodeWithoutJoinIsAMeshOfOne(t *testing.T) {
	m, err := mesh.New(meshtest.Config("solo"), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	<-m.Joined()
	peers := m.Peers()
	if len(peers) != 1 || peers[0].ID != "solo" || !peers[0].Self {
		t.Fatalf("solo node sees %s", meshtest.Describe(peers))
	}
	m.SetModels(nil, []string{"m"})
	m.SetHealth(route.HealthReady)
	if got := m.Serving("m"); len(got) != 1 || got[0].ID != "solo" {
		t.Fatalf("solo node does not serve its own model: %s", meshtest.Describe(got))
	}
}

func TestNodeMetaLimit(t *testing.T) {
	cfg := meshtest.Config("big")
	cfg.Version = strings.Repeat("v", mesh.MaxMetaSize)
	if _, err := mesh.New(cfg, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("oversized NodeMeta accepted: %v", err)
	}
	cfg.Version = "1.2.3"
	m, err := mesh.New(cfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.Shutdown()
}

func TestEjectAndRestore(t *testing.T) {
	c := meshtest.Start(t, meshtest.Options{Nodes: 2})
	n1, n2 := c.Node("n1"), c.Node("n2")
	n1.Ready("m")
	n2.Ready("m")
	c.WaitConverged()

	// Freeze n2's record: a long heartbeat is not available after start,
	// so watch for the restore through events instead.
	sub := n1.Mesh.Subscribe(mesh.EventUpdate)
	defer sub.Close()
	n1.Mesh.Eject("n2")
	p, _ := n1.Mesh.Peer("n2")
	if !p.Ejected || p.Routable() {
		t.Fatalf("n2 not ejected at once: %+v", p)
	}
	if len(n1.Mesh.Serving("m")) != 1 {
		t.Fatal("an ejected peer is still offered for routing")
	}
	// Ejecting oneself does nothing.
	n1.Mesh.Eject("n1")
	if p, _ := n1.Mesh.Peer("n1"); p.Ejected {
		t.Fatal("a node ejected itself")
	}
	sawEject := false
	for e := range sub.C {
		if e.Peer.ID != "n2" {
			continue
		}
		if e.Peer.Ejected {
			sawEject = true
			continue
		}
		if !sawEject {
			t.Fatal("restore event before the eject event")
		}
		break // restored by a newer record saying ready
	}
	p, _ = n1.Mesh.Peer("n2")
	if p.Ejected || !p.Routable() {
		t.Fatalf("n2 not restored: %+v", p)
	}
}

func TestEjectedPeerStaysOutWhileNotReady(t *testing.T) {
	c := meshtest.Start(t, meshtest.Options{Nodes: 2, Configure: func(cfg *mesh.Config) {
		cfg.EjectHold = 50 * time.Millisecond
	}})
	n1, n2 := c.Node("n1"), c.Node("n2")
	n1.Ready("m")
	n2.Ready("m")
	c.WaitConverged()
	n2.Mesh.SetHealth(route.HealthAlive) // up but not ready
	meshtest.WaitFor(t, n1, "n2 not ready", func(peers []route.Peer) bool {
		p, _ := peer(peers, "n2")
		return p.Health == route.HealthAlive
	})
	ejected := time.Now()
	n1.Mesh.Eject("n2")
	// Heartbeats with newer sequence numbers keep arriving well past the
	// hold; none says ready, so none restores n2.
	meshtest.WaitFor(t, n1, "newer records from n2 after the hold", func(peers []route.Peer) bool {
		p, _ := peer(peers, "n2")
		if !p.Ejected {
			t.Fatal("a not-ready peer was restored")
		}
		return p.Updated.After(ejected.Add(300 * time.Millisecond))
	})
	n2.Mesh.SetHealth(route.HealthReady)
	meshtest.WaitFor(t, n1, "n2 restored", func(peers []route.Peer) bool {
		p, _ := peer(peers, "n2")
		return !p.Ejected && p.Health == route.HealthReady
	})
}

func TestEventsForJoinLeaveAndFailure(t *testing.T) {
	c := meshtest.Start(t, meshtest.Options{Nodes: 1})
	n1 := c.Node("n1")
	sub := n1.Mesh.Subscribe(mesh.EventJoin, mesh.EventLeave, mesh.EventFailed)
	defer sub.Close()

	n2 := c.Add("n2")
	n3 := c.Add("n3")
	want := map[string]bool{"n2": true, "n3": true}
	for len(want) > 0 {
		e := <-sub.C
		if e.Type != mesh.EventJoin {
			t.Fatalf("unexpected %s for %s", e.Type, e.Peer.ID)
		}
		if e.Peer.RPCAddr == "" {
			t.Fatalf("join event without the RPC address: %+v", e.Peer)
		}
		delete(want, e.Peer.ID)
	}

	if err := n2.Leave(); err != nil {
		t.Fatal(err)
	}
	if e := <-sub.C; e.Type != mesh.EventLeave || e.Peer.ID != "n2" {
		t.Fatalf("after a graceful leave got %s for %s, want leave for n2", e.Type, e.Peer.ID)
	}
	n3.Kill()
	if e := <-sub.C; e.Type != mesh.EventFailed || e.Peer.ID != "n3" {
		t.Fatalf("after a kill got %s for %s, want failed for n3", e.Type, e.Peer.ID)
	}
	if got := len(n1.Mesh.Peers()); got != 1 {
		t.Fatalf("n1 still sees %d members", got)
	}
}

func TestLargeRecordReachesPeers(t *testing.T) {
	c := meshtest.Start(t, meshtest.Options{Nodes: 2})
	n1, n2 := c.Node("n1"), c.Node("n2")
	var models []string
	for i := 0; i < 120; i++ {
		models = append(models, fmt.Sprintf("onnx/some-fairly-long-family-name/variant-%03d", i))
	}
	n2.Mesh.SetModels(models, models[:10])
	n2.Mesh.SetHealth(route.HealthReady)
	meshtest.WaitFor(t, n1, "n2's 120 models", func(peers []route.Peer) bool {
		p, _ := peer(peers, "n2")
		return len(p.Models) == 120 && p.Models[models[3]].Warm && !p.Models[models[50]].Warm
	})
}

func TestRestartedNodeRecordWins(t *testing.T) {
	c := meshtest.Start(t, meshtest.Options{Nodes: 2})
	n1 := c.Node("n1")
	n1.Ready("m")
	c.Node("n2").Ready("old-model")
	c.WaitConverged()
	c.Node("n2").Kill()
	meshtest.WaitFor(t, n1, "n2 gone", func(peers []route.Peer) bool {
		_, ok := peer(peers, "n2")
		return !ok
	})
	// A new incarnation under the same id starts from sequence 1 again.
	n2b := c.Add("n2")
	n2b.Ready("new-model")
	meshtest.WaitFor(t, n1, "n2's new record", func(peers []route.Peer) bool {
		p, ok := peer(peers, "n2")
		_, newM := p.Models["new-model"]
		_, oldM := p.Models["old-model"]
		return ok && newM && !oldM && p.Health == route.HealthReady
	})
}

// TestGossipBytesCounted checks that the bytes a node's gossip moves are
// counted both ways once two nodes have exchanged records.
func TestGossipBytesCounted(t *testing.T) {
	c := meshtest.Start(t, meshtest.Options{Nodes: 2})
	n1 := c.Node("n1")
	n1.Ready("m")
	c.Node("n2").Ready("m")
	c.WaitConverged()
	in, out := n1.Mesh.GossipBytes()
	if in == 0 || out == 0 {
		t.Fatalf("gossip bytes in=%d out=%d after a join and records both ways", in, out)
	}
}

// TestEjectedPeerAskedBackWithoutHeartbeats: with heartbeats too rare to
// matter, a node that ejected a live, ready peer asks it for a record once
// the hold has passed, and the answer restores it.
func TestEjectedPeerAskedBackWithoutHeartbeats(t *testing.T) {
	c := meshtest.Start(t, meshtest.Options{Nodes: 2, Configure: func(cfg *mesh.Config) {
		cfg.RecordHeartbeat = time.Hour
		cfg.EjectHold = 50 * time.Millisecond
	}})
	n1, n2 := c.Node("n1"), c.Node("n2")
	n1.Ready("m")
	n2.Ready("m")
	c.WaitConverged()
	n1.Mesh.Eject("n2")
	if p, _ := n1.Mesh.Peer("n2"); !p.Ejected {
		t.Fatal("n2 not ejected")
	}
	meshtest.WaitFor(t, n1, "n2 restored by its answer", func(peers []route.Peer) bool {
		p, _ := peer(peers, "n2")
		return !p.Ejected && p.Routable()
	})
}

// TestRefusedIsToldToTheMesh: a node that had a connection refused by a
// peer ejects it and tells the others, which eject it too; the peer's
// own view is unaffected.
func TestRefusedIsToldToTheMesh(t *testing.T) {
	c := meshtest.Start(t, meshtest.Options{Nodes: 3, Configure: func(cfg *mesh.Config) {
		cfg.EjectHold = time.Minute // no restore during the test
	}})
	for _, id := range []string{"n1", "n2", "n3"} {
		c.Node(id).Ready("m")
	}
	c.WaitConverged()
	c.Node("n1").Mesh.Refused("n3")
	meshtest.WaitFor(t, c.Node("n2"), "n3 ejected at n2 too", func(peers []route.Peer) bool {
		p, _ := peer(peers, "n3")
		return p.Ejected
	})
	if p, _ := c.Node("n3").Mesh.Peer("n3"); p.Ejected {
		t.Fatal("n3 ejected itself")
	}
}

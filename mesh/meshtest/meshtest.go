// Package meshtest runs in-process mesh clusters for tests: several nodes,
// each with its own memberlist on a loopback port, its own Connect forward
// server on a bound :0 listener (h2c), forward client, logger, Prometheus
// registry and clock, all with fast gossip timers. Node-level tests build
// their dispatchers and handlers on top through Options.Local.
package meshtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/mesh"
	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/mesh/route"
)

// DefaultSecret is the cluster secret test clusters use unless told
// otherwise.
const DefaultSecret = "meshtest-cluster-secret"

// WaitLimit bounds every wait for the cluster to reach a state. It is a
// guard against hangs, not a performance expectation.
const WaitLimit = 30 * time.Second

// Options describes a test cluster.
type Options struct {
	// Nodes is the number of nodes, named n1..nN; ignored when IDs is set.
	Nodes int
	// IDs names the nodes explicitly.
	IDs []string
	// ClusterSecret is shared by all nodes; default DefaultSecret. Unless
	// EncryptionKey is set, the gossip key is derived from it, as a node
	// does (mesh.GossipKey).
	ClusterSecret string
	// SecretFor, when set, gives a node its own cluster secret for
	// node-to-node calls (to test refusals); nodes it returns "" for use
	// ClusterSecret. Such a node keeps the cluster's gossip key, as nodes
	// that share an explicit --gossip-key but not the secret would; see
	// StartIntruder for a node whose secret is wrong everywhere.
	SecretFor func(id string) string
	// EncryptionKey is the gossip key of all nodes (the --gossip-key case)
	// instead of the one derived from ClusterSecret.
	EncryptionKey []byte
	// Local returns the node's local-only handler. It runs after the node's
	// mesh and forward client exist (so a dispatcher can be built around
	// them) and before its forward server starts. Nil serves 404.
	Local func(n *Node) http.Handler
	// Configure adjusts a node's mesh config before the node starts.
	Configure func(cfg *mesh.Config)
	// Clock is the clock every node gets; default time.Now.
	Clock func() time.Time
}

// Node is one running test node.
type Node struct {
	// ID is the node id.
	ID string
	// Mesh is the node's membership.
	Mesh *mesh.Mesh
	// Forward is the node's forward server.
	Forward *forward.Server
	// Client is the node's forward client.
	Client *forward.Client
	// RPCAddr is where the forward server listens.
	RPCAddr string
	// Registry is the node's Prometheus registry.
	Registry *prometheus.Registry
	// Logger is the node's logger.
	Logger *slog.Logger
	// Clock is the node's clock.
	Clock func() time.Time

	ln       net.Listener
	srv      *http.Server
	stopOnce sync.Once
	killOnce sync.Once
	dead     atomic.Bool
}

// Cluster is a set of running test nodes.
type Cluster struct {
	t     testing.TB
	opts  Options
	mu    sync.Mutex
	nodes []*Node
	seed  string // gossip address new nodes join
}

// Start starts the nodes one after another, each joining the first, and
// stops them all when the test ends. It does not wait for convergence; see
// WaitConverged.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.ClusterSecret == "" {
		opts.ClusterSecret = DefaultSecret
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	ids := opts.IDs
	if len(ids) == 0 {
		for i := 1; i <= opts.Nodes; i++ {
			ids = append(ids, fmt.Sprintf("n%d", i))
		}
	}
	c := &Cluster{t: t, opts: opts}
	t.Cleanup(c.stopAll)
	for _, id := range ids {
		c.Add(id)
	}
	return c
}

// Add starts one more node that joins the cluster.
func (c *Cluster) Add(id string) *Node {
	c.t.Helper()
	secret := c.opts.ClusterSecret
	if c.opts.SecretFor != nil {
		if s := c.opts.SecretFor(id); s != "" {
			secret = s
		}
	}
	n, err := c.start(id, nodeSetup{secret: secret, gossipSecret: c.opts.ClusterSecret, member: true})
	if err != nil {
		c.t.Fatalf("meshtest: start %s: %v", id, err)
	}
	return n
}

// StartIntruder starts a node that holds secret instead of the cluster's,
// for node-to-node calls and gossip alike (a node started with a wrong
// --cluster-secret and no --gossip-key), and lets it try to join the
// cluster in the background. It is not one of the cluster's nodes (Nodes,
// WaitConverged leave it out) and is killed when the test ends. tap
// receives a copy of every byte its listeners receive: its RPC listener's
// connections and its gossip transport (mesh.Config.Tap). The slice must
// not be kept.
func (c *Cluster) StartIntruder(id, secret string, tap func(b []byte)) *Node {
	c.t.Helper()
	n, err := c.start(id, nodeSetup{secret: secret, gossipSecret: secret, tap: tap})
	if err != nil {
		c.t.Fatalf("meshtest: start intruder %s: %v", id, err)
	}
	c.t.Cleanup(n.Kill)
	return n
}

// nodeSetup is what differs between the nodes start makes.
type nodeSetup struct {
	secret       string       // for forwarding
	gossipSecret string       // the gossip key is derived from it unless Options.EncryptionKey
	tap          func([]byte) // sees every byte the node's listeners receive
	member       bool         // one of the cluster's nodes: waits for its join
}

func (c *Cluster) start(id string, setup nodeSetup) (*Node, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	secret := setup.secret
	n := &Node{ID: id, RPCAddr: ln.Addr().String(), Registry: prometheus.NewRegistry(), Logger: Logger(c.t, id), Clock: c.opts.Clock, ln: ln}
	if setup.tap != nil {
		ln = &tapListener{Listener: ln, tap: setup.tap}
		n.ln = ln
	}
	cfg := Config(id)
	cfg.RPCAddr = n.RPCAddr
	cfg.HTTPAddr = n.RPCAddr
	cfg.Version = "test"
	cfg.EncryptionKey = c.opts.EncryptionKey
	cfg.ClusterSecret = setup.gossipSecret
	cfg.Tap = setup.tap
	c.mu.Lock()
	if c.seed != "" {
		cfg.Join = []string{c.seed}
	}
	c.mu.Unlock()
	if c.opts.Configure != nil {
		c.opts.Configure(&cfg)
	}
	if n.Mesh, err = mesh.New(cfg, n.Logger, n.Registry, n.Clock); err != nil {
		ln.Close()
		return nil, err
	}
	if n.Client, err = forward.NewClient(forward.ClientConfig{NodeID: id, ClusterSecret: secret}, n.Logger, n.Registry); err != nil {
		n.Mesh.Shutdown()
		ln.Close()
		return nil, err
	}
	var local http.Handler = http.NotFoundHandler()
	if c.opts.Local != nil {
		local = c.opts.Local(n)
	}
	if n.Forward, err = forward.NewServer(forward.ServerConfig{NodeID: id, ClusterSecret: secret}, local, n.Logger, n.Registry); err != nil {
		n.Mesh.Shutdown()
		ln.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(n.Forward.Handler())
	n.srv = forward.NewHTTPServer(mux, n.Logger)
	go func() { _ = n.srv.Serve(ln) }()
	if !setup.member {
		return n, nil
	}
	if len(cfg.Join) > 0 {
		select {
		case <-n.Mesh.Joined():
		case <-time.After(WaitLimit):
			n.Kill()
			return nil, errors.New("did not join within the wait limit")
		}
	}
	c.mu.Lock()
	if c.seed == "" {
		c.seed = n.Mesh.GossipAddr()
	}
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	return n, nil
}

// tapListener copies every byte read from its connections to tap.
type tapListener struct {
	net.Listener
	tap func([]byte)
}

// Accept returns the next connection, tapped.
func (l *tapListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &tapConn{Conn: conn, tap: l.tap}, nil
}

type tapConn struct {
	net.Conn
	tap func([]byte)
}

// Read reads and taps.
func (c *tapConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.tap(p[:n])
	}
	return n, err
}

// Nodes returns the nodes in start order.
func (c *Cluster) Nodes() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Node(nil), c.nodes...)
}

// Node returns the node with the given id, or fails the test.
func (c *Cluster) Node(id string) *Node {
	for _, n := range c.Nodes() {
		if n.ID == id {
			return n
		}
	}
	c.t.Fatalf("meshtest: no node %q", id)
	return nil
}

// Ready publishes the node as ready with the given models warm.
func (n *Node) Ready(models ...string) {
	n.Mesh.SetModels(nil, models)
	n.Mesh.SetHealth(route.HealthReady)
}

// StopRPC closes the node's RPC listener and connections, so peers dialing
// it get "connection refused" while its gossip keeps running.
func (n *Node) StopRPC() {
	n.stopOnce.Do(func() {
		_ = n.srv.Close()
		_ = n.ln.Close()
		n.Client.Close()
	})
}

// Kill stops the node abruptly: RPC and gossip stop without a leave.
func (n *Node) Kill() {
	n.killOnce.Do(func() {
		n.dead.Store(true)
		n.StopRPC()
		_ = n.Mesh.Shutdown()
	})
}

// Leave drains nothing and leaves gracefully: gossip announces the leave,
// then RPC stops.
func (n *Node) Leave() error {
	n.dead.Store(true)
	err := n.Mesh.Leave(time.Second)
	n.StopRPC()
	return err
}

func (c *Cluster) stopAll() {
	for _, n := range c.Nodes() {
		n.Kill()
	}
}

// WaitFor waits until cond holds for node n's peer view, re-checking on
// every mesh event and every few milliseconds (load changes raise no
// events). It fails the test if WaitLimit passes first.
func WaitFor(t testing.TB, n *Node, what string, cond func(peers []route.Peer) bool) {
	t.Helper()
	sub := n.Mesh.Subscribe()
	defer sub.Close()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	limit := time.NewTimer(WaitLimit)
	defer limit.Stop()
	for !cond(n.Mesh.Peers()) {
		select {
		case <-sub.C:
		case <-tick.C:
		case <-limit.C:
			t.Fatalf("meshtest: %s: gave up waiting for %s; %s sees %s", n.ID, what, n.ID, Describe(n.Mesh.Peers()))
		}
	}
}

// WaitConverged waits until every running node sees every other running
// node with the health and model set that node reports for itself.
func (c *Cluster) WaitConverged() {
	c.t.Helper()
	nodes := c.Nodes()
	var live []*Node
	for _, n := range nodes {
		if !n.dead.Load() {
			live = append(live, n)
		}
	}
	for _, n := range live {
		WaitFor(c.t, n, "convergence", func(peers []route.Peer) bool {
			for _, o := range live {
				self, ok := o.Mesh.Peer(o.ID)
				if !ok {
					return false
				}
				seen, ok := find(peers, o.ID)
				if !ok || seen.Health != self.Health || len(seen.Models) != len(self.Models) {
					return false
				}
				for m, st := range self.Models {
					if seen.Models[m].Warm != st.Warm {
						return false
					}
				}
			}
			return true
		})
	}
}

func find(peers []route.Peer, id string) (route.Peer, bool) {
	for _, p := range peers {
		if p.ID == id {
			return p, true
		}
	}
	return route.Peer{}, false
}

// Describe renders peer views for failure messages.
func Describe(peers []route.Peer) string {
	var b strings.Builder
	for _, p := range peers {
		fmt.Fprintf(&b, "[%s %s ejected=%v inflight=%d/%d models=%d] ", p.ID, p.Health, p.Ejected, p.InFlight, p.MaxInFlight, len(p.Models))
	}
	return b.String()
}

// Logger returns a logger for node id that writes to the test log at the
// level named by INFERMESH_TEST_LOG (debug, info, warn, error; default
// error), and stays silent once the test has finished.
func Logger(t testing.TB, id string) *slog.Logger {
	level := slog.LevelError
	switch strings.ToLower(os.Getenv("INFERMESH_TEST_LOG")) {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "warn":
		level = slog.LevelWarn
	}
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})).With("test_node", id)
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

// Write logs one line to the test log unless the test has finished.
func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

// Context returns a context bounded by WaitLimit and the test's end.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), WaitLimit)
	t.Cleanup(cancel)
	return ctx
}

// Config returns a mesh.Config for an in-process test node: loopback,
// port 0, mesh.TestTimers and quick record publishing.
func Config(nodeID string) mesh.Config {
	return mesh.Config{
		NodeID:          nodeID,
		BindAddr:        "127.0.0.1:0",
		Timers:          mesh.TestTimers(),
		JoinBackoffMin:  20 * time.Millisecond,
		JoinBackoffMax:  200 * time.Millisecond,
		RecordInterval:  20 * time.Millisecond,
		RecordHeartbeat: 100 * time.Millisecond,
	}
}

// Package consensustest runs in-process consensus clusters for tests: each
// node gets a 127.0.0.1:0 listener shared by raft and Connect through
// rpcmux, a temporary data directory, its own Prometheus registry and fast
// raft timers. The cluster plays the mesh: it keeps the membership view the
// nodes' reconcile loops read and reports joins, failures and departures to
// every running node, as the node package does from mesh events.
//
// Like the node, the cluster wires the pieces consensus leaves to it: each
// node's raft connections go through the rpcmux handshake with its cluster
// secret, and its ConsensusService calls are signed and checked by
// mesh/peerauth (the one dependency on mesh, which consensus itself never
// imports; this package stands in for the node).
package consensustest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/rpcmux"
	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/mesh/peerauth"
)

// WaitLimit bounds every Wait helper. It is a liveness bound for a slow,
// shared machine, not a performance assertion.
const WaitLimit = 60 * time.Second

// Options configure a cluster; zero values get test-friendly defaults.
type Options struct {
	// Voters is the target voter count (default 3).
	Voters int
	// ReapTimeout before a failed server is removed (default 1s).
	ReapTimeout time.Duration
	// ReconcileInterval of the leader's full pass (default 100ms).
	ReconcileInterval time.Duration
	// Secret is the cluster secret (default "test-cluster-secret").
	Secret string
	// Clock for every node; nil uses the system clock.
	Clock consensus.Clock
	// Logger for every node; nil discards.
	Logger *slog.Logger
	// Configure, when set, edits each node's config before it starts.
	Configure func(*consensus.Config)
	// PeerTLS, when set, gives each node (by id) its peer TLS: its mux
	// then admits mutual TLS only, and its raft dials and forwarded calls
	// use it. Nil for an id leaves that node cleartext.
	PeerTLS func(id string) *rpcmux.PeerTLS
}

// Peer is one in-process node.
type Peer struct {
	ID       string               // node id
	Dir      string               // data directory, kept across restarts
	Addr     string               // RPC address (raft + Connect), new on each start
	Node     *consensus.Node      // the running node
	Registry *prometheus.Registry // the node's own metrics
	// RaftRefused counts inbound raft connections whose handshake failed.
	RaftRefused func() uint64
	// TLSRefused counts inbound connections refused by peer TLS.
	TLSRefused func() uint64

	mux     *rpcmux.Mux
	srv     *http.Server
	serving sync.WaitGroup
}

// Metric sums the current values of every series of a counter or gauge
// family in the peer's registry (0 when absent).
func (p *Peer) Metric(name string) float64 {
	mfs, err := p.Registry.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

func (p *Peer) stop(graceful bool) error {
	var err error
	if graceful {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = p.Node.Shutdown(ctx)
		cancel()
	} else {
		err = p.Node.Close()
	}
	_ = p.srv.Close()
	_ = p.mux.Close()
	p.serving.Wait()
	return err
}

// PeerAuth returns the signer and verifier a node uses for
// ConsensusService calls with secret, as the node wires them.
func PeerAuth(secret string) (consensus.PeerAuth, error) {
	sign, err := peerauth.NewSigner(secret, peerauth.Options{})
	if err != nil {
		return consensus.PeerAuth{}, err
	}
	verify, err := peerauth.NewVerifier(secret, peerauth.Options{})
	if err != nil {
		return consensus.PeerAuth{}, err
	}
	return consensus.PeerAuth{Client: sign, Handler: verify}, nil
}

// Cluster is a set of peers plus the membership view they share.
type Cluster struct {
	t    testing.TB
	opts Options

	mu      sync.Mutex
	peers   map[string]*Peer // running peers
	dirs    map[string]string
	members map[string]consensus.Member
}

// New returns an empty cluster; peers stop when the test ends.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Voters == 0 {
		opts.Voters = 3
	}
	if opts.ReapTimeout == 0 {
		opts.ReapTimeout = time.Second
	}
	if opts.ReconcileInterval == 0 {
		opts.ReconcileInterval = 100 * time.Millisecond
	}
	if opts.Secret == "" {
		opts.Secret = "test-cluster-secret"
	}
	c := &Cluster{t: t, opts: opts, peers: map[string]*Peer{}, dirs: map[string]string{}, members: map[string]consensus.Member{}}
	t.Cleanup(c.Close)
	return c
}

// Start starts n peers "n1".."nN": n1 bootstraps, the rest join. It waits
// until n1 leads.
func (c *Cluster) Start(n int) {
	c.t.Helper()
	c.StartPeer("n1", false)
	c.WaitFor("n1 to lead", func() bool { return c.Peer("n1").Node.IsLeader() })
	for i := 2; i <= n; i++ {
		c.StartPeer(fmt.Sprintf("n%d", i), true)
	}
}

// Members implements consensus.MemberSource: the simulated mesh view.
func (c *Cluster) Members() []consensus.Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]consensus.Member, 0, len(c.members))
	for _, id := range slices.Sorted(maps.Keys(c.members)) {
		out = append(out, c.members[id])
	}
	return out
}

// StartPeer starts (or restarts, from its earlier directory) peer id on a
// fresh port and reports it alive to every running peer. join is the
// node's Config.Join.
func (c *Cluster) StartPeer(id string, join bool) *Peer {
	c.t.Helper()
	c.mu.Lock()
	if _, running := c.peers[id]; running {
		c.mu.Unlock()
		c.t.Fatalf("consensustest: peer %s is already running", id)
	}
	dir, ok := c.dirs[id]
	if !ok {
		dir = filepath.Join(c.t.TempDir(), id)
		c.dirs[id] = dir
	}
	c.mu.Unlock()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatalf("consensustest: listen: %v", err)
	}
	p := &Peer{ID: id, Dir: dir, Addr: ln.Addr().String(), Registry: prometheus.NewRegistry()}
	logger := c.opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg := consensus.Config{
		NodeID:            id,
		AdvertiseAddr:     p.Addr,
		DataDir:           dir,
		Join:              join,
		Voters:            c.opts.Voters,
		ReapTimeout:       c.opts.ReapTimeout,
		ReconcileInterval: c.opts.ReconcileInterval,
		Members:           c,
		ClusterSecret:     c.opts.Secret,
		ApplyTimeout:      5 * time.Second,
		LeaderWait:        5 * time.Second,
		// Short enough for quick elections, long enough that a leader
		// starved of CPU by a parallel `go test ./...` on two cores keeps
		// its lease (100ms lost leadership mid-commit under load).
		HeartbeatTimeout:   400 * time.Millisecond,
		ElectionTimeout:    400 * time.Millisecond,
		LeaderLeaseTimeout: 300 * time.Millisecond,
		CommitTimeout:      5 * time.Millisecond,
		OnFatal:            func(err error) { c.t.Errorf("consensustest: %s fatal: %v", id, err) },
		Logger:             logger,
		Registerer:         p.Registry,
		Clock:              c.opts.Clock,
	}
	if c.opts.PeerTLS != nil {
		cfg.PeerTLS = c.opts.PeerTLS(id)
	}
	if c.opts.Configure != nil {
		c.opts.Configure(&cfg)
	}
	if cfg.PeerAuth == (consensus.PeerAuth{}) && cfg.ClusterSecret != "" {
		cfg.PeerAuth, err = PeerAuth(cfg.ClusterSecret)
		if err != nil {
			_ = ln.Close()
			c.t.Fatalf("consensustest: %v", err)
		}
	}
	if p.mux, err = rpcmux.New(ln, cfg.ClusterSecret, logger, rpcmux.WithPeerTLS(cfg.PeerTLS)); err != nil {
		_ = ln.Close()
		c.t.Fatalf("consensustest: start %s: %v", id, err)
	}
	p.RaftRefused = p.mux.RaftRefused
	p.TLSRefused = p.mux.TLSRefused
	if cfg.RaftListener == nil {
		cfg.RaftListener = p.mux.Raft()
	}
	node, err := consensus.New(cfg)
	if err != nil {
		_ = p.mux.Close()
		c.t.Fatalf("consensustest: start %s: %v", id, err)
	}
	p.Node = node
	mux := http.NewServeMux()
	mux.Handle(node.Handler())
	mux.Handle(node.AdminHandler())
	// The server the node runs on its RPC port (node/cluster.go), with
	// HTTP/2 over TLS for peer-TLS clusters.
	p.srv = forward.NewHTTPServer(mux, nil)
	p.srv.Protocols.SetHTTP2(true)
	p.serving.Add(2)
	go func() { defer p.serving.Done(); _ = p.mux.Serve() }()
	go func() { defer p.serving.Done(); _ = p.srv.Serve(p.mux.HTTP()) }()

	c.mu.Lock()
	c.peers[id] = p
	c.members[id] = consensus.Member{ID: id, RPCAddr: p.Addr, Status: consensus.MemberAlive}
	running := c.runningLocked()
	c.mu.Unlock()
	for _, q := range running {
		q.Node.MemberJoined(id, p.Addr)
		if q != p {
			p.Node.MemberJoined(q.ID, q.Addr)
		}
	}
	return p
}

func (c *Cluster) runningLocked() []*Peer {
	out := make([]*Peer, 0, len(c.peers))
	for _, id := range slices.Sorted(maps.Keys(c.peers)) {
		out = append(out, c.peers[id])
	}
	return out
}

// Running lists the running peers sorted by id.
func (c *Cluster) Running() []*Peer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runningLocked()
}

// Peer returns running peer id, failing the test when it is not running.
func (c *Cluster) Peer(id string) *Peer {
	c.t.Helper()
	c.mu.Lock()
	p := c.peers[id]
	c.mu.Unlock()
	if p == nil {
		c.t.Fatalf("consensustest: peer %s is not running", id)
	}
	return p
}

// Kill stops peer id without leaving (a crash as far as raft can tell) and
// reports it failed to the others.
func (c *Cluster) Kill(id string) {
	c.t.Helper()
	c.remove(id, false, consensus.MemberFailed)
}

// Leave shuts peer id down gracefully (leadership handed off first) and
// reports that it left.
func (c *Cluster) Leave(id string) {
	c.t.Helper()
	c.remove(id, true, consensus.MemberLeft)
}

func (c *Cluster) remove(id string, graceful bool, status consensus.MemberStatus) {
	c.t.Helper()
	p := c.Peer(id)
	c.mu.Lock()
	delete(c.peers, id)
	m := c.members[id]
	m.Status = status
	c.members[id] = m
	running := c.runningLocked()
	c.mu.Unlock()
	if err := p.stop(graceful); err != nil && !errors.Is(err, context.Canceled) {
		c.t.Logf("consensustest: stop %s: %v", id, err)
	}
	for _, q := range running {
		if status == consensus.MemberLeft {
			q.Node.MemberLeft(id)
		} else {
			q.Node.MemberFailed(id)
		}
	}
}

// Leader waits until exactly one running peer leads and every running
// voter agrees on it, and returns it.
func (c *Cluster) Leader() *Peer {
	c.t.Helper()
	var leader *Peer
	c.WaitFor("a leader every running peer agrees on", func() bool {
		leader = nil
		running := c.Running()
		for _, p := range running {
			if p.Node.IsLeader() {
				if leader != nil {
					return false
				}
				leader = p
			}
		}
		if leader == nil {
			return false
		}
		for _, p := range running {
			if p.Node.Leader() != leader.ID {
				return false
			}
		}
		return true
	})
	return leader
}

// Followers returns the running peers other than the current leader.
func (c *Cluster) Followers() []*Peer {
	c.t.Helper()
	l := c.Leader()
	var out []*Peer
	for _, p := range c.Running() {
		if p != l {
			out = append(out, p)
		}
	}
	return out
}

// WaitServers waits until the leader's raft configuration has exactly the
// given voters and non-voters (ids, any order).
func (c *Cluster) WaitServers(voters, nonvoters []string) {
	c.t.Helper()
	want := fmt.Sprintf("voters %v non-voters %v", sorted(voters), sorted(nonvoters))
	var got string
	ok := c.poll(func() bool {
		l := c.Leader()
		servers, err := l.Node.Servers()
		if err != nil {
			return false
		}
		var v, nv []string
		for _, s := range servers {
			if s.Voter {
				v = append(v, s.ID)
			} else {
				nv = append(nv, s.ID)
			}
		}
		got = fmt.Sprintf("voters %v non-voters %v", sorted(v), sorted(nv))
		return got == want
	})
	if !ok {
		c.t.Fatalf("consensustest: raft configuration is %s, want %s", got, want)
	}
}

// WaitCounts waits until the leader's raft configuration has the given
// numbers of voters and non-voters, and returns the voters' and
// non-voters' ids.
func (c *Cluster) WaitCounts(voters, nonvoters int) (v, nv []string) {
	c.t.Helper()
	ok := c.poll(func() bool {
		v, nv = nil, nil
		servers, err := c.Leader().Node.Servers()
		if err != nil {
			return false
		}
		for _, s := range servers {
			if s.Voter {
				v = append(v, s.ID)
			} else {
				nv = append(nv, s.ID)
			}
		}
		return len(v) == voters && len(nv) == nonvoters
	})
	if !ok {
		c.t.Fatalf("consensustest: raft configuration is voters %v non-voters %v, want %d and %d", v, nv, voters, nonvoters)
	}
	return v, nv
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	if s == nil {
		s = []string{}
	}
	return s
}

// Converged waits until every running peer has applied the same index and
// reports the same state digest, and returns the digest.
func (c *Cluster) Converged() string {
	c.t.Helper()
	var digest string
	var seen []string
	ok := c.poll(func() bool {
		seen = seen[:0]
		digest = ""
		same := true
		var index uint64
		for i, p := range c.Running() {
			d, idx := p.Node.State().DigestAt()
			seen = append(seen, fmt.Sprintf("%s@%d:%.12s", p.ID, idx, d))
			if i == 0 {
				digest, index = d, idx
			} else if d != digest || idx != index {
				same = false
			}
		}
		return same && digest != ""
	})
	if !ok {
		c.t.Fatalf("consensustest: peers did not converge: %v", seen)
	}
	return digest
}

// WaitFor polls cond until it holds, failing the test after WaitLimit.
func (c *Cluster) WaitFor(what string, cond func() bool) {
	c.t.Helper()
	if !c.poll(cond) {
		c.t.Fatalf("consensustest: gave up waiting for %s", what)
	}
}

func (c *Cluster) poll(cond func() bool) bool {
	deadline := time.Now().Add(WaitLimit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Apply applies cmd through peer p, retrying while the cluster has no
// reachable leader (what an HTTP client does on 503), and fails the test
// on any other error.
func (c *Cluster) Apply(p *Peer, cmd *consensus.Command) consensus.Result {
	c.t.Helper()
	var (
		res consensus.Result
		err error
	)
	ok := c.poll(func() bool {
		res, err = p.Node.Apply(context.Background(), cmd)
		return !errors.Is(err, consensus.ErrNoLeader) || errors.Is(err, consensus.ErrOutcomeUnknown)
	})
	if !ok || err != nil {
		c.t.Fatalf("consensustest: apply through %s: %v", p.ID, err)
	}
	return res
}

// Close stops every running peer.
func (c *Cluster) Close() {
	for _, p := range c.Running() {
		c.mu.Lock()
		delete(c.peers, p.ID)
		c.mu.Unlock()
		_ = p.stop(false)
	}
}

// ManualClock is a Clock that moves only when told.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock returns a clock reading start.
func NewManualClock(start time.Time) *ManualClock { return &ManualClock{now: start} }

// Now reads the clock.
func (m *ManualClock) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Advance moves the clock forward by d.
func (m *ManualClock) Advance(d time.Duration) {
	m.mu.Lock()
	m.now = m.now.Add(d)
	m.mu.Unlock()
}

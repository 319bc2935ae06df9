package consensus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/infermesh/infermesh/consensus/rpcmux"
)

// Node is one member of the raft group: it owns the raft instance, its
// stores under Config.DataDir, the state machine, leader forwarding and, while
// it leads, the membership reconcile loop.
type Node struct {
	leaderSeen atomic.Int64 // unix nanos when CaughtUp first saw a leader
	// usable is set once the replica has caught up with a leader since
	// this process started (see Usable).
	usable atomic.Bool
	// restored says raft found state on disk at start; started is when.
	restored  bool
	started   time.Time
	cfg       Config
	logger    *slog.Logger
	raft      *raft.Raft
	fsm       *fsm
	store     *raftboltdb.BoltStore
	members   *memberTable
	metrics   *metrics
	fwd       *forwarder
	ownedHTTP *http.Client // the peer-TLS client New built, closed with the node
	raftBytes raftBytes    // what raft's transport moved

	reconcileCh chan struct{}
	shutdownCh  chan struct{}
	wg          sync.WaitGroup
	serving     applyGate // forwarded commands under way
	closeOnce   sync.Once
	closeErr    error
}

// New opens (or creates) the raft state under cfg.DataDir and starts the
// node. A node with no raft state that is not joining bootstraps a
// one-voter cluster of itself; a joining node waits for the leader to add
// it, or with Config.BootstrapExpect bootstraps together with the others
// (expect.go). The node's ConsensusService must be served (see Handler) on the HTTP
// side of the same RPC port for followers to reach it.
func New(c Config) (*Node, error) {
	cfg, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger.With("node", cfg.NodeID)
	dir := filepath.Join(cfg.DataDir, "raft")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("consensus: %w", err)
	}
	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
	if err != nil {
		return nil, fmt.Errorf("consensus: open raft store: %w", err)
	}
	n := &Node{
		cfg:         cfg,
		logger:      logger,
		store:       store,
		members:     newMemberTable(cfg.Clock),
		reconcileCh: make(chan struct{}, 1),
		shutdownCh:  make(chan struct{}),
	}
	fail := func(err error) (*Node, error) {
		_ = store.Close()
		return nil, err
	}
	n.members.set(cfg.NodeID, cfg.AdvertiseAddr, MemberAlive)
	n.fsm = newFSM(logger, cfg.OnFatal)
	if n.metrics, err = newMetrics(cfg.Registerer, n); err != nil {
		return fail(fmt.Errorf("consensus: metrics: %w", err))
	}
	if cfg.HTTPClient == nil && cfg.PeerTLS != nil {
		cfg.HTTPClient = rpcmux.NewPeerClient(2*time.Second, cfg.PeerTLS)
		n.ownedHTTP = cfg.HTTPClient
	}
	n.fwd = newForwarder(cfg)

	hcl := newHCLog(logger, "raft")
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, cfg.SnapshotRetain, hcl)
	if err != nil {
		return fail(fmt.Errorf("consensus: snapshot store: %w", err))
	}
	dial := cfg.DialRaft
	if dial == nil {
		dial = func(addr string, timeout time.Duration) (net.Conn, error) {
			return rpcmux.DialRaftTLS(addr, cfg.ClusterSecret, cfg.PeerTLS, timeout)
		}
	}
	adv, err := net.ResolveTCPAddr("tcp", cfg.AdvertiseAddr)
	if err != nil {
		return fail(fmt.Errorf("consensus: AdvertiseAddr: %w", err))
	}
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		ServerAddressProvider: n.members,
		Logger:                hcl,
		Stream:                &streamLayer{ln: cfg.RaftListener, addr: adv, dial: dial, bytes: &n.raftBytes},
		MaxPool:               3,
		Timeout:               10 * time.Second,
	})

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = hcl
	setIf(&rc.HeartbeatTimeout, cfg.HeartbeatTimeout)
	setIf(&rc.ElectionTimeout, cfg.ElectionTimeout)
	setIf(&rc.LeaderLeaseTimeout, cfg.LeaderLeaseTimeout)
	setIf(&rc.CommitTimeout, cfg.CommitTimeout)
	setIf(&rc.SnapshotInterval, cfg.SnapshotInterval)
	if cfg.SnapshotThreshold > 0 {
		rc.SnapshotThreshold = cfg.SnapshotThreshold
	}
	if cfg.TrailingLogs > 0 {
		rc.TrailingLogs = cfg.TrailingLogs
	}
	if err := raft.ValidateConfig(rc); err != nil {
		_ = trans.Close()
		return fail(fmt.Errorf("consensus: raft config: %w", err))
	}

	has, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		_ = trans.Close()
		return fail(fmt.Errorf("consensus: read raft state: %w", err))
	}
	if !has && !cfg.Join {
		logger.Info("bootstrapping a one-voter raft cluster")
		boot := raft.Configuration{Servers: []raft.Server{{
			Suffrage: raft.Voter, ID: raft.ServerID(cfg.NodeID), Address: raft.ServerAddress(cfg.AdvertiseAddr),
		}}}
		if err := raft.BootstrapCluster(rc, store, store, snaps, trans, boot); err != nil {
			_ = trans.Close()
			return fail(fmt.Errorf("consensus: bootstrap: %w", err))
		}
	}
	r, err := raft.NewRaft(rc, n.fsm, store, store, snaps, trans)
	if err != nil {
		_ = trans.Close()
		return fail(fmt.Errorf("consensus: start raft: %w", err))
	}
	n.raft = r
	n.restored, n.started = has, cfg.Clock.Now()
	n.wg.Add(1)
	go n.watchLeadership()
	if !has && cfg.Join {
		n.wg.Add(1)
		if cfg.BootstrapExpect > 0 {
			go n.expectLoop()
		} else {
			go n.warnNoLeader()
		}
	}
	logger.Info("consensus started", "addr", cfg.AdvertiseAddr, "existing_state", has, "join", cfg.Join, "bootstrap_expect", cfg.BootstrapExpect)
	go n.watchLeader()
	return n, nil
}

func setIf(dst *time.Duration, v time.Duration) {
	if v > 0 {
		*dst = v
	}
}

// State is a read-only view of this node's copy of the replicated state.
func (n *Node) State() View { return View{f: n.fsm} }

// RaftBytes returns the bytes raft's transport received and sent since
// the node started (entries, heartbeats, votes and snapshots, above the
// RPC port's handshake and TLS).
func (n *Node) RaftBytes() (in, out uint64) { return n.raftBytes.in.Load(), n.raftBytes.out.Load() }

// ID is the node id.
func (n *Node) ID() string { return n.cfg.NodeID }

// CaughtUp reports whether this replica knows a leader and has applied
// every entry in its log, so local reads are as fresh as replication allows.
// A restarted node is not caught up until it has heard from a leader.
//
// A follower learns of entries it lacks only from the leader's next
// appends, so right after first contact its log can look complete while it
// is not; the replica therefore counts as caught up only after a leader has
// been known for caughtUpGrace.
func (n *Node) CaughtUp() bool {
	if n.Leader() == "" {
		return false
	}
	first := n.leaderSeen.Load()
	if first == 0 {
		return false
	}
	return n.cfg.Clock.Now().Sub(time.Unix(0, first)) >= caughtUpGrace && n.raft.AppliedIndex() >= n.raft.LastIndex()
}

// Usable reports whether this replica of the keys and policy can serve
// reads, which is all inference needs: it has caught up with a leader since
// this process started (and stays usable when the leader is lost later: a
// lost quorum stops writes, not reads), or it restarted from state on disk
// and no leader has appeared within restoredGrace (a mesh that lost its
// quorum while this node was down; its keys are those on disk).
func (n *Node) Usable() bool {
	if n.usable.Load() {
		return true
	}
	if n.CaughtUp() {
		n.usable.Store(true)
		return true
	}
	return n.restored && n.Leader() == "" && n.cfg.Clock.Now().Sub(n.started) >= restoredGrace
}

// restoredGrace is how long a node restarted from disk waits for a leader
// before its replica counts as usable without one: several election
// timeouts, so a healthy mesh elects a leader well within it.
const restoredGrace = 10 * time.Second

// watchLeader records when this node first learns of a leader, for
// CaughtUp, then when its replica first caught up, for Usable.
func (n *Node) watchLeader() {
	for n.raft.State() != raft.Shutdown {
		if n.leaderSeen.Load() == 0 && n.Leader() != "" {
			n.leaderSeen.Store(n.cfg.Clock.Now().UnixNano())
		}
		if n.leaderSeen.Load() != 0 && n.CaughtUp() {
			n.usable.Store(true)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// caughtUpGrace is how long a leader must have been known before a
// restarted replica's reads count as fresh: several heartbeats.
const caughtUpGrace = 2 * time.Second

// IsLeader reports whether this node is the raft leader right now.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Leader returns the id of the leader this node knows of, or "".
func (n *Node) Leader() string {
	_, id := n.raft.LeaderWithID()
	return string(id)
}

// Server is one entry of the raft configuration.
type Server struct {
	ID string // node id
	// Address is where the server is dialled: the address the membership
	// layer last reported for it, else the one in the raft configuration.
	Address string
	Voter   bool // voter rather than non-voter
	Leader  bool // the leader as this node knows it
}

// Servers lists the raft configuration as this node knows it, sorted by id.
func (n *Node) Servers() ([]Server, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	leader := n.Leader()
	var out []Server
	for _, s := range f.Configuration().Servers {
		addr := string(s.Address)
		if a, err := n.members.ServerAddr(s.ID); err == nil {
			addr = string(a)
		}
		out = append(out, Server{ID: string(s.ID), Address: addr, Voter: s.Suffrage == raft.Voter, Leader: string(s.ID) == leader})
	}
	sortServers(out)
	return out, nil
}

// WaitForLeader blocks until this node knows a leader or ctx ends.
func (n *Node) WaitForLeader(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for n.Leader() == "" {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrNoLeader, ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Snapshot takes a raft snapshot now (raft also takes them on its own).
func (n *Node) Snapshot() error {
	err := n.raft.Snapshot().Error()
	if errors.Is(err, raft.ErrNothingNewToSnapshot) {
		return nil
	}
	return err
}

// Shutdown hands leadership to another voter when this node leads (so
// writes keep flowing while it drains), then closes the node. The node
// has left the mesh before (node's stopCluster); the new leader removes
// this server after the reap timeout.
func (n *Node) Shutdown(ctx context.Context) error {
	// From here forwarded commands are refused (callers retry on the next
	// leader); those under way answer before raft stops.
	n.serving.refuse()
	if n.IsLeader() && n.hasOtherVoter() {
		done := make(chan error, 1)
		go func() { done <- n.raft.LeadershipTransfer().Error() }()
		select {
		case err := <-done:
			if err != nil {
				n.logger.Warn("leadership transfer failed", "err", err)
			}
		case <-ctx.Done():
		}
	}
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	n.serving.wait(wait)
	cancel()
	return n.Close()
}

// Close stops raft and closes the stores. It does not change the raft
// configuration, so the node comes back as the same server when restarted
// from its data directory.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		close(n.shutdownCh)
		n.closeErr = n.raft.Shutdown().Error()
		n.wg.Wait()
		n.fwd.close()
		if n.ownedHTTP != nil {
			n.ownedHTTP.CloseIdleConnections()
		}
		if err := n.store.Close(); err != nil && n.closeErr == nil {
			n.closeErr = err
		}
		n.logger.Info("consensus stopped")
	})
	return n.closeErr
}

// streamLayer is raft's view of the shared RPC port: inbound raft
// connections from the mux, outbound ones announced with the raft byte.
type streamLayer struct {
	ln    net.Listener
	addr  net.Addr
	dial  func(addr string, timeout time.Duration) (net.Conn, error)
	bytes *raftBytes
}

// raftBytes counts the bytes raft's transport moved (payload above the
// mux handshake and TLS), both ways.
type raftBytes struct {
	in, out atomic.Uint64
}

// countedConn counts what crosses one raft connection.
type countedConn struct {
	net.Conn
	b *raftBytes
}

// Read reads and counts.
func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.b.in.Add(uint64(max(n, 0)))
	return n, err
}

// Write writes and counts.
func (c *countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.b.out.Add(uint64(max(n, 0)))
	return n, err
}

// Accept returns the next inbound raft connection.
func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, b: s.bytes}, nil
}

// Close closes the raft side of the mux.
func (s *streamLayer) Close() error { return s.ln.Close() }

// Addr is the advertised RPC address.
func (s *streamLayer) Addr() net.Addr { return s.addr }

// Dial opens a raft connection to addr.
func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := s.dial(string(addr), timeout)
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, b: s.bytes}, nil
}

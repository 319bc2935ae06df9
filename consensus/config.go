package consensus

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/consensus/rpcmux"
)

// Defaults for Config fields left zero.
const (
	DefaultVoters            = 3
	DefaultReapTimeout       = 5 * time.Minute
	DefaultReconcileInterval = 30 * time.Second
	DefaultApplyTimeout      = 10 * time.Second
	DefaultLeaderWait        = 3 * time.Second
	DefaultSnapshotRetain    = 2
)

// Clock tells the time. Consensus reads it only to stamp commands on the
// leader and to time membership reaping; the state machine never reads it.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
}

type systemClock struct{}

// Now reads the system clock.
func (systemClock) Now() time.Time { return time.Now() }

// MemberStatus is what the node's membership layer says about a peer.
type MemberStatus int

// Member statuses. A suspect peer is reported as alive.
const (
	MemberAlive MemberStatus = iota
	MemberFailed
	MemberLeft
)

// String names the status.
func (s MemberStatus) String() string {
	switch s {
	case MemberAlive:
		return "alive"
	case MemberFailed:
		return "failed"
	case MemberLeft:
		return "left"
	}
	return fmt.Sprintf("status(%d)", int(s))
}

// Member is one node as the membership layer sees it.
type Member struct {
	// ID is the node id, also the raft ServerID.
	ID string
	// RPCAddr is the node's advertised internal RPC address (raft + Connect).
	RPCAddr string
	// Status is alive, failed or left.
	Status MemberStatus
}

// MemberSource is the full membership view the leader's periodic reconcile
// pass compares raft's configuration with. The node implements it over the
// mesh; consensus only calls it.
type MemberSource interface {
	// Members returns the nodes the membership layer knows of now, with
	// their status; an alive member left out of the list is marked failed.
	Members() []Member
}

// PeerAuth authenticates the ConsensusService calls nodes make to each
// other (followers forwarding Apply to the leader). Consensus does not
// implement it: the node fills it (from mesh/peerauth, which signs each
// call under a key derived from the cluster secret).
type PeerAuth struct {
	// Client is installed on this node's ConsensusService clients; it
	// signs outgoing calls. Nil sends calls unsigned, which peers refuse.
	Client connect.Interceptor
	// Handler is installed on this node's ConsensusService handler; it
	// must refuse unauthenticated calls with CodeUnauthenticated. Nil
	// refuses every call.
	Handler connect.Interceptor
}

// Config configures one consensus node. NodeID, AdvertiseAddr, DataDir,
// RaftListener and ClusterSecret are required.
type Config struct {
	// NodeID is the node id: raft ServerID, memberlist name, X-Service-Backend.
	NodeID string
	// AdvertiseAddr is the internal RPC address peers dial (host:port); it
	// is this node's raft address.
	AdvertiseAddr string
	// DataDir holds raft/raft.db (log and stable store) and raft/snapshots.
	DataDir string
	// RaftListener yields inbound raft connections, normally
	// rpcmux.Mux.Raft(). Raft closes it on shutdown.
	RaftListener net.Listener
	// DialRaft opens an outbound raft connection; nil uses rpcmux.DialRaft
	// with ClusterSecret (the raft handshake).
	DialRaft func(addr string, timeout time.Duration) (net.Conn, error)
	// HTTPClient carries forwarded Apply calls; nil uses rpcmux.NewClient
	// (rpcmux.NewPeerClient under PeerTLS).
	HTTPClient *http.Client
	// PeerTLS, when set, puts this node's outbound raft connections and
	// forwarded calls under mutual TLS (the default DialRaft and
	// HTTPClient use it); the RaftListener's mux must use the same one
	// (rpcmux.WithPeerTLS). The cluster secret stays required on top.
	PeerTLS *rpcmux.PeerTLS

	// Join is true when the node was started with join addresses. A joining
	// node never bootstraps; the leader adds it when the mesh reports it.
	Join bool
	// BootstrapExpect, with Join, makes a node with no raft state wait
	// until the membership layer has reported this many alive servers
	// (itself included); the one with the lowest id then bootstraps raft
	// with all of them (see expect.go). Zero: a joining node never
	// bootstraps. Ignored without Join (the node bootstraps alone at once).
	BootstrapExpect int
	// OnBootstrap is called once, on its own goroutine, after this node
	// bootstrapped the cluster through BootstrapExpect. Nil does nothing.
	OnBootstrap func()
	// Voters is the largest number of voters, 3 or 5 (default 3). The
	// leader keeps the voter count odd: joining nodes start as non-voters
	// and are promoted two at a time (1 → 3 → 5) while enough alive
	// servers exist, so a two-server cluster has one voter and one
	// non-voter (see reconcile).
	Voters int
	// ReapTimeout is how long a failed server stays in the raft
	// configuration before the leader removes it (default 5m).
	ReapTimeout time.Duration
	// ReconcileInterval is the period of the leader's full membership pass
	// (default 30s).
	ReconcileInterval time.Duration
	// Members is the membership view for the periodic pass; nil limits
	// reconcile to what MemberJoined/Failed/Left reported.
	Members MemberSource

	// ClusterSecret keys the raft handshake of outbound raft connections
	// (rpcmux.DialRaft; the RaftListener's mux checks inbound ones with
	// the same secret). Required.
	ClusterSecret string
	// PeerAuth signs and checks forwarded Apply calls. Without a Handler
	// every call to this node is refused.
	PeerAuth PeerAuth

	// ApplyTimeout bounds one raft Apply on the leader (default 10s).
	ApplyTimeout time.Duration
	// LeaderWait is how long Apply on a follower keeps looking for a
	// reachable leader before it returns ErrNoLeader (default 3s).
	LeaderWait time.Duration

	// Raft timers; zero keeps hashicorp/raft's defaults. Tests use small ones.
	HeartbeatTimeout   time.Duration // raft HeartbeatTimeout
	ElectionTimeout    time.Duration // raft ElectionTimeout
	LeaderLeaseTimeout time.Duration // raft LeaderLeaseTimeout
	CommitTimeout      time.Duration // raft CommitTimeout
	// SnapshotInterval and SnapshotThreshold control automatic snapshots;
	// zero keeps raft's defaults (120s, 8192 entries).
	SnapshotInterval  time.Duration // raft SnapshotInterval
	SnapshotThreshold uint64        // raft SnapshotThreshold
	// TrailingLogs is how many entries stay in the log after a snapshot;
	// zero keeps raft's default (10240).
	TrailingLogs uint64
	// SnapshotRetain is how many snapshots stay on disk (default 2).
	SnapshotRetain int

	// OnFatal is called once, on its own goroutine, when the state machine
	// meets a log entry it must not skip (an unknown, non-ignorable command
	// or an undecodable entry). The state machine has stopped applying; the
	// node must shut down. Nil only logs.
	OnFatal func(error)

	// Logger receives consensus and raft logs; nil discards.
	Logger *slog.Logger
	// Registerer receives this node's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Clock stamps commands and times reaping; nil uses the system clock.
	Clock Clock
}

func (c *Config) withDefaults() (Config, error) {
	cfg := *c
	if cfg.NodeID == "" {
		return cfg, errors.New("consensus: NodeID is required")
	}
	if cfg.AdvertiseAddr == "" {
		return cfg, errors.New("consensus: AdvertiseAddr is required")
	}
	if _, _, err := net.SplitHostPort(cfg.AdvertiseAddr); err != nil {
		return cfg, fmt.Errorf("consensus: AdvertiseAddr: %w", err)
	}
	if cfg.DataDir == "" {
		return cfg, errors.New("consensus: DataDir is required")
	}
	if cfg.RaftListener == nil {
		return cfg, errors.New("consensus: RaftListener is required")
	}
	if cfg.ClusterSecret == "" {
		return cfg, errors.New("consensus: ClusterSecret is required (it authenticates raft connections)")
	}
	if cfg.Voters == 0 {
		cfg.Voters = DefaultVoters
	}
	if cfg.Voters != 3 && cfg.Voters != 5 {
		return cfg, fmt.Errorf("consensus: Voters must be 3 or 5, got %d", cfg.Voters)
	}
	if cfg.BootstrapExpect < 0 {
		return cfg, fmt.Errorf("consensus: BootstrapExpect must not be negative, got %d", cfg.BootstrapExpect)
	}
	if cfg.ReapTimeout <= 0 {
		cfg.ReapTimeout = DefaultReapTimeout
	}
	if cfg.ReconcileInterval <= 0 {
		cfg.ReconcileInterval = DefaultReconcileInterval
	}
	if cfg.ApplyTimeout <= 0 {
		cfg.ApplyTimeout = DefaultApplyTimeout
	}
	if cfg.LeaderWait <= 0 {
		cfg.LeaderWait = DefaultLeaderWait
	}
	if cfg.SnapshotRetain <= 0 {
		cfg.SnapshotRetain = DefaultSnapshotRetain
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	return cfg, nil
}

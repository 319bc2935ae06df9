package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Fixed addressing inside the namespace: node i (1-based) is 127.0.0.(10+i),
// client HTTP on port httpPortBase+i, gossip on 7946 and the internal RPC
// port on 7947 of its own address. Group ids tag each node's packets.
const (
	nodeIPBase   = 10
	httpPortBase = 8400
	gossipPort   = 7946
	rpcPort      = 7947
	gidBase      = 61000
)

// MaxNodes is the most nodes a cluster can have: node i's address is
// 127.0.0.(10+i), below the harness's own client addresses (.201 on).
const MaxNodes = 180

// NodeState is the harness's view of a node.
type NodeState string

// Node states.
const (
	StateDown     NodeState = "down"     // no process
	StateStarting NodeState = "starting" // process started, not ready yet
	StateUp       NodeState = "up"       // ready
	StateDraining NodeState = "draining" // SIGTERM sent, not exited yet
	StateStopped  NodeState = "stopped"  // SIGSTOP
)

// ClusterConfig says how to run the nodes of one scenario.
type ClusterConfig struct {
	// Bin is the infermesh binary.
	Bin string
	// Nodes is the node count.
	Nodes int
	// Dir holds data directories and logs (one folder per node).
	Dir string
	// Models are model folders imported into every node's data directory
	// (into the first ModelNodes nodes when that is set).
	Models []string
	// ModelNodes, when positive, imports Models only into nodes 1..ModelNodes
	// (a large mesh with models on a subset).
	ModelNodes int
	// JoinSeeds, when positive, has nodes join through nodes 1..JoinSeeds
	// only instead of through every other node.
	JoinSeeds int
	// Mesh joins the nodes with --join (needs the mesh flags); false runs
	// independent single nodes.
	Mesh bool
	// RequireKeys makes nodes listen on 0.0.0.0 (each on its own port) so
	// that they are not loopback-only and every request needs a key.
	RequireKeys bool
	// AdminKey is SERVICE_ADMIN_KEY on every node.
	AdminKey string
	// ClusterSecret and GossipKey are shared by all nodes.
	ClusterSecret, GossipKey string
	// Voters is --voters (0 leaves the default).
	Voters int
	// TagSources runs node i with group gidBase+i so the Firewall can tell
	// nodes' packets apart (root mode only).
	TagSources bool
	// DrainTimeout is --drain-timeout.
	DrainTimeout time.Duration
	// StartTimeout bounds one node's start-up (listening and ready).
	StartTimeout time.Duration
	// Security, when set, runs TLS on every client port and mutual TLS
	// between nodes with its certificates (see Security).
	Security *Security
	// ExtraArgs are appended to every serve command line.
	ExtraArgs []string
	// Log receives the harness's own lines.
	Log *slog.Logger
}

// Node is one node of the cluster. Its address and folders never change;
// its process does, across restarts.
type Node struct {
	// ID is the node id (also X-Service-Backend).
	ID string
	// Index is 1-based.
	Index int
	// IP is the node's own loopback address.
	IP netip.Addr
	// HTTPPort is the client port.
	HTTPPort int
	// DataDir is kept across restarts.
	DataDir string
	// LogPath collects the output of every incarnation.
	LogPath string
	// GID tags the node's packets (0 when untagged).
	GID int
	// Scheme is "https" when the client port serves TLS, else "http".
	Scheme string

	state       NodeState
	proc        *proc
	incarnation int
	expect      string // why the next exit is expected ("" = a crash)
}

// BaseURL is the node's client URL.
func (n *Node) BaseURL() string {
	return n.Scheme + "://" + net.JoinHostPort(n.IP.String(), strconv.Itoa(n.HTTPPort))
}

// GossipAddr is the node's memberlist address.
func (n *Node) GossipAddr() string { return net.JoinHostPort(n.IP.String(), strconv.Itoa(gossipPort)) }

// RPCAddr is the node's internal address (forwarding and raft).
func (n *Node) RPCAddr() string { return net.JoinHostPort(n.IP.String(), strconv.Itoa(rpcPort)) }

// Exit records how one node process ended.
type Exit struct {
	// Node is the node id.
	Node string `json:"node"`
	// Incarnation counts the node's starts: 1 for its first process, one more
	// per restart.
	Incarnation int `json:"incarnation"`
	// At is when the harness saw the process end (wall clock).
	At time.Time `json:"at"`
	// Code is the exit status; -1 when a signal ended the process or the
	// status is unknown.
	Code int `json:"code"`
	// Signal names the signal that ended the process ("" for a normal exit).
	Signal    string   `json:"signal,omitempty"`
	Expected  string   `json:"expected,omitempty"`   // SIGKILL, SIGTERM, teardown; empty = unexpected
	Crash     []string `json:"crash,omitempty"`      // crash markers from the log
	LastLines []string `json:"last_lines,omitempty"` // the log's end, for unexpected exits
}

// Transition is one change of a node's state, for the impairment model and
// the request classifier.
type Transition struct {
	// At is when the harness changed the state (wall clock, not an offset).
	At time.Time `json:"at"`
	// Node is the node id.
	Node string `json:"node"`
	// To is the state the node entered.
	To NodeState `json:"to"`
}

// Cluster runs the nodes of one scenario as real processes.
type Cluster struct {
	cfg   ClusterConfig
	log   *slog.Logger
	hc    *http.Client
	mu    sync.Mutex
	nodes []*Node
	procs []*proc // every process ever started, for the hygiene check
	exits []Exit
	trans []Transition
}

// NewCluster makes the folders, imports the models into every node's data
// directory and returns a cluster with every node down.
func NewCluster(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	if cfg.Nodes < 1 || cfg.Nodes > MaxNodes {
		return nil, fmt.Errorf("nodes %d: want 1..%d", cfg.Nodes, MaxNodes)
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 90 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{cfg: cfg, log: cfg.Log, hc: NewControlClient(2*time.Second, cfg.Security.ClientTLS())}
	for i := 1; i <= cfg.Nodes; i++ {
		n := &Node{
			ID:       "n" + strconv.Itoa(i),
			Index:    i,
			IP:       netip.AddrFrom4([4]byte{127, 0, 0, byte(nodeIPBase + i)}),
			HTTPPort: httpPortBase + i,
			Scheme:   "http",
			state:    StateDown,
		}
		if cfg.Security != nil {
			n.Scheme = "https"
		}
		n.DataDir = filepath.Join(cfg.Dir, n.ID, "data")
		n.LogPath = filepath.Join(cfg.Dir, n.ID, "node.log")
		if cfg.TagSources {
			n.GID = gidBase + i
		}
		if err := os.MkdirAll(n.DataDir, 0o755); err != nil {
			return nil, err
		}
		for _, m := range cfg.Models {
			if cfg.ModelNodes > 0 && i > cfg.ModelNodes {
				break
			}
			if out, err := runCmd(ctx, cfg.Bin, "models", "import", "--data-dir", n.DataDir, m); err != nil {
				return nil, fmt.Errorf("import %s into %s: %w %s", m, n.ID, err, out)
			}
		}
		c.nodes = append(c.nodes, n)
	}
	return c, nil
}

// Nodes returns every node in index order.
func (c *Cluster) Nodes() []*Node { return slices.Clone(c.nodes) }

// Node returns the node with id, or nil.
func (c *Cluster) Node(id string) *Node {
	for _, n := range c.nodes {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// State returns a node's state.
func (c *Cluster) State(id string) NodeState {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.Node(id); n != nil {
		return n.state
	}
	return StateDown
}

// InState returns the ids of nodes in any of the given states.
func (c *Cluster) InState(states ...NodeState) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, n := range c.nodes {
		if slices.Contains(states, n.state) {
			out = append(out, n.ID)
		}
	}
	return out
}

func (c *Cluster) setState(n *Node, s NodeState) {
	n.state = s
	c.trans = append(c.trans, Transition{At: time.Now(), Node: n.ID, To: s})
}

// Transitions returns every state change so far.
func (c *Cluster) Transitions() []Transition {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.trans)
}

// Exits returns every process exit so far.
func (c *Cluster) Exits() []Exit {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.exits)
}

func (c *Cluster) args(n *Node) ([]string, error) {
	listen := net.JoinHostPort(n.IP.String(), strconv.Itoa(n.HTTPPort))
	if c.cfg.RequireKeys {
		listen = net.JoinHostPort("0.0.0.0", strconv.Itoa(n.HTTPPort))
	}
	args := []string{"serve", "--listen", listen, "--data-dir", n.DataDir, "--node-id", n.ID,
		"--intra-op-threads", "1", "--drain-timeout", c.cfg.DrainTimeout.String()}
	if c.cfg.Mesh {
		args = append(args, "--gossip-listen", n.GossipAddr(), "--rpc-listen", n.RPCAddr(),
			"--cluster-secret", c.cfg.ClusterSecret)
		if c.cfg.GossipKey != "" {
			args = append(args, "--gossip-key", c.cfg.GossipKey)
		}
		if c.cfg.Voters > 0 {
			args = append(args, "--voters", strconv.Itoa(c.cfg.Voters))
		}
		// The first node bootstraps on its first start only; every other
		// start (and every restart, of any node) joins through all peers.
		if n.Index != 1 || n.incarnation > 0 {
			for _, p := range c.nodes {
				if c.cfg.JoinSeeds > 0 && p.Index > c.cfg.JoinSeeds {
					break
				}
				if p != n {
					args = append(args, "--join", p.GossipAddr())
				}
			}
		}
	}
	sec, err := c.cfg.Security.args(n, c.cfg.Mesh)
	if err != nil {
		return nil, fmt.Errorf("certificates for %s: %w", n.ID, err)
	}
	args = append(args, sec...)
	return append(args, c.cfg.ExtraArgs...), nil
}

// Start starts every node: the first alone (it bootstraps), then the rest
// together. It returns when all are ready.
func (c *Cluster) Start(ctx context.Context) error {
	if err := c.StartNode(ctx, c.nodes[0].ID); err != nil {
		return err
	}
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.StartNode(ctx, n.ID)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// StartNode starts a node that is down, with its data directory, and waits
// until it logs that it listens and /readyz answers 200.
func (c *Cluster) StartNode(ctx context.Context, id string) error {
	n := c.Node(id)
	if n == nil {
		return fmt.Errorf("no node %q", id)
	}
	c.mu.Lock()
	if n.state != StateDown {
		c.mu.Unlock()
		return fmt.Errorf("start %s: node is %s", id, n.state)
	}
	env := append(os.Environ(), "SERVICE_ADMIN_KEY="+c.cfg.AdminKey)
	args, err := c.args(n)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	p, err := startProc(c.cfg.Bin, args, env, n.LogPath, n.GID)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	n.proc, n.expect = p, ""
	c.procs = append(c.procs, p)
	n.incarnation++
	inc := n.incarnation
	c.setState(n, StateStarting)
	c.mu.Unlock()
	go c.watchExit(n, p, inc)

	c.log.Info("node starting", "node", id, "incarnation", inc, "pid", p.cmd.Process.Pid)
	deadline := time.NewTimer(c.cfg.StartTimeout)
	defer deadline.Stop()
	select {
	case <-p.log.listening:
	case <-p.done:
		return fmt.Errorf("node %s exited during start-up (see %s)", id, n.LogPath)
	case <-deadline.C:
		return fmt.Errorf("node %s did not log \"node listening\" within %s (see %s)", id, c.cfg.StartTimeout, n.LogPath)
	case <-ctx.Done():
		return ctx.Err()
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if c.ready(ctx, n) {
			c.mu.Lock()
			if n.proc == p && n.state == StateStarting {
				c.setState(n, StateUp)
			}
			c.mu.Unlock()
			c.log.Info("node ready", "node", id, "after", time.Since(p.started).Round(time.Millisecond))
			return nil
		}
		select {
		case <-tick.C:
		case <-p.done:
			return fmt.Errorf("node %s exited before it was ready (see %s)", id, n.LogPath)
		case <-deadline.C:
			return fmt.Errorf("node %s not ready within %s (see %s)", id, c.cfg.StartTimeout, n.LogPath)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *Cluster) ready(ctx context.Context, n *Node) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.BaseURL()+"/readyz", nil)
	if err != nil {
		return false
	}
	res, err := c.hc.Do(req) // a probe: public, no key (a key could count as a wrong one)
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

func (c *Cluster) watchExit(n *Node, p *proc, inc int) {
	<-p.done
	defer close(p.recorded) // after the unlock below: the state is down
	code, sig := p.exitDesc()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := Exit{Node: n.ID, Incarnation: inc, At: p.ended, Code: code, Signal: sig, Crash: p.log.crashLines()}
	if n.proc == p {
		e.Expected = n.expect
		c.setState(n, StateDown)
	}
	if e.Expected == "" {
		e.LastLines = p.log.lastLines()
	}
	c.exits = append(c.exits, e)
	if e.Expected == "" {
		c.log.Error("node exited unexpectedly", "node", n.ID, "code", code, "signal", sig, "log", n.LogPath)
	}
}

// procFor returns the running process of a node, marks why its exit will
// be expected (when expect is set) and moves it to state next (when set).
func (c *Cluster) procFor(id, expect string, next NodeState) (*proc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.Node(id)
	if n == nil || n.proc == nil || n.state == StateDown {
		return nil, fmt.Errorf("node %s is not running", id)
	}
	if expect != "" {
		n.expect = expect
	}
	if next != "" {
		c.setState(n, next)
	}
	return n.proc, nil
}

// Kill sends SIGKILL and waits for the exit.
func (c *Cluster) Kill(id string) error {
	p, err := c.procFor(id, "SIGKILL", StateDown)
	if err != nil {
		return err
	}
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	if !p.wait(15 * time.Second) {
		return fmt.Errorf("node %s still running 15s after SIGKILL", id)
	}
	return nil
}

// Terminate sends SIGTERM (the node drains) and waits for the exit, up to the
// drain timeout plus a margin; a node that does not exit is killed and the
// error says so.
func (c *Cluster) Terminate(id string) error {
	p, err := c.procFor(id, "SIGTERM", StateDraining)
	if err != nil {
		return err
	}
	if err := p.signal(syscall.SIGTERM); err != nil {
		return err
	}
	if !p.wait(c.cfg.DrainTimeout + 10*time.Second) {
		_ = p.signal(syscall.SIGKILL)
		p.wait(15 * time.Second)
		return fmt.Errorf("node %s did not exit within %s of SIGTERM; killed", id, c.cfg.DrainTimeout+10*time.Second)
	}
	// The exit is recorded (state down) by watchExit after done closes; a
	// restart right after must not find the node still draining.
	<-p.recorded
	return nil
}

// Pause sends SIGSTOP.
func (c *Cluster) Pause(id string) error {
	p, err := c.procFor(id, "", StateStopped)
	if err != nil {
		return err
	}
	return p.signal(syscall.SIGSTOP)
}

// Resume sends SIGCONT to a paused node.
func (c *Cluster) Resume(id string) error {
	c.mu.Lock()
	n := c.Node(id)
	if n == nil || n.state != StateStopped {
		c.mu.Unlock()
		return fmt.Errorf("node %s is not paused", id)
	}
	p := n.proc
	c.setState(n, StateUp)
	c.mu.Unlock()
	return p.signal(syscall.SIGCONT)
}

// Close kills every running node (paused ones included) and waits for them.
func (c *Cluster) Close() error {
	var procs []*proc
	c.mu.Lock()
	for _, n := range c.nodes {
		if n.proc != nil && n.state != StateDown {
			if n.expect == "" {
				n.expect = "teardown"
			}
			procs = append(procs, n.proc)
		}
	}
	c.mu.Unlock()
	var errs []error
	for _, p := range procs {
		_ = p.signal(syscall.SIGKILL)
	}
	for _, p := range procs {
		if !p.wait(15 * time.Second) {
			errs = append(errs, fmt.Errorf("pid %d survived SIGKILL", p.cmd.Process.Pid))
		}
	}
	return errors.Join(errs...)
}

// PID returns the process id of a node's running process (0 when down).
func (c *Cluster) PID(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.Node(id)
	if n == nil || n.proc == nil || n.state == StateDown {
		return 0
	}
	return n.proc.cmd.Process.Pid
}

// Running returns the pids of processes the cluster started that have not
// exited (and been reaped) yet.
func (c *Cluster) Running() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for _, p := range c.procs {
		select {
		case <-p.done:
		default:
			out = append(out, p.cmd.Process.Pid)
		}
	}
	return out
}

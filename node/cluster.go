package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/rpcmux"
	"github.com/infermesh/infermesh/mesh"
	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/mesh/peerauth"
	"github.com/infermesh/infermesh/mesh/route"
	"github.com/infermesh/infermesh/mesh/transfer"
	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/dispatch"
	"github.com/infermesh/infermesh/node/models"
)

// cluster holds the parts that make a node a member of the mesh: the
// internal RPC port (Connect + raft through one multiplexer), the raft
// group, memberlist gossip, forwarding and the dispatcher.
type cluster struct {
	mux    *rpcmux.Mux
	rpcSrv *http.Server
	raft   *consensus.Node
	mesh   *mesh.Mesh
	fwdSrv *forward.Server
	fwdCli *forward.Client
	// xferSrv and xferCli move model files between nodes (pulls).
	xferSrv  *transfer.Server
	xferCli  *transfer.Client
	disp     *dispatch.Dispatcher
	sub      *mesh.Subscription
	done     chan struct{} // closed once, by stopCluster
	doneOnce sync.Once
}

// advertiseHost is the host peers dial for this node's listeners.
func (n *Node) advertiseHost(bound string) (string, error) {
	if n.cfg.Advertise != "" {
		return n.cfg.Advertise, nil
	}
	host, _, err := net.SplitHostPort(bound)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if len(n.cfg.Join) > 0 {
			return "", fmt.Errorf("listening on all interfaces (%s): set --advertise to the address peers should dial", bound)
		}
		return "127.0.0.1", nil
	}
	return host, nil
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// clusterStart carries what the steps of startCluster hand each other.
type clusterStart struct {
	secret   string // the cluster secret (generated for a lone node)
	host     string // the host peers dial
	rpcAddr  string // the advertised RPC address
	httpAddr string // the bound client listener
	peerTLS  *rpcmux.PeerTLS
	signer   *peerauth.Signer
	verifier *peerauth.Verifier
	join     bool // raft joins an existing group
}

// startCluster opens the RPC port, starts raft and gossip, and builds the
// forwarding server, client and dispatcher, one named step at a time.
// httpAddr is the bound client listener, advertised to peers. A step that
// fails stops what the earlier ones started through stopCluster, the same
// teardown a drain ends with (it skips the parts not built yet).
func (n *Node) startCluster(httpAddr string) (err error) {
	c := n.cluster
	s := &clusterStart{secret: n.clusterSecret(), httpAddr: httpAddr}
	defer func() {
		if err != nil {
			n.stopCluster(context.Background())
		}
	}()
	steps := []func(*cluster, *clusterStart) error{
		n.openRPC,       // RPC port, mux, peerauth signer and verifier
		n.startRaft,     // the raft group (consensus.New)
		n.startAdmitter, // authenticator, busy gate, limiter
		n.startGossip,   // memberlist, membership relay, rejoin loop
		n.startDispatch, // forward client and the dispatcher
		n.serveRPC,      // forward and transfer servers on the RPC port
	}
	for _, step := range steps {
		if err := step(c, s); err != nil {
			return err
		}
	}
	n.publishModels()
	c.mesh.SetHealth(route.HealthReady)
	n.log.Info("mesh member", "rpc", s.rpcAddr, "gossip", c.mesh.GossipAddr(), "join", n.cfg.Join)
	return nil
}

// clusterSecret is --cluster-secret, or a fresh one for a lone node.
func (n *Node) clusterSecret() string {
	if n.cfg.ClusterSecret != "" {
		return n.cfg.ClusterSecret
	}
	var b [32]byte
	rand.Read(b[:])
	n.log.Info("no cluster secret set: generated one for this single node; peers need --cluster-secret to join")
	return hex.EncodeToString(b[:])
}

// openRPC opens the RPC port behind its multiplexer and builds the
// peerauth signer and verifier.
//
// Every node-to-node byte is authenticated with the secret, which never
// leaves the node: raft connections by the mux's handshake, Connect calls
// by peerauth signatures (one verifier, so one replay cache and one
// refusal counter, for every service on the port), and gossip by a key
// derived from it unless --gossip-key is given. With --peer-cert the RPC
// port is mutual TLS only (rpcmux); the secret keeps authenticating raft
// and every call inside it.
func (n *Node) openRPC(c *cluster, s *clusterStart) error {
	ln, err := net.Listen("tcp", n.cfg.RPCListen)
	if err != nil {
		return fmt.Errorf("rpc listen on %s: %w", n.cfg.RPCListen, err)
	}
	if s.host, err = n.advertiseHost(ln.Addr().String()); err != nil {
		ln.Close()
		return err
	}
	s.rpcAddr = net.JoinHostPort(s.host, portOf(ln.Addr().String()))
	s.peerTLS = n.tls.peerTLS()
	if c.mux, err = rpcmux.New(ln, s.secret, n.log, rpcmux.WithPeerTLS(s.peerTLS)); err != nil {
		ln.Close()
		return err
	}
	// From here stopCluster closes the listener with the mux.
	if s.signer, err = peerauth.NewSigner(s.secret, peerauth.Options{}); err != nil {
		return err
	}
	if s.verifier, err = peerauth.NewVerifier(s.secret, peerauth.Options{Logger: n.log, Registerer: n.reg}); err != nil {
		return err
	}
	if n.reg != nil {
		if err := n.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "rpc", Name: "raft_handshake_refused_total",
			Help: "Raft connections to the RPC port closed because they did not prove the cluster secret.",
		}, func() float64 { return float64(c.mux.RaftRefused()) })); err != nil {
			return err
		}
		if err := n.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "rpc", Name: "tls_refused_total",
			Help: "Connections to the RPC port refused by peer TLS (not TLS, no or an untrusted or expired certificate).",
		}, func() float64 { return float64(c.mux.TLSRefused()) })); err != nil {
			return err
		}
	}
	go c.mux.Serve()
	return nil
}

// startRaft starts the raft group on the mux's raft listener, and the
// background writes that need it (admin key, replicated audit key).
func (n *Node) startRaft(c *cluster, s *clusterStart) error {
	cfg := n.cfg
	s.join = len(n.joinAddrs()) > 0
	rc := consensus.Config{
		NodeID:        cfg.NodeID,
		AdvertiseAddr: s.rpcAddr,
		DataDir:       cfg.DataDir,
		RaftListener:  c.mux.Raft(),
		Join:          s.join,
		Voters:        cfg.Voters,
		// The node that bootstraps through --bootstrap-expect creates the
		// bootstrap admin key, as a lone bootstrapping node does.
		BootstrapExpect: cfg.BootstrapExpect,
		OnBootstrap:     func() { n.ensureAdminKey(true) },
		Members:         memberSource{n},
		ClusterSecret:   s.secret,
		PeerTLS:         s.peerTLS,
		PeerAuth:        consensus.PeerAuth{Client: s.signer, Handler: s.verifier},
		OnFatal:         n.fatal,
		Logger:          n.log,
		Registerer:      n.reg,
	}
	if cfg.FastTimers {
		rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout, rc.CommitTimeout = 300*time.Millisecond, 300*time.Millisecond, 200*time.Millisecond, 20*time.Millisecond
		rc.ReapTimeout, rc.ReconcileInterval = 30*time.Second, 2*time.Second
	}
	var err error
	if c.raft, err = consensus.New(rc); err != nil {
		return err
	}
	return nil
}

// startAdmitter builds admission over raft (admission.go) and starts the
// writes that wait for a leader.
func (n *Node) startAdmitter(_ *cluster, s *clusterStart) error {
	n.admission.start()
	go n.ensureAdminKey(!s.join)
	go n.ensureReplicated()
	return nil
}

// startGossip joins the mesh, relays its membership events to raft and
// keeps asking remembered peers back.
func (n *Node) startGossip(c *cluster, s *clusterStart) error {
	cfg := n.cfg
	mc := mesh.Config{
		NodeID:        cfg.NodeID,
		BindAddr:      cfg.GossipListen,
		HTTPAddr:      net.JoinHostPort(s.host, portOf(s.httpAddr)),
		RPCAddr:       s.rpcAddr,
		Version:       cfg.Version,
		Join:          n.joinAddrs(),
		AdvertiseAddr: cfg.Advertise,
		ClusterSecret: s.secret, // the gossip key unless --gossip-key
	}
	var err error
	if cfg.GossipKey != "" {
		if mc.EncryptionKey, err = mesh.ParseKey(cfg.GossipKey); err != nil {
			return fmt.Errorf("gossip key: %w", err)
		}
	}
	if gh, _, _ := net.SplitHostPort(cfg.GossipListen); isLoopbackHost(gh) {
		mc.Timers = mesh.LocalTimers()
	}
	if cfg.FastTimers {
		mc.Timers = mesh.TestTimers()
		mc.JoinBackoffMin, mc.JoinBackoffMax = 50*time.Millisecond, time.Second
	}
	if c.mesh, err = mesh.New(mc, n.log, n.reg, n.clock); err != nil {
		return err
	}
	c.mesh.SetRouting(mesh.Routing{MaxInFlight: cfg.InflightCap, Weight: cfg.Weight, Canary: cfg.Canary, CanaryPercent: cfg.CanaryPercent})
	c.sub = c.mesh.Subscribe(mesh.EventJoin, mesh.EventUpdate, mesh.EventLeave, mesh.EventFailed)
	go n.relayMembership(c.sub)
	go n.reconnectLoop(c)
	return nil
}

// startDispatch builds the forward client and the dispatcher over the
// replicated routing policy, and registers the cluster's metrics.
func (n *Node) startDispatch(c *cluster, s *clusterStart) error {
	cfg := n.cfg
	strategy, err := route.ParseStrategy(cfg.Strategy)
	if err != nil {
		return err
	}
	policy := &replicatedPolicy{raft: c.raft, fallback: dispatch.Policy{Strategy: strategy}}
	go n.seedPolicy()
	fc := forward.ClientConfig{NodeID: cfg.NodeID, Signer: s.signer, MuxMaxBody: -1}
	if cfg.ForwardStream {
		fc.MuxMaxBody = 0 // the client's default size limit
	}
	if s.peerTLS != nil {
		fc.Dial = s.peerTLS.DialContext(rpcmux.ALPNHTTP1, 2*time.Second)
		fc.DialHTTP2 = s.peerTLS.DialContext(rpcmux.ALPNHTTP2, 2*time.Second) // Relay (upgrades) runs over HTTP/2
	}
	if c.fwdCli, err = forward.NewClient(fc, n.log, n.reg); err != nil {
		return err
	}
	if c.disp, err = dispatch.New(dispatch.Config{
		NodeID:      cfg.NodeID,
		MaxInFlight: cfg.InflightCap,
		WriteError: func(w http.ResponseWriter, r *http.Request, status int, msg string) {
			typ, code := apierr.TypeServer, apierr.CodeOverloaded
			if status == http.StatusBadGateway {
				code = apierr.CodeInternal
			}
			e := apierr.New(status, typ, code, "", msg)
			apierr.Write(w, e)
		},
		Clock: n.clock,
	}, n.obs.trace.serve(n.admission.gateLocal(n.api.LocalHandler()), cfg.NodeID), c.mesh, n.obs.trace.forwarder(c.fwdCli), policy, c.mesh, n.log, n.reg); err != nil {
		return err
	}
	return n.obs.registerCluster(c)
}

// serveRPC builds the forward and transfer servers and the transfer
// client, and serves them, raft's Connect services included, on the RPC
// port.
func (n *Node) serveRPC(c *cluster, s *clusterStart) error {
	cfg := n.cfg
	var err error
	if c.fwdSrv, err = forward.NewServer(forward.ServerConfig{NodeID: cfg.NodeID, Verifier: s.verifier}, c.disp.Local(), n.log, n.reg); err != nil {
		return err
	}
	if c.xferSrv, err = transfer.NewServer(transfer.ServerConfig{NodeID: cfg.NodeID, Verifier: s.verifier, RateBytes: int64(cfg.TransferRate)},
		storeFiles{n.store}, n.log, n.reg); err != nil {
		return err
	}
	var xferOpts []transfer.ClientOption
	if s.peerTLS != nil {
		xferOpts = append(xferOpts, transfer.WithDialer(s.peerTLS.DialContext(rpcmux.ALPNHTTP1, 2*time.Second)))
	}
	if c.xferCli, err = transfer.NewClient(cfg.NodeID, s.secret, xferOpts...); err != nil {
		return err
	}
	rpc := http.NewServeMux()
	path, h := c.xferSrv.Handler()
	rpc.Handle(path, h)
	path, h = c.raft.Handler()
	rpc.Handle(path, h)
	path, h = c.raft.AdminHandler()
	rpc.Handle(path, h)
	path, h = c.fwdSrv.Handler()
	rpc.Handle(path, h)
	c.rpcSrv = forward.NewHTTPServer(rpc, n.log)
	if s.peerTLS != nil {
		// The mux hands TLS connections over; serve HTTP/2 on those that
		// negotiated h2 (forward's server enables only h2c).
		c.rpcSrv.Protocols.SetHTTP2(true)
	}
	go c.rpcSrv.Serve(c.mux.HTTP())
	return nil
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// peersFile remembers the gossip addresses of the last known peers, so a
// restarted node finds its mesh even when the nodes named by --join are gone.
func (n *Node) peersFile() string { return filepath.Join(n.cfg.DataDir, "mesh-peers.json") }

// joinAddrs is --join plus the remembered peers.
func (n *Node) joinAddrs() []string {
	out := append([]string(nil), n.cfg.Join...)
	b, err := os.ReadFile(n.peersFile())
	if err != nil {
		return out
	}
	var known []string
	if json.Unmarshal(b, &known) != nil {
		return out
	}
	for _, a := range known {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// rememberPeers writes the current peers' gossip addresses.
func (n *Node) rememberPeers() {
	var addrs []string
	for _, p := range n.cluster.mesh.Peers() {
		if !p.Self && p.GossipAddr != "" {
			addrs = append(addrs, p.GossipAddr)
		}
	}
	if len(addrs) == 0 {
		return
	}
	sort.Strings(addrs)
	b, _ := json.Marshal(addrs)
	tmp := n.peersFile() + ".tmp"
	if os.WriteFile(tmp, b, 0o644) == nil {
		os.Rename(tmp, n.peersFile())
	}
}

// reconnectLoop periodically joins remembered peers that gossip no longer
// lists: memberlist does not re-merge nodes it declared dead after a
// partition heals (the chaos suite found this), so the node asks them
// again, as Serf's reconnect does.
func (n *Node) reconnectLoop(c *cluster) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		current := map[string]bool{}
		for _, p := range c.mesh.Peers() {
			current[p.GossipAddr] = true
		}
		var missing []string
		for _, a := range n.joinAddrs() {
			if !current[a] {
				missing = append(missing, a)
			}
		}
		if len(missing) > 0 {
			if k, err := c.mesh.Join(missing); err == nil && k > 0 {
				n.log.Info("rejoined peers", "contacted", k)
			}
		}
	}
}

// relayMembership turns mesh events into raft membership hooks.
func (n *Node) relayMembership(sub *mesh.Subscription) {
	for ev := range sub.C {
		if ev.Type == mesh.EventJoin {
			n.rememberPeers()
		}
		p := ev.Peer
		if p.ID == n.cfg.NodeID {
			continue
		}
		switch ev.Type {
		case mesh.EventJoin, mesh.EventUpdate:
			if p.RPCAddr != "" {
				n.cluster.raft.MemberJoined(p.ID, p.RPCAddr)
			}
		case mesh.EventFailed, mesh.EventLeave:
			// A node that leaves gracefully is usually draining for a
			// restart: it stays a raft voter until the reap timeout, like
			// a failed one. Removing it at once shrinks the quorum, and
			// with another voter down the group can lose its majority for
			// good (the multi-process restart test hit exactly that).
			n.cluster.raft.MemberFailed(p.ID)
		}
	}
}

// memberSource gives raft's reconcile pass the mesh's view of members.
type memberSource struct{ n *Node }

// Members lists the nodes gossip knows, with this node first.
func (s memberSource) Members() []consensus.Member {
	c := s.n.cluster
	if c.mesh == nil {
		return nil
	}
	var out []consensus.Member
	for _, p := range c.mesh.Peers() {
		out = append(out, consensus.Member{ID: p.ID, RPCAddr: p.RPCAddr, Status: consensus.MemberAlive})
	}
	return out
}

// publishModels tells the mesh which models this node has and which are warm.
func (n *Node) publishModels() { publishModels(n.cluster, n.store, n.engines) }

// publishModels gossips the installed (and provider) models of store and
// engines, and which are warm, once the mesh runs.
func publishModels(c *cluster, store *models.Store, e *engines) {
	if c.mesh == nil {
		return
	}
	var installed []string
	info := map[string]mesh.ModelInfo{}
	for _, m := range store.List() {
		installed = append(installed, m.ID)
		info[m.ID] = mesh.ModelInfo{WireID: m.WireID(), Task: m.Task, Created: m.Created, SizeBytes: m.TotalSize()}
	}
	up := e.publishUpstream(info)
	c.mesh.SetModelInfo(info)
	c.mesh.SetModels(append(installed, up...), append(e.warmIDs(), up...))
}

// drainCluster announces the drain and waits for local and forwarded work.
func (n *Node) drainCluster(ctx context.Context) error {
	c := n.cluster
	if c.mesh == nil {
		return nil
	}
	c.mesh.SetHealth(route.HealthDraining)
	c.fwdSrv.SetDraining(true)
	if c.xferSrv != nil {
		c.xferSrv.SetDraining(true)
	}
	return c.fwdSrv.Wait(ctx)
}

// stopCluster leaves gossip, hands off raft leadership and closes the RPC port.
func (n *Node) stopCluster(ctx context.Context) {
	c := n.cluster
	c.doneOnce.Do(func() { close(c.done) })
	if c.mesh != nil {
		if err := c.mesh.Leave(2 * time.Second); err != nil {
			n.log.Warn("leave mesh", "err", err)
		}
		c.sub.Close()
		c.mesh.Shutdown()
	}
	if n.admission.limiter != nil {
		n.admission.limiter.Close()
	}
	if c.raft != nil {
		if err := c.raft.Shutdown(ctx); err != nil {
			n.log.Warn("raft shutdown", "err", err)
		}
	}
	if c.rpcSrv != nil {
		c.rpcSrv.Close()
	}
	if c.fwdCli != nil {
		c.fwdCli.Close()
	}
	if c.xferCli != nil {
		c.xferCli.Close()
	}
	if c.mux != nil {
		c.mux.Close()
	}
}

// GossipAddr is the address peers pass to --join to reach this node.
func (n *Node) GossipAddr() string {
	if n.cluster.mesh == nil {
		return ""
	}
	return n.cluster.mesh.GossipAddr()
}

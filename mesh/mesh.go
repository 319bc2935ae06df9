// Package mesh connects a node to its peers over hashicorp/memberlist. It
// gossips the node's stable identity (NodeMeta) and its per-node record
// (health, load, models, routing settings), keeps the peer table that
// routing reads, ejects peers that refuse connections, and tells
// subscribers about joins, leaves and updates. See DESIGN.md.
package mesh

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/mesh/route"
	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

// Mesh is one node's membership in the mesh. Create it with New; it is safe
// for concurrent use.
type Mesh struct {
	cfg   Config
	log   *slog.Logger
	clock func() time.Time
	met   *metrics

	ml      *memberlist.Memberlist
	queue   *memberlist.TransmitLimitedQueue
	meta    []byte
	table   *table
	local   *localState
	hub     *hub
	evMu    sync.Mutex // orders table changes with their events
	maxCast int        // largest record sent through UDP gossip
	bytes   *gossipBytes

	joined     chan struct{}
	joinedOnce sync.Once
	memberCh   chan struct{} // membership changed (wakes the join loop)
	greetCh    chan *memberlist.Node
	stop       chan struct{}
	stopOnce   sync.Once
	wg         sync.WaitGroup
	left       bool
}

// New starts memberlist on cfg.BindAddr and returns the node's mesh. Without
// join addresses the node is a mesh of one; with them it joins in the
// background, retrying with backoff until one answers (see Joined). The
// node's record starts as HealthAlive with no models; the node reports
// readiness with SetHealth once it can serve.
func New(cfg Config, logger *slog.Logger, reg prometheus.Registerer, clock func() time.Time) (*Mesh, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if clock == nil {
		clock = time.Now
	}
	logger = logger.With("component", "mesh", "node", cfg.NodeID)
	meta, err := encodeMeta(Identity{NodeID: cfg.NodeID, HTTPAddr: cfg.HTTPAddr, RPCAddr: cfg.RPCAddr, Version: cfg.Version})
	if err != nil {
		return nil, err
	}
	mc, err := cfg.memberlistConfig()
	if err != nil {
		return nil, err
	}
	gb := &gossipBytes{}
	m := &Mesh{
		cfg:      cfg,
		log:      logger,
		clock:    clock,
		meta:     meta,
		bytes:    gb,
		table:    newTable(cfg.NodeID, clock, cfg.EjectHold),
		local:    newLocalState(cfg.NodeID, uint64(clock().UnixNano()), cfg.LatencyAlpha, clock),
		hub:      newHub(),
		joined:   make(chan struct{}),
		memberCh: make(chan struct{}, 1),
		greetCh:  make(chan *memberlist.Node, greetQueue),
		stop:     make(chan struct{}),
		// Leave room in a UDP packet for memberlist's framing, compound
		// headers, a label and encryption.
		maxCast: mc.UDPBufferSize - 256,
	}
	m.met, err = newMetrics(reg, func() float64 { return float64(m.table.members.Load()) }, gb)
	if err != nil {
		return nil, fmt.Errorf("mesh: metrics: %w", err)
	}
	m.queue = &memberlist.TransmitLimitedQueue{
		NumNodes:       func() int { return int(max(m.table.members.Load(), 1)) },
		RetransmitMult: mc.RetransmitMult,
	}
	d := &delegate{m: m}
	mc.Delegate = d
	mc.Events = d
	mc.Logger = newStdLogger(logger)
	if mc.Ping, err = newGossipMetrics(reg, m); err != nil {
		return nil, fmt.Errorf("mesh: metrics: %w", err)
	}
	// The node's first record must exist before memberlist can ask for it.
	m.publishLocked(m.local.next())
	if err := cfg.attachTransport(mc, gb); err != nil {
		return nil, err
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("mesh: start memberlist: %w", err)
	}
	m.ml = ml
	m.log.Info("mesh started", "gossip", m.GossipAddr(), "encrypted", cfg.EncryptionKey != nil, "join", cfg.Join)
	m.wg.Add(3)
	go m.publishLoop()
	go m.joinLoop()
	go m.greetLoop()
	return m, nil
}

// GossipBytes returns the bytes the gossip transport received and sent
// since the node started (UDP payloads and TCP stream bytes as they cross
// the wire, encrypted when gossip is; IP and UDP headers not included).
func (m *Mesh) GossipBytes() (in, out uint64) { return m.bytes.in.Load(), m.bytes.out.Load() }

// LocalID returns this node's id.
func (m *Mesh) LocalID() string { return m.cfg.NodeID }

// GossipAddr returns the gossip address peers dial (host:port).
func (m *Mesh) GossipAddr() string {
	n := m.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Joined is closed once the node has joined through one of its join
// addresses, or at once when it has none.
func (m *Mesh) Joined() <-chan struct{} { return m.joined }

// Join contacts the given gossip addresses now and returns how many
// answered. The background join loop uses it; tests and tools may call it
// directly. It fails when no address answers, for example when the other
// side uses a different encryption key.
func (m *Mesh) Join(addrs []string) (int, error) {
	n, err := m.ml.Join(addrs)
	if n > 0 {
		m.met.joins.WithLabelValues("ok").Inc()
		m.joinedOnce.Do(func() { close(m.joined) })
		return n, nil
	}
	m.met.joins.WithLabelValues("failed").Inc()
	if err == nil {
		err = errors.New("no join address answered")
	}
	return 0, fmt.Errorf("mesh: join %v: %w", addrs, err)
}

// Peers returns a view of every member, this node included, sorted by id.
// The slice is a shared snapshot: do not modify it or its Models maps.
func (m *Mesh) Peers() []route.Peer { return m.table.snapshot() }

// Peer returns the view of one member.
func (m *Mesh) Peer(id string) (route.Peer, bool) {
	for _, p := range m.table.snapshot() {
		if p.ID == id {
			return p, true
		}
	}
	return route.Peer{}, false
}

// Serving returns the members that can take a request for model now
// (routable, model installed), each with its load, sorted by id. Peers
// without room are included; see route.Peer.HasRoom. The list is prepared
// when gossip changes the table, not per call, so its cost does not grow
// with the number of members; it is a shared snapshot: do not modify it.
// The empty model is served by every routable member.
func (m *Mesh) Serving(model string) []route.Peer {
	if model == "" {
		var out []route.Peer
		for _, p := range m.table.snapshot() {
			if p.Routable() {
				out = append(out, p)
			}
		}
		return out
	}
	return m.table.serving(model)
}

// Eject takes a peer out of routing at once, typically because a connection
// to it was refused. It comes back when gossip delivers a newer record that
// says it is ready, at least Config.EjectHold later; every EjectHold while
// it stays ejected and a member, this node asks it for a fresh record
// directly. Ejecting this node itself, or an unknown node, does nothing.
func (m *Mesh) Eject(id string) {
	m.evMu.Lock()
	p, ok := m.table.eject(id)
	if ok {
		m.emitLocked(Event{Type: EventUpdate, Peer: p})
	}
	m.evMu.Unlock()
	if ok {
		m.met.ejections.Inc()
		m.log.Warn("peer ejected from routing", "peer", id)
		m.askRecordAfterHold(id)
	}
}

// Subscribe returns a subscription to the given event types (all types
// when none are given). Events that happened before the call are not
// replayed; read Peers for the current state.
func (m *Mesh) Subscribe(types ...EventType) *Subscription {
	return m.hub.subscribe(types)
}

// SetHealth sets this node's serving state and publishes it at once.
// SetHealth(route.HealthDraining) is how a node announces a drain.
func (m *Mesh) SetHealth(h route.Health) {
	if m.local.setHealth(h) {
		m.log.Info("health changed", "health", h.String())
		m.publish()
	}
}

// Health returns this node's own serving state.
func (m *Mesh) Health() route.Health { return m.local.getHealth() }

// SetModelInfo sets the descriptions (wire id, task, install time) that
// travel with the installed models, and publishes a change at once.
func (m *Mesh) SetModelInfo(info map[string]ModelInfo) {
	if m.local.setInfo(info) {
		m.publish()
	}
}

// SetModels sets the installed models and which of them are warm, and
// publishes the change at once. A warm model need not be listed as
// installed too.
func (m *Mesh) SetModels(installed, warm []string) {
	if m.local.setModels(installed, warm) {
		m.publish()
	}
}

// SetRouting sets this node's published routing settings (cap, weight,
// canary) and publishes the change at once.
func (m *Mesh) SetRouting(r Routing) {
	if m.local.setRouting(r) {
		m.publish()
	}
}

// SetInFlight records the number of requests this node serves now. Load
// changes are published every Config.RecordInterval.
func (m *Mesh) SetInFlight(n int) { m.local.setInFlight(n) }

// SetQueueDepth records the number of requests waiting in this node's
// engine queues.
func (m *Mesh) SetQueueDepth(n int) { m.local.setQueueDepth(n) }

// ObserveLatency adds one measurement of the time this node took to serve a
// request for model to the model's moving average.
func (m *Mesh) ObserveLatency(model string, d time.Duration) {
	if model != "" && d >= 0 {
		m.local.observe(model, d)
	}
}

// Leave announces that the node leaves, waits up to timeout for the
// announcement to spread, and shuts the mesh down. Announce draining with
// SetHealth first and let in-flight work finish before calling Leave.
func (m *Mesh) Leave(timeout time.Duration) error {
	select {
	case <-m.stop:
		return errors.New("mesh: leave after shutdown")
	default:
	}
	m.left = true
	// Tell every member directly that this is a leave, not a failure,
	// before memberlist announces it.
	m.local.setLeaving()
	m.evMu.Lock()
	r := m.local.next()
	m.publishLocked(r)
	m.evMu.Unlock()
	sent := make(chan struct{})
	go func() {
		m.sendAll(encodeRecord(r))
		close(sent)
	}()
	select {
	case <-sent:
	case <-time.After(timeout):
	}
	err := m.ml.Leave(timeout)
	if err != nil {
		m.log.Warn("leave", "err", err)
	}
	return errors.Join(err, m.Shutdown())
}

// Shutdown stops gossip at once without announcing a leave; peers will see
// the node fail. It is safe to call more than once.
func (m *Mesh) Shutdown() error {
	var err error
	m.stopOnce.Do(func() {
		close(m.stop)
		err = m.ml.Shutdown()
		m.wg.Wait()
		m.hub.closeAll()
		m.log.Info("mesh stopped", "left", m.left)
	})
	return err
}

// publish makes the next version of the local record and spreads it.
func (m *Mesh) publish() {
	m.evMu.Lock()
	defer m.evMu.Unlock()
	m.publishLocked(m.local.next())
}

func (m *Mesh) publishLocked(r *meshv1.NodeRecord) {
	ch := m.table.merge(r)
	m.met.published.Inc()
	if ch.significant && ch.isMember {
		m.emitLocked(Event{Type: EventUpdate, Peer: ch.view})
	}
	m.spread(r)
	if ch.significant && m.ml != nil {
		m.tellMembers(r)
	}
}

// tellMembers sends a significant change of this node's record (health,
// models, routing settings: rare) to every member directly, besides
// gossip. A change made while the mesh is still forming (a node turning
// ready right after it joined) reaches only the few members gossip knows
// then, and heartbeats, which used to repair that within seconds, are
// neither frequent nor relayed any more; members met later are greeted
// with the record as it is then.
func (m *Mesh) tellMembers(r *meshv1.NodeRecord) {
	if len(encodeRecord(r)) > m.maxCast {
		return // spread sends it over TCP to every member already
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for _, n := range m.ml.Members() {
			if n.Name == m.cfg.NodeID {
				continue
			}
			select {
			case <-m.stop:
				return
			default:
			}
			if err := m.sendDirect(n, r); err != nil {
				m.log.Debug("telling a member of a change", "peer", n.Name, "err", err)
			}
		}
	}()
}

func (m *Mesh) emitLocked(e Event) {
	m.met.events.WithLabelValues(e.Type.String()).Inc()
	m.hub.emit(e)
}

// publishLoop publishes load changes every RecordInterval and the whole
// record every RecordHeartbeat.
func (m *Mesh) publishLoop() {
	defer m.wg.Done()
	tick := time.NewTicker(m.cfg.RecordInterval)
	defer tick.Stop()
	last := m.clock()
	for {
		select {
		case <-m.stop:
			return
		case <-tick.C:
			now := m.clock()
			if m.local.loadCh.Load() || now.Sub(last) >= m.cfg.RecordHeartbeat {
				m.publish()
				last = now
			}
		}
	}
}

// joinLoop joins through the configured addresses, retrying with backoff,
// and joins again whenever the node finds itself alone.
func (m *Mesh) joinLoop() {
	defer m.wg.Done()
	if len(m.cfg.Join) == 0 {
		m.joinedOnce.Do(func() { close(m.joined) })
		return
	}
	delay := m.cfg.JoinBackoffMin
	for {
		if m.table.members.Load() <= 1 {
			if _, err := m.Join(m.resolveJoin(m.cfg.Join)); err != nil {
				// Jitter spreads nodes started together, so they do not
				// retry in lockstep.
				wait := delay/2 + rand.N(delay/2+1)
				m.log.Warn("join failed; will retry", "err", err, "retry_in", wait)
				select {
				case <-m.stop:
					return
				case <-time.After(wait):
				}
				delay = min(delay*2, m.cfg.JoinBackoffMax)
				continue
			}
			m.log.Info("joined mesh", "members", m.table.members.Load())
			delay = m.cfg.JoinBackoffMin
			m.wg.Add(1)
			go m.catchUp()
		}
		select {
		case <-m.stop:
			return
		case <-m.memberCh:
		}
	}
}

// catchUp runs a few full state exchanges (push-pull) with a random member
// shortly after the node joined. The join's own push-pull gave the node
// every member and record its seed knew then; nodes that joined the seed
// later reach it by gossip, whose few retransmits can miss a node, and
// memberlist's periodic push-pull repairs that only every
// PushPullInterval (30 s on a LAN). When many nodes start together this
// brings every node the full membership within seconds. The waits are 5,
// 20 and 60 gossip intervals (1 s, 4 s and 12 s more on a LAN); the last
// one catches members that joined the seeds after the first two, which
// matters past a few dozen nodes started together.
func (m *Mesh) catchUp() {
	defer m.wg.Done()
	for _, k := range []int{5, 20, 60} {
		select {
		case <-m.stop:
			return
		case <-time.After(time.Duration(k) * m.cfg.Timers.GossipInterval):
		}
		others := m.table.otherAddrs()
		if len(others) == 0 {
			return
		}
		addr := others[rand.N(len(others))]
		if _, err := m.ml.Join([]string{addr}); err != nil {
			m.log.Debug("catch-up push-pull", "peer", addr, "err", err)
		}
	}
}

// resolveJoin turns the join addresses into the addresses to contact now:
// a host name is looked up on every round, each of its addresses kept (a
// Kubernetes headless Service lists one per pod, and pods come and go),
// and this node's own gossip address is left out. A name that does not
// resolve is passed on as it is, for memberlist to report.
func (m *Mesh) resolveJoin(join []string) []string {
	self := m.GossipAddr()
	var out []string
	add := func(a string) {
		if a != self && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	for _, j := range join {
		host, port, err := net.SplitHostPort(j)
		if err != nil {
			host, port = j, strconv.Itoa(DefaultGossipPort)
		}
		if net.ParseIP(host) != nil {
			add(net.JoinHostPort(host, port))
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ips, err := net.DefaultResolver.LookupHost(ctx, host)
		cancel()
		if err != nil || len(ips) == 0 {
			add(j)
			continue
		}
		for _, ip := range ips {
			add(net.JoinHostPort(ip, port))
		}
	}
	// Only ourselves so far (a headless Service before the other pods are
	// published) leaves nothing to contact: the round fails and retries.
	return out
}

func (m *Mesh) membershipChanged() {
	select {
	case m.memberCh <- struct{}{}:
	default:
	}
}

package node

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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/audit"
	"github.com/infermesh/infermesh/node/batch"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/models"
	"github.com/infermesh/infermesh/node/prefix"
)

// Node is one running infermesh node.
type Node struct {
	cfg   Config
	log   *slog.Logger
	clock func() time.Time
	reg   *prometheus.Registry
	obs   *observer // request metrics and tracing (observe.go, tracing.go)

	prefixes *prefix.Tracker // chat prefixes served here, for prefix-aware routing
	audit    *audit.Log      // signed audit records; nil when off

	store   *models.Store
	catalog *models.Catalog
	puller  *models.Puller
	engines *engines
	batches *batch.Manager
	api     *api.Server

	// cluster holds the mesh parts; New allocates it empty and
	// startCluster fills it, so the adapters below hold it from the start.
	cluster *cluster
	// The adapters the API talks to, one per role, each built from its
	// own dependencies (backend.go, admission.go, dispatcher.go).
	backend    *backend
	admission  *admission
	dispatcher *dispatcher
	governance *governance
	hub        *hub
	meshView   *meshView
	imageGate  *api.ImageGate // image jobs at once and waiting
	fatalCh    chan error
	fatalOne   sync.Once
	ln         net.Listener
	srv        *http.Server
	legacy     *legacyServer
	tls        *tlsState
	served     chan error
	started    time.Time
	draining   atomic.Bool
	stopOnce   sync.Once
	lock       *dataLock
}

// New validates cfg and builds a node; nothing listens until Start.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if err := cfg.fillAddrs(); err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	n := &Node{cfg: cfg, log: nodeLogger(cfg.Logger, cfg.NodeID), clock: cfg.Clock, reg: prometheus.NewRegistry(), fatalCh: make(chan error, 1),
		prefixes: prefix.NewTracker(prefix.TrackerConfig{}), cluster: &cluster{done: make(chan struct{})}}
	n.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	n.lock = lock
	built := false
	defer func() {
		if !built {
			lock.release()
		}
	}()
	store, err := models.Open(filepath.Join(cfg.DataDir, "models"), n.log, n.clock)
	if err != nil {
		return nil, err
	}
	n.store = store
	if err := n.openAudit(); err != nil {
		return nil, err
	}
	defer func() {
		if !built && n.audit != nil {
			n.audit.Close()
		}
	}()
	n.engines = newEngines(cfg, n.log, store)
	n.imageGate = n.newImageGate()
	if err := n.initUpstream(); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	n.catalog, err = models.NewCatalog(cctx, cfg.CatalogSources)
	cancel()
	if err != nil {
		return nil, err
	}
	for _, st := range n.catalog.Status() {
		if st.Error != "" {
			n.log.Warn("catalogue source not loaded", "source", st.Source, "err", st.Error)
		}
	}
	n.backend = newBackend(backendDeps{
		nodeID: cfg.NodeID, version: cfg.Version, engine: cfg.Engine, clock: n.clock,
		store: store, engines: n.engines, imageGate: n.imageGate, cluster: n.cluster,
		draining: &n.draining, started: &n.started,
	})
	n.hub = newHub(hubDeps{nodeID: cfg.NodeID, store: store, catalog: n.catalog, engines: n.engines,
		backend: n.backend, cluster: n.cluster, log: n.log})
	n.puller = models.NewPuller(models.PullConfig{
		Store: store, Catalog: n.catalog, Peers: n.hub.pullPeers, Installed: n.hub.pulledInstalled,
		StallTimeout: cfg.PullStallTimeout, Logger: n.log, Clock: n.clock,
	})
	n.hub.puller = n.puller
	trusted, _ := api.ParseCIDRs(cfg.TrustedProxies) // checked by Validate
	auditExport, auditKeys := n.auditHandlers()
	if n.obs, err = newObserver(n); err != nil {
		return nil, err
	}
	n.admission = newAdmission(admissionDeps{
		nodeID: cfg.NodeID, listen: cfg.Listen, trustProxy: cfg.TrustProxy, legacyAllowPull: cfg.Legacy.AllowPull,
		limits: cfg.Limits, inflightCap: cfg.InflightCap, fastTimers: cfg.FastTimers,
		cluster: n.cluster, obs: n.obs, audit: n.audit, log: n.log, reg: n.reg, clock: n.clock,
		localServed: n.engines.served,
	})
	n.dispatcher = &dispatcher{cluster: n.cluster, log: n.log}
	n.governance = newGovernance(governanceDeps{nodeID: cfg.NodeID, cluster: n.cluster, log: n.log})
	n.meshView = &meshView{meshViewDeps{listen: cfg.Listen, trustProxy: cfg.TrustProxy, clock: n.clock,
		cluster: n.cluster, backend: n.backend, governance: n.governance}}
	n.batches = batch.New(batch.Config{Prefix: cfg.NodeID}, n.batchEmbedder, n.log, n.clock)
	n.api = api.New(api.Options{
		Backend:        n.backend,
		Dispatcher:     n.dispatcher,
		Governance:     n.governance,
		Admission:      n.admission,
		MeshView:       n.meshView,
		Batches:        n.batches,
		Hub:            n.hub,
		Logger:         n.log,
		Registry:       n.reg,
		Clock:          n.clock,
		Version:        cfg.Version,
		NodeID:         cfg.NodeID,
		CORSOrigins:    cfg.CORSOrigins,
		TrustProxy:     cfg.TrustProxy,
		Dashboard:      cfg.Dashboard,
		TrustedProxies: trusted,
		Bodies:         api.BodyLimits{Budget: cfg.BodyBudget, Share: cfg.BodyShare, MinRate: cfg.BodyMinRate, Grace: cfg.BodyGrace},
		ImageBudget:    cfg.ImageBudget,
		Sessions:       cfg.Sessions,
		Work:           cfg.Work,
		WorkCaller:     workCaller,
		ChatServed:     n.recordPrefix,
		AuditExport:    auditExport,
		AuditKeys:      auditKeys,
	})
	built = true
	return n, nil
}

// Start loads the installed models (making them warm) and starts serving.
func (n *Node) Start(ctx context.Context) error {
	var err error
	if n.tls, err = newTLSState(n.cfg, n.log); err != nil {
		return err
	}
	if err := n.engines.loadAll(ctx); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", n.cfg.Listen)
	if err != nil {
		n.engines.close()
		return fmt.Errorf("listen on %s: %w", n.cfg.Listen, err)
	}
	ln = limitPerClient(ln, n.cfg.MaxConnsPerClient, nil)
	// TLS when configured, and Go's own plain-text protocol errors answered
	// as OpenAI JSON errors (tls.go).
	ln = n.tls.ClientListener(ln, 10*time.Second)
	n.ln = ln
	n.engines.onChange = n.publishModels
	if err := n.startCluster(ln.Addr().String()); err != nil {
		ln.Close()
		n.engines.close()
		return err
	}
	n.srv = &http.Server{
		Handler:           n.obs.handler(n.api.Handler()),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(n.log.Handler(), slog.LevelWarn),
	}
	n.tls.start()
	n.started = n.clock()
	n.served = make(chan error, 1)
	go func() { n.served <- n.srv.Serve(ln) }()
	if err := n.startLegacy(); err != nil {
		n.Close()
		return err
	}
	n.log.Info("node listening", "addr", ln.Addr().String(), "data_dir", n.cfg.DataDir, "warm_models", n.engines.warmIDs())
	return nil
}

// Addr is the client listener's address once started.
func (n *Node) Addr() string { return n.ln.Addr().String() }

// ID is the node id.
func (n *Node) ID() string { return n.cfg.NodeID }

// Registry is the node's Prometheus registry.
func (n *Node) Registry() *prometheus.Registry { return n.reg }

// Drain marks the node draining (/readyz answers 503 and new work is
// refused at once), waits for in-flight requests to finish within ctx, then
// closes the listener and engines.
func (n *Node) Drain(ctx context.Context) error {
	var err error
	n.stopOnce.Do(func() {
		n.draining.Store(true)
		n.log.Info("draining", "inflight", n.api.InFlight())
		// Running pulls end now with an error event (their staged bytes
		// stay for a later pull), so their streams do not hold up the drain.
		n.puller.Close()
		if n.srv != nil {
			err = errors.Join(n.drainCluster(ctx), n.waitIdle(ctx))
			if lerr := n.drainLimiter(ctx); lerr != nil {
				n.log.Warn("returning quota leases", "err", lerr)
			}
			n.stopLegacy(ctx)
			n.srv.SetKeepAlivesEnabled(false)
			if serr := n.srv.Shutdown(ctx); serr != nil {
				err = errors.Join(err, serr)
				n.srv.Close()
			}
			if serr := <-n.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
				n.log.Warn("server stopped", "err", serr)
			}
		}
		n.stopCluster(ctx)
		n.obs.close(ctx)
		n.tls.close()
		n.batches.Close()
		if n.audit != nil {
			if aerr := n.audit.Close(); aerr != nil {
				n.log.Warn("closing the audit log", "err", aerr)
			}
		}
		n.engines.close()
		n.engines.upstream.Close()
		n.lock.release()
		n.log.Info("stopped")
	})
	return err
}

// waitIdle polls until no request is in flight or ctx ends.
func (n *Node) waitIdle(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for n.api.InFlight() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("drain: %d requests still in flight: %w", n.api.InFlight(), ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Close stops the node at once.
func (n *Node) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n.Drain(ctx)
	return nil
}

// fatal records an unrecoverable error (the raft state machine halted);
// the process owner reads it from Fatal and shuts the node down.
func (n *Node) fatal(err error) {
	n.fatalOne.Do(func() {
		n.log.Error("fatal: node must stop", "err", err)
		n.fatalCh <- err
	})
}

// Fatal delivers an error when the node can no longer run correctly.
func (n *Node) Fatal() <-chan error { return n.fatalCh }

// recordPrefix remembers a chat this node answered and publishes the new
// digest of served prefixes (api.Options.ChatServed).
func (n *Node) recordPrefix(model string, req engine.ChatRequest, answer engine.ChatMessage) {
	n.prefixes.Record(prefix.Served(model, req, answer)...)
	if n.cluster.mesh != nil {
		n.cluster.mesh.SetPrefixDigest(n.prefixes.Digest())
	}
}

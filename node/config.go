// Package node is the composition root of an infermesh node: it builds the
// model store, engines, HTTP API (and, as the mesh grows, gossip, forwarding
// and consensus), starts them in order and drains them on shutdown.
package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/infermesh/infermesh/mesh/route"
	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/engine/onnx"
	"github.com/infermesh/infermesh/node/imagecodec"
)

// Config is everything a node needs. cmd/infermesh fills it from flags and
// SERVICE_* variables; tests fill it directly.
type Config struct {
	// NodeID names the node in the mesh and in X-Service-Backend.
	NodeID string
	// Listen is the client HTTP address (host:port).
	Listen string
	// DataDir holds models, raft state and other node files.
	DataDir string
	// CORSOrigins lists origins allowed for browser use.
	CORSOrigins []string
	// TrustProxy honours X-Forwarded-For for client addresses.
	TrustProxy bool
	// TrustedProxies are the proxy networks (CIDRs or addresses) whose
	// X-Forwarded-For entries are believed when TrustProxy is set; the
	// client is the right-most entry outside them. Default loopback.
	TrustedProxies []string
	// Dashboard mounts /dashboard.
	Dashboard bool
	// ORTLibrary is the path of libonnxruntime.so.
	ORTLibrary string
	// LlamaDir is the folder of llama.cpp's shared libraries (libllama,
	// libggml, libggml-base, libggml-cpu-*), for GGUF models.
	LlamaDir string
	// LlamaThreads is the number of compute threads of each GGUF model
	// (0: half the CPUs, at least one).
	LlamaThreads int
	// LlamaPoll is how busily llama.cpp's idle compute threads wait for
	// the next step, 0-100 (0: they sleep at once; llama.cpp's own
	// default, 50, spins first). A model's poll option overrides it.
	LlamaPoll int
	// IntraOpThreads bounds threads per ONNX Runtime session run: 0 picks
	// per pipeline (embeddings one thread per run, one run per core;
	// others ONNX Runtime's pool), -1 ONNX Runtime's pool everywhere.
	IntraOpThreads int
	// MemoryArena is the node's default for ONNX Runtime's CPU memory
	// arena (onnx.ParseArena): "on" keeps the largest activations a
	// model's run ever needed until the model is unloaded, "off" gives run
	// memory back after each run (slower runs), a duration keeps the arena
	// and gives it back once a model has had no run for that long
	// (background removal; the other pipelines keep it). A model's
	// memory_arena option overrides it. See docs/models.md, "Model memory".
	MemoryArena string
	// BatchMax and BatchWait configure the embeddings dynamic batcher.
	BatchMax int
	// BatchWait is the longest the batcher waits to fill a batch (0..1s;
	// default 2ms).
	BatchWait time.Duration
	// DrainTimeout bounds how long in-flight requests may take after SIGTERM.
	DrainTimeout time.Duration
	// GossipListen is the memberlist address (UDP+TCP); default port 7946
	// on the client listener's host (on the advertised host, else
	// loopback, when the client listener is on all interfaces).
	GossipListen string
	// RPCListen is the internal address for Connect (forwarding, raft
	// applies) and raft itself; default port 7947, on the same host as
	// GossipListen's default.
	RPCListen string
	// Advertise is the host peers should dial when it differs from the
	// listeners' host (e.g. behind NAT or when listening on 0.0.0.0).
	Advertise string
	// Join lists gossip addresses of running nodes; empty starts a mesh of one.
	Join []string
	// GossipKey (base64, 16/24/32 bytes) encrypts gossip.
	GossipKey string
	// ClusterSecret authenticates node-to-node calls; nodes of one mesh
	// must share it. Empty on a single node generates a random one.
	ClusterSecret string
	// Voters is the raft voter target (3 or 5).
	Voters int
	// BootstrapExpect, with Join, makes a new node wait until gossip shows
	// this many nodes (itself included); then the lowest node id among
	// them bootstraps raft with all of them (Consul's bootstrap_expect).
	// Zero: a joining node only waits to be added by a running cluster.
	BootstrapExpect int
	// Strategy, InflightCap, Weight, Canary and CanaryPercent are this
	// node's routing settings until replicated policy overrides them.
	Strategy string
	// Engine is the node's role as operators name it: "local" (default)
	// or "gateway". Both mean the same: every node routes requests across
	// the mesh and serves the models it holds; a gateway may hold none.
	Engine string
	// InflightCap is how many requests this node serves at once before
	// peers route elsewhere (1..100000; default 64).
	InflightCap int
	// Weight is this node's weight for the weighted strategy (0..1000;
	// default 1).
	Weight int
	// Canary marks this node as a canary.
	Canary bool
	// CanaryPercent is the share of callers (0..100) this node receives
	// when it is a canary.
	CanaryPercent int
	// ForwardStream sends forwarded requests with small bodies over one
	// long-lived multiplexed Connect stream per peer instead of a call of
	// their own (about half the entry node's CPU per forwarded request
	// under load; see mesh/DESIGN.md). On in Defaults; false gives every
	// request a call of its own.
	ForwardStream bool
	// FastTimers shortens gossip and raft timers (tests on loopback).
	FastTimers bool
	// Version is reported in X-Service-Version.
	Version string
	// ProvidersFile names the upstream providers file (JSON, see package
	// node/engine/upstream); empty means none.
	ProvidersFile string
	// CatalogSources are operator catalogue sources (file paths or http(s)
	// URLs) read after the built-in catalogue; later ones win key by key.
	CatalogSources []string
	// TransferRate caps the bytes per second this node sends model files
	// to peers (all transfers together); 0 means no cap.
	TransferRate int
	// PullStallTimeout abandons a pull attempt (peer or outside source)
	// that received nothing this long; the pull moves to the next source.
	PullStallTimeout time.Duration
	// BodyBudget is the most request-body bytes all client connections
	// may hold at once (default 512 MiB), charged as bytes arrive; a body
	// that would cross it gets 503 with Retry-After.
	BodyBudget int64
	// BodyShare is the most of BodyBudget one API key, and one client
	// address, may hold at once (0: a quarter of the budget); beyond it
	// that caller gets 429 body_share_exceeded and others are served.
	BodyShare int64
	// BodyMinRate is the slowest a request body may arrive after
	// BodyGrace, in bytes per second (default 32 KiB/s); slower senders
	// get 408 and lose the connection.
	BodyMinRate int64
	// BodyGrace is how long any body may take before BodyMinRate applies,
	// and the longest it may go without a byte arriving (default 10s).
	BodyGrace time.Duration
	// ImageBudget bounds the memory decoded request images may hold at
	// once (default 1 GiB); larger concurrent images wait their turn.
	ImageBudget int64
	// Sessions bounds live transcription sessions: per node, per API key
	// and per client address, apart from the in-flight cap, with idle and
	// total time limits (zero fields take api.SessionLimits' defaults).
	Sessions api.SessionLimits
	// Work bounds the work one request may ask (image megapixel-steps and
	// picture size, speech characters ÷ speed, transcription seconds) and
	// the work one key may have admitted on this node at once (see
	// node/api/work.go; defaults api.DefaultWorkLimits).
	Work api.WorkLimits
	// MaxConnsPerClient caps the open client connections from one address
	// (default 1024; 0 turns the cap off, e.g. behind a proxy).
	MaxConnsPerClient int
	// Legacy configures the legacy (Ollama-shaped) API; off by default.
	Legacy LegacyConfig
	// ImageConcurrency is how many image jobs (generation and operations
	// on local pipelines) run at once (default 1); ImageQueue how many
	// more may wait (default 2). Beyond both: 503 with Retry-After.
	ImageConcurrency, ImageQueue int
	// Limits configures rates, the busy gate and the plan (see limits.go).
	Limits LimitsConfig
	// Audit configures the signed audit log (see audit.go).
	Audit AuditConfig
	// TLSCert and TLSKey (PEM files) serve the client and legacy ports
	// over TLS 1.2+; both or neither. They reload on ReloadTLS (SIGHUP)
	// and when the files change (see tls.go).
	TLSCert, TLSKey string
	// PeerCert, PeerKey and PeerCA (PEM files) put the RPC port under
	// mutual TLS: peers must present a certificate from PeerCA and this
	// node presents PeerCert; all three or none. The cluster secret still
	// authenticates every call on top. Reloaded like TLSCert.
	PeerCert, PeerKey, PeerCA string
	// TLSReloadInterval is how often the certificate files are checked for
	// changes (default DefaultTLSReloadInterval).
	TLSReloadInterval time.Duration
	// Logger is this node's logger; nil means a text logger on stderr.
	Logger *slog.Logger
	// Clock returns the time; nil means time.Now.
	Clock func() time.Time
}

var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// DefaultListen is the default client address.
const DefaultListen = "127.0.0.1:11436"

// Defaults returns a Config with every default filled in.
func Defaults() Config {
	host, _ := os.Hostname()
	home, _ := os.UserHomeDir()
	return Config{
		NodeID:        sanitizeID(host),
		Listen:        DefaultListen,
		DataDir:       "data",
		Dashboard:     true,
		ORTLibrary:    filepath.Join(home, ".cache", "infermesh", "ort", "1.30.0", "libonnxruntime.so"),
		LlamaDir:      filepath.Join(home, ".cache", "infermesh", "llama", "3.21.1"),
		BatchMax:      32,
		MemoryArena:   "5m",
		BatchWait:     2 * time.Millisecond,
		DrainTimeout:  30 * time.Second,
		Version:       "dev",
		Voters:        3,
		Strategy:      "round-robin",
		Engine:        EngineLocal,
		InflightCap:   64,
		ForwardStream: true,
		Weight:        1,

		TrustedProxies: append([]string(nil), api.DefaultTrustedProxies...),

		BodyBudget:        api.DefaultBodyBudget,
		BodyMinRate:       api.DefaultBodyMinRate,
		BodyGrace:         api.DefaultBodyGrace,
		MaxConnsPerClient: 1024,
		ImageBudget:       imagecodec.DefaultBudget,
		Sessions: api.SessionLimits{PerNode: api.DefaultSessionsPerNode, PerKey: api.DefaultSessionsPerKey,
			PerClient: api.DefaultSessionsPerClient, Idle: api.DefaultSessionIdle, MaxDuration: api.LiveMaxDuration},
		Work: api.DefaultWorkLimits(),

		PullStallTimeout: 30 * time.Second,

		ImageConcurrency: 1,
		ImageQueue:       2,

		Audit: AuditConfig{Enabled: true, Retention: 90 * 24 * time.Hour, MaxFiles: 1000, MaxFileBytes: 64 << 20, SyncInterval: time.Second},
	}
}

func sanitizeID(s string) string {
	s = regexp.MustCompile(`[^A-Za-z0-9._-]`).ReplaceAllString(s, "-")
	s = strings.TrimLeft(s, "-._")
	if len(s) > 63 {
		s = s[:63]
	}
	if s == "" {
		return "node"
	}
	return s
}

// Validate checks every field and returns all problems at once.
func (c *Config) Validate() error {
	var errs []error
	if !nodeIDPattern.MatchString(c.NodeID) {
		errs = append(errs, fmt.Errorf("node id %q: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", c.NodeID))
	}
	if _, port, err := net.SplitHostPort(c.Listen); err != nil || port == "" {
		errs = append(errs, fmt.Errorf("listen %q: want host:port", c.Listen))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("data dir is empty"))
	}
	if _, err := api.ParseCIDRs(c.TrustedProxies); err != nil {
		errs = append(errs, err)
	}
	for _, o := range c.CORSOrigins {
		if o != "*" && !strings.HasPrefix(o, "http://") && !strings.HasPrefix(o, "https://") {
			errs = append(errs, fmt.Errorf("cors origin %q: want http(s)://host[:port] or *", o))
		}
	}
	if c.LlamaThreads < 0 || c.LlamaThreads > 512 {
		errs = append(errs, fmt.Errorf("llama threads %d: want 0 (one per CPU) or 1..512", c.LlamaThreads))
	}
	if c.LlamaPoll < 0 || c.LlamaPoll > 100 {
		errs = append(errs, fmt.Errorf("llama poll %d: want 0..100", c.LlamaPoll))
	}
	if c.IntraOpThreads < -1 || c.IntraOpThreads > 256 {
		errs = append(errs, fmt.Errorf("intra-op threads %d: want -1 (ONNX Runtime's pool), 0 (auto) or 1..256", c.IntraOpThreads))
	}
	if _, err := onnx.ParseArena(c.MemoryArena); err != nil {
		errs = append(errs, err)
	}
	if c.BatchMax < 1 || c.BatchMax > 1024 {
		errs = append(errs, fmt.Errorf("batch max %d: want 1..1024", c.BatchMax))
	}
	if c.BatchWait < 0 || c.BatchWait > time.Second {
		errs = append(errs, fmt.Errorf("batch wait %s: want 0..1s", c.BatchWait))
	}
	for name, addr := range map[string]string{"gossip listen": c.GossipListen, "rpc listen": c.RPCListen} {
		if addr == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("%s %q: want host:port", name, addr))
		}
	}
	for _, j := range c.Join {
		if j == "" || strings.ContainsAny(j, " /") {
			errs = append(errs, fmt.Errorf("join %q: want host:port", j))
		}
	}
	if c.Voters != 3 && c.Voters != 5 {
		errs = append(errs, fmt.Errorf("voters %d: want 3 or 5", c.Voters))
	}
	if c.BootstrapExpect < 0 || c.BootstrapExpect > 1 && len(c.Join) == 0 {
		errs = append(errs, fmt.Errorf("bootstrap expect %d: want 0, 1, or more with --join naming the other nodes", c.BootstrapExpect))
	}
	if _, err := route.ParseStrategy(c.Strategy); err != nil {
		errs = append(errs, fmt.Errorf("strategy %q: want one of %v, or prefix.<strategy>", c.Strategy, route.Strategies()))
	}
	switch c.Engine {
	case "", EngineLocal, EngineGateway:
	default:
		errs = append(errs, fmt.Errorf("engine %q: want %s or %s", c.Engine, EngineLocal, EngineGateway))
	}
	if c.InflightCap < 1 || c.InflightCap > 100000 {
		errs = append(errs, fmt.Errorf("inflight cap %d: want 1..100000", c.InflightCap))
	}
	if c.Weight < 0 || c.Weight > 1000 {
		errs = append(errs, fmt.Errorf("weight %d: want 0..1000", c.Weight))
	}
	if c.CanaryPercent < 0 || c.CanaryPercent > 100 {
		errs = append(errs, fmt.Errorf("canary percent %d: want 0..100", c.CanaryPercent))
	}
	if len(c.Join) > 0 && c.ClusterSecret == "" {
		errs = append(errs, errors.New("cluster secret is empty: nodes that join a mesh need --cluster-secret (the same on every node)"))
	}
	if c.ImageConcurrency < 1 || c.ImageConcurrency > 64 || c.ImageQueue < 0 || c.ImageQueue > 10000 {
		errs = append(errs, fmt.Errorf("image concurrency %d / queue %d: want 1..64 and 0..10000", c.ImageConcurrency, c.ImageQueue))
	}
	errs = append(errs, c.Limits.validate()...)
	errs = append(errs, c.Audit.validate()...)
	if c.DrainTimeout <= 0 {
		errs = append(errs, fmt.Errorf("drain timeout %s: must be positive", c.DrainTimeout))
	}
	for _, src := range c.CatalogSources {
		if src == "" || len(src) > 2048 {
			errs = append(errs, fmt.Errorf("catalog source %q: want a file path or an http(s) URL", src))
		}
	}
	if c.BodyBudget < 1<<20 {
		errs = append(errs, fmt.Errorf("body budget %d: want at least 1 MiB", c.BodyBudget))
	}
	if c.BodyShare < 0 || c.BodyShare > c.BodyBudget {
		errs = append(errs, fmt.Errorf("body share %d: want 0 (a quarter of the budget) up to the budget %d", c.BodyShare, c.BodyBudget))
	}
	if c.BodyMinRate < 1 {
		errs = append(errs, fmt.Errorf("body min rate %d: must be positive", c.BodyMinRate))
	}
	if c.BodyGrace <= 0 || c.BodyGrace > time.Hour {
		errs = append(errs, fmt.Errorf("body grace %s: want (0, 1h]", c.BodyGrace))
	}
	if c.ImageBudget < 64<<20 {
		errs = append(errs, fmt.Errorf("image budget %d: want at least 64 MiB", c.ImageBudget))
	}
	if l := c.Sessions; l.PerNode < 0 || l.PerKey < 0 || l.PerClient < 0 || l.Idle < 0 || l.MaxDuration < 0 || l.MaxDuration > 24*time.Hour {
		errs = append(errs, fmt.Errorf("session limits %+v: counts and durations must not be negative, and sessions last at most 24h", l))
	}
	errs = append(errs, c.Work.Validate()...)
	if c.MaxConnsPerClient < 0 {
		errs = append(errs, fmt.Errorf("max conns per client %d: must not be negative", c.MaxConnsPerClient))
	}
	if c.TransferRate < 0 {
		errs = append(errs, fmt.Errorf("transfer rate %d: must not be negative", c.TransferRate))
	}
	if c.PullStallTimeout < 0 {
		errs = append(errs, fmt.Errorf("pull stall timeout %s: must not be negative", c.PullStallTimeout))
	}
	errs = append(errs, c.Legacy.validate()...)
	errs = append(errs, c.validateTLS()...)
	return errors.Join(errs...)
}

// IsLoopbackListen reports whether the client listener is on loopback only.
func (c *Config) IsLoopbackListen() bool {
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// internalHost is the host the gossip and RPC listeners bind to when not
// set: the client listener's host, except that a client listener on all
// interfaces never silently opens the internal ports there too: they bind
// to the advertised host (given, or chosen by fillAddrs), else to loopback
// (a lone node no peer can join).
func (c *Config) internalHost() string {
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return "127.0.0.1"
	}
	if isUnspecifiedHost(host) {
		if c.Advertise != "" {
			return c.Advertise
		}
		return "127.0.0.1"
	}
	return host
}

// fillAddrs derives unset internal addresses from the client listener,
// choosing the advertised address from this computer's interfaces when a
// listener is on all interfaces and --advertise is not set (see
// chooseAdvertise). It fails when it cannot decide.
func (c *Config) fillAddrs() error { return c.fillAddrsFrom(systemInterfaces) }

// fillAddrsFrom is fillAddrs with the interface list injected.
func (c *Config) fillAddrsFrom(interfaces func() ([]netInterface, error)) error {
	if err := checkAdvertise(c.Advertise); err != nil {
		return err
	}
	// A listener on all interfaces that peers must dial needs one address
	// to advertise: the client listener when it gives the internal ports
	// their host, and internal listeners set on all interfaces. A lone
	// node with no cluster secret can never be joined (its secret is
	// random): its internal ports stay on loopback.
	joinable := len(c.Join) > 0 || c.ClusterSecret != ""
	var unspecified []string
	if lh, _, err := net.SplitHostPort(c.Listen); err == nil && isUnspecifiedHost(lh) && joinable && (c.GossipListen == "" || c.RPCListen == "") {
		unspecified = append(unspecified, lh)
	}
	for _, a := range []string{c.GossipListen, c.RPCListen} {
		if h, _, err := net.SplitHostPort(a); a != "" && err == nil && isUnspecifiedHost(h) {
			unspecified = append(unspecified, h)
		}
	}
	if c.Advertise == "" && len(unspecified) > 0 {
		if lh, _, _ := net.SplitHostPort(c.Listen); !isUnspecifiedHost(lh) && !isLoopbackHost(lh) {
			c.Advertise = lh // the client listener names this node's address
		}
	}
	if c.Advertise == "" && len(unspecified) > 0 {
		ipv6 := false
		for _, h := range unspecified {
			ipv6 = ipv6 || h != "0.0.0.0" // "" and "::" accept IPv6 too
		}
		ifaces, err := interfaces()
		if err != nil {
			return fmt.Errorf("listening on all interfaces: cannot list this computer's addresses (%v): set --advertise (SERVICE_ADVERTISE)", err)
		}
		if c.Advertise, err = chooseAdvertise(ifaces, ipv6, len(c.Join) > 0); err != nil {
			return err
		}
	}
	if c.GossipListen == "" {
		c.GossipListen = net.JoinHostPort(c.internalHost(), "7946")
	}
	if c.RPCListen == "" {
		c.RPCListen = net.JoinHostPort(c.internalHost(), "7947")
	}
	return nil
}

// Values of Config.Engine.
const (
	// EngineLocal is the default role: the node routes and serves the
	// models it holds.
	EngineLocal = "local"
	// EngineGateway is accepted for deployments that name their routing
	// nodes gateways; it behaves like EngineLocal (every node routes).
	EngineGateway = "gateway"
)

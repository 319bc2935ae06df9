// Command infermesh runs a mesh node (`infermesh serve`) and the operator
// commands that manage one.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/infermesh/infermesh/node"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `infermesh: a mesh of peer inference nodes with an OpenAI-compatible API.

Usage:
  infermesh serve [flags]          run a node (see infermesh serve -h)
  infermesh models import DIR|FILE.gguf  install a model folder or a GGUF file into a node's data dir
  infermesh models list [--data-dir DIR] [--format json]
                                   list the models installed in a data dir
  infermesh models quantize SRC.gguf DST.gguf TYPE
                                   quantise a GGUF file with llama.cpp (q8_0, q4_0, q4_k_m, ...)
  infermesh models rm ID           remove an installed model (through the node running on this
                                   computer, else directly from --data-dir)
  infermesh pull [--node URL] [--to NODE_ID] KEY
                                   pull a model from the catalogue or a peer, with a progress bar;
                                   Ctrl-C stops following (exit 130), the node keeps downloading
  infermesh members [--node URL] [--format json]
                                   list the mesh's nodes, their state, load and warm models
  infermesh usage [--by app|model|key|worker] [--since DAY] [--until DAY] [--format json]
                                   usage totals (requests, tokens, cost) through any node (admin key)
  infermesh audit export [--since RFC3339|DURATION] [--node URL]
                                   the mesh's signed audit records as JSON Lines (admin key)
  infermesh audit verify FILE [--keys FILE]
                                   check signatures and chains; exits 1 naming the first bad line
  infermesh keys create --name N [--app A] [--admin] [--allow chat,vision] [--rpm N] [--daily-quota N]
                       [--monthly-budget X] [--expires DURATION|RFC3339] [--format json]
  infermesh keys list [--format json] | revoke ID
                                   manage API keys through any node (admin key from SERVICE_ADMIN_KEY)
  infermesh policy get [--format json] | set FILE
                                   read or replace the replicated pool policy (same admin key)
  infermesh raft peers [--format json] | remove-peer ID
                                   show the raft configuration, or remove a dead server (same admin key)
  infermesh raft recover --data-dir DIR [--node-id ID] --yes
                                   on a STOPPED node whose cluster lost its majority for good:
                                   make it the single raft voter (see infermesh raft -h)
  infermesh version                print the version

Every command takes -h. Exit status: 0 success, 1 the operation failed or the
node could not be reached, 2 bad usage (unknown command, bad flag or value).
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], stderr)
	case "models":
		return modelsCmd(args[1:], stdout, stderr)
	case "members":
		return membersCmd(args[1:], stdout, stderr)
	case "pull":
		return pullCmd(args[1:], stdout, stderr)
	case "keys":
		return keysCmd(args[1:], stdout, stderr)
	case "policy":
		return policyCmd(args[1:], stdout, stderr)
	case "raft":
		return raftCmd(args[1:], stdout, stderr)
	case "audit":
		return auditCmd(args[1:], stdout, stderr)
	case "usage":
		return usageCmd(args[1:], stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintln(stdout, "infermesh", version)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "infermesh: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// serveFlags binds every serve flag to its SERVICE_* variable.
func serveFlags(cfg *node.Config, logLevel *string) *envFlags {
	f := newEnvFlags("serve")
	f.String(&cfg.Listen, "listen", "SERVICE_LISTEN", cfg.Listen, "client HTTP address host:port")
	f.String(&cfg.DataDir, "data-dir", "SERVICE_DATA_DIR", cfg.DataDir, "data directory (models, state)")
	f.String(&cfg.NodeID, "node-id", "SERVICE_NODE_ID", cfg.NodeID, "node id in the mesh and in X-Service-Backend (default: host name)")
	f.List(&cfg.CORSOrigins, "cors-origins", "SERVICE_CORS_ORIGINS", "origins allowed for browser use; * allows any")
	f.Bool(&cfg.TrustProxy, "trust-proxy", "SERVICE_TRUST_PROXY", cfg.TrustProxy, "honour X-Forwarded-For (only on a node behind a TLS-terminating proxy)")
	f.List(&cfg.TrustedProxies, "trusted-proxies", "SERVICE_TRUSTED_PROXIES", "with --trust-proxy: proxy networks (CIDRs) whose X-Forwarded-For entries are believed; the client is the right-most entry outside them (default 127.0.0.0/8,::1/128)")
	f.Int64(&cfg.BodyBudget, "body-budget", "SERVICE_BODY_BUDGET", cfg.BodyBudget, "bytes of request bodies all connections may hold at once, charged as they arrive; beyond it 503 + Retry-After")
	f.Int64(&cfg.BodyShare, "body-share", "SERVICE_BODY_SHARE", cfg.BodyShare, "bytes of request bodies one API key, and one client address, may hold at once (0: a quarter of --body-budget); beyond it 429 body_share_exceeded")
	f.Int64(&cfg.BodyMinRate, "body-min-rate", "SERVICE_BODY_MIN_RATE", cfg.BodyMinRate, "slowest a request body may arrive after --body-grace, bytes per second (slower: 408)")
	f.Duration(&cfg.BodyGrace, "body-grace", "SERVICE_BODY_GRACE", cfg.BodyGrace, "how long any request body may take before --body-min-rate applies, and the longest it may go without a byte arriving")
	f.Int64(&cfg.ImageBudget, "image-memory", "SERVICE_IMAGE_MEMORY", cfg.ImageBudget, "bytes decoded request images may hold at once; larger concurrent images wait their turn")
	f.Int(&cfg.Sessions.PerNode, "sessions-per-node", "SERVICE_SESSIONS_PER_NODE", cfg.Sessions.PerNode, "live transcription sessions this node serves at once (apart from --inflight-cap; beyond it 503)")
	f.Int(&cfg.Sessions.PerKey, "sessions-per-key", "SERVICE_SESSIONS_PER_KEY", cfg.Sessions.PerKey, "live sessions one API key may open through this node at once (beyond it 429 session_limit_exceeded)")
	f.Int(&cfg.Sessions.PerClient, "sessions-per-client", "SERVICE_SESSIONS_PER_CLIENT", cfg.Sessions.PerClient, "live sessions one client address may open through this node at once (beyond it 429 session_limit_exceeded)")
	f.Duration(&cfg.Sessions.Idle, "session-idle", "SERVICE_SESSION_IDLE", cfg.Sessions.Idle, "longest a live session may wait for the client's next whole message before it is closed")
	f.Duration(&cfg.Sessions.MaxDuration, "session-max-duration", "SERVICE_SESSION_MAX_DURATION", cfg.Sessions.MaxDuration, "longest a live session may last")
	f.Int(&cfg.MaxConnsPerClient, "max-conns-per-client", "SERVICE_MAX_CONNS_PER_CLIENT", cfg.MaxConnsPerClient, "open client connections one address may hold (0: no cap; raise it behind a proxy)")
	f.Bool(&cfg.Dashboard, "dashboard", "SERVICE_DASHBOARD", cfg.Dashboard, "serve /dashboard")
	f.String(&cfg.ORTLibrary, "ort-library", "SERVICE_ORT_LIBRARY", cfg.ORTLibrary, "path of libonnxruntime.so")
	f.String(&cfg.LlamaDir, "llama-dir", "SERVICE_LLAMA_DIR", cfg.LlamaDir, "folder of llama.cpp's shared libraries, for GGUF models")
	f.Int(&cfg.LlamaThreads, "llama-threads", "SERVICE_LLAMA_THREADS", cfg.LlamaThreads, "compute threads of each GGUF model (0: half the CPUs, at least one)")
	f.Int(&cfg.LlamaPoll, "llama-poll", "SERVICE_LLAMA_POLL", cfg.LlamaPoll, "how busily llama.cpp's idle threads wait for the next step, 0-100 (0: sleep at once; llama.cpp's default 50 spins first)")
	f.Int(&cfg.IntraOpThreads, "intra-op-threads", "SERVICE_INTRA_OP_THREADS", cfg.IntraOpThreads, "threads per ONNX Runtime session run (0: per pipeline: embeddings 1 per run and one run per core, others the runtime pool; -1: the runtime pool everywhere)")
	f.String(&cfg.MemoryArena, "memory-arena", "SERVICE_MEMORY_ARENA", cfg.MemoryArena, "ONNX Runtime's CPU memory arena for models that set no memory_arena option: on keeps each model's largest run memory until unload, off returns it after every run, a duration (5m) keeps it and returns it once a model had no run for that long (background removal)")
	f.Int(&cfg.BatchMax, "batch-max", "SERVICE_BATCH_MAX", cfg.BatchMax, "largest embeddings batch the dynamic batcher builds (1 disables batching)")
	f.Duration(&cfg.BatchWait, "batch-wait", "SERVICE_BATCH_WAIT", cfg.BatchWait, "longest the batcher waits to fill a batch")
	f.Duration(&cfg.DrainTimeout, "drain-timeout", "SERVICE_DRAIN_TIMEOUT", cfg.DrainTimeout, "how long in-flight requests may run after SIGTERM")
	f.String(&cfg.GossipListen, "gossip-listen", "SERVICE_GOSSIP_LISTEN", cfg.GossipListen, "gossip address host:port (default: listen host, port 7946)")
	f.String(&cfg.RPCListen, "rpc-listen", "SERVICE_RPC_LISTEN", cfg.RPCListen, "internal address for forwarding and raft (default: listen host, port 7947)")
	f.String(&cfg.Advertise, "advertise", "SERVICE_ADVERTISE", cfg.Advertise, "host peers dial when it differs from the listeners' host")
	f.List(&cfg.Join, "join", "SERVICE_JOIN", "gossip address host:port of a running node; repeat or comma-separate")
	f.String(&cfg.GossipKey, "gossip-key", "SERVICE_GOSSIP_KEY", cfg.GossipKey, "base64 key (16, 24 or 32 bytes) that encrypts gossip")
	f.String(&cfg.ClusterSecret, "cluster-secret", "SERVICE_CLUSTER_SECRET", cfg.ClusterSecret, "shared secret for node-to-node calls (required with --join)")
	f.Int(&cfg.BootstrapExpect, "bootstrap-expect", "SERVICE_BOOTSTRAP_EXPECT", cfg.BootstrapExpect, "with --join on a new mesh: wait for this many nodes (itself included), then the lowest node id bootstraps raft with all of them; start exactly this many at once")
	f.Int(&cfg.Voters, "voters", "SERVICE_VOTERS", cfg.Voters, "raft voters to keep (3 or 5)")
	f.String(&cfg.Strategy, "strategy", "SERVICE_STRATEGY", cfg.Strategy, "routing strategy: round-robin, least-latency, least-connections, weighted, sticky, prefix or prefix.<strategy>")
	f.String(&cfg.Engine, "engine", "SERVICE_ENGINE", cfg.Engine, "node role: local or gateway (the same: every node routes across the mesh and serves the models it holds)")
	f.Int(&cfg.InflightCap, "inflight-cap", "SERVICE_INFLIGHT_CAP", cfg.InflightCap, "requests this node serves at once before peers route elsewhere")
	f.Int(&cfg.Weight, "weight", "SERVICE_WEIGHT", cfg.Weight, "this node's weight for the weighted strategy")
	f.Bool(&cfg.Canary, "canary", "SERVICE_CANARY", cfg.Canary, "mark this node canary")
	f.Bool(&cfg.ForwardStream, "forward-stream", "SERVICE_FORWARD_STREAM", cfg.ForwardStream, "forward small requests over one multiplexed stream per peer (false: a call per request)")
	f.Int(&cfg.CanaryPercent, "canary-percent", "SERVICE_CANARY_PERCENT", cfg.CanaryPercent, "percent of callers a canary node receives")
	f.Int(&cfg.ImageConcurrency, "image-concurrency", "SERVICE_IMAGE_CONCURRENCY", cfg.ImageConcurrency, "image jobs (generation, operations) run at once on this node")
	f.Int(&cfg.ImageQueue, "image-queue", "SERVICE_IMAGE_QUEUE", cfg.ImageQueue, "image jobs that may wait for a turn; beyond them 503 with Retry-After")
	wl := &cfg.Work
	f.Int64(&wl.ImagePixels, "image-max-pixels", "SERVICE_IMAGE_MAX_PIXELS", wl.ImagePixels, "largest picture (width x height) an image request may ask for or send; larger: 400 before decoding or running")
	f.Int64(&wl.ImageWork, "image-max-work", "SERVICE_IMAGE_MAX_WORK", wl.ImageWork, "most image work one request may ask, in megapixel-steps (pixels x steps x n, a megapixel 1024x1024); more: 400")
	f.Int64(&wl.KeyImageWork, "image-key-work", "SERVICE_IMAGE_KEY_WORK", wl.KeyImageWork, "image work (megapixel-steps) one key may have admitted on this node at once; more: 429 (0: no share limit; the local operator has none)")
	f.Int64(&wl.SpeechWork, "speech-max-work", "SERVICE_SPEECH_MAX_WORK", wl.SpeechWork, "most speech one request may ask, in characters divided by speed; more: 400")
	f.Int64(&wl.KeySpeechWork, "speech-key-work", "SERVICE_SPEECH_KEY_WORK", wl.KeySpeechWork, "speech work (characters / speed) one key may have admitted on this node at once; more: 429 (0: no share limit)")
	f.Int64(&wl.AudioSeconds, "audio-max-seconds", "SERVICE_AUDIO_MAX_SECONDS", wl.AudioSeconds, "longest audio one transcription may carry, seconds (at most 1800); longer: 413")
	f.Int64(&wl.KeyAudioSeconds, "audio-key-seconds", "SERVICE_AUDIO_KEY_SECONDS", wl.KeyAudioSeconds, "seconds of audio one key may have admitted for transcription on this node at once; more: 429 (0: no share limit)")
	l := &cfg.Limits
	f.Int64(&l.KeyRPM, "rpm", "SERVICE_RPM", l.KeyRPM, "requests per minute for each API key that sets no rpm of its own (0: no limit)")
	f.Int64(&l.ClientRPM, "client-rpm", "SERVICE_CLIENT_RPM", l.ClientRPM, "requests per minute per client address, IPv6 by /64 (0: no limit; the local operator is exempt)")
	f.Int(&l.BusyCapacity, "busy-capacity", "SERVICE_BUSY_CAPACITY", l.BusyCapacity, "engine requests run at once before the busy gate queues them by priority (0: --inflight-cap)")
	f.Int(&l.BusyQueue, "busy-queue", "SERVICE_BUSY_QUEUE", l.BusyQueue, "requests that may wait for a slot; when full, lower-priority waiters are shed, then 503 (0: 4 x capacity)")
	f.Int(&l.BusyReserve, "busy-reserve", "SERVICE_BUSY_RESERVE", l.BusyReserve, "slots only interactive work may take (0: a quarter of the capacity, -1: none)")
	f.Duration(&l.BusyWait, "busy-wait", "SERVICE_BUSY_WAIT", l.BusyWait, "longest a request waits for a slot before 503 (0: 30s)")
	f.String(&l.Plan, "plan", "SERVICE_PLAN", l.Plan, "server plan seeded into the replicated policy when it has none: free or pro (later: policy set)")
	f.List(&l.FirstPartyApps, "first-party-apps", "SERVICE_FIRST_PARTY_APPS", "applications whose keys are first-party, seeded like --plan")
	f.List(&l.ThirdPartyTools, "third-party-tools", "SERVICE_THIRD_PARTY_TOOLS", "User-Agent products that make keyless callers third-party on Free (default: the built-in list)")
	a := &cfg.Audit
	f.Bool(&a.Enabled, "audit", "SERVICE_AUDIT", a.Enabled, "write signed audit records under <data-dir>/audit")
	f.Duration(&a.Retention, "audit-retention", "SERVICE_AUDIT_RETENTION", a.Retention, "remove audit files whose last record is older (0: keep by age)")
	f.Int(&a.MaxFiles, "audit-max-files", "SERVICE_AUDIT_MAX_FILES", a.MaxFiles, "keep at most this many audit files (0: no limit)")
	f.Int64(&a.MaxFileBytes, "audit-max-file-bytes", "SERVICE_AUDIT_MAX_FILE_BYTES", a.MaxFileBytes, "start a new audit file beyond this size")
	f.Duration(&a.SyncInterval, "audit-sync-interval", "SERVICE_AUDIT_SYNC_INTERVAL", a.SyncInterval, "fsync audit records at most this often (0: after every batch; negative: at rotation and shutdown only)")
	f.Bool(&cfg.FastTimers, "fast-timers", "SERVICE_FAST_TIMERS", cfg.FastTimers, "short gossip and raft timers, for tests and chaos runs on one machine")
	f.List(&cfg.CatalogSources, "catalog-source", "SERVICE_CATALOG_SOURCES", "extra model catalogue: a JSON file path or http(s) URL; repeat or comma-separate; later sources win")
	f.Int(&cfg.TransferRate, "transfer-rate", "SERVICE_TRANSFER_RATE", cfg.TransferRate, "bytes per second this node sends model files to peers (0: no cap)")
	f.Duration(&cfg.PullStallTimeout, "pull-stall-timeout", "SERVICE_PULL_STALL_TIMEOUT", cfg.PullStallTimeout, "a pull moves to its next source after receiving nothing this long")
	f.String(&cfg.TLSCert, "tls-cert", "SERVICE_TLS_CERT", cfg.TLSCert, "PEM certificate (chain) for TLS on the client and legacy ports; reloaded on SIGHUP and when the file changes")
	f.String(&cfg.TLSKey, "tls-key", "SERVICE_TLS_KEY", cfg.TLSKey, "PEM private key for --tls-cert")
	f.String(&cfg.PeerCert, "peer-cert", "SERVICE_PEER_CERT", cfg.PeerCert, "PEM certificate this node presents to peers: mutual TLS on the RPC port (with --peer-key and --peer-ca)")
	f.String(&cfg.PeerKey, "peer-key", "SERVICE_PEER_KEY", cfg.PeerKey, "PEM private key for --peer-cert")
	f.String(&cfg.PeerCA, "peer-ca", "SERVICE_PEER_CA", cfg.PeerCA, "PEM CA certificate(s) peers' certificates must chain to (a CA dedicated to the mesh)")
	f.String(logLevel, "log-level", "SERVICE_LOG_LEVEL", *logLevel, "debug, info, warn or error")
	providerLegacyFlags(f, cfg)
	return f
}

func serve(args []string, stderr io.Writer) int {
	cfg := node.Defaults()
	cfg.Version = version
	logLevel := "info"
	logFormat := "text"
	f := serveFlags(&cfg, &logLevel)
	f.String(&logFormat, "log-format", "SERVICE_LOG_FORMAT", logFormat, "log line format: text or json")
	f.fs.SetOutput(stderr)
	if err := f.Parse(joinLegacyListen(args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "infermesh serve: %v\n", err)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		fmt.Fprintf(stderr, "infermesh serve: log level %q: want debug, info, warn or error\n", logLevel)
		return 2
	}
	logger, err := newLogger(stderr, logFormat, level)
	if err != nil {
		fmt.Fprintf(stderr, "infermesh serve: %v\n", err)
		return 2
	}
	cfg.Logger = logger
	n, err := node.New(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "infermesh serve: %v\n", err)
		return 2
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	if err := n.Start(context.Background()); err != nil {
		fmt.Fprintf(stderr, "infermesh serve: %v\n", err)
		return 1
	}
	gcCtx, stopGC := context.WithCancel(context.Background())
	defer stopGC()
	go keepGCFloor(gcCtx)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			cfg.Logger.Info("SIGHUP: reloading TLS certificates")
			_ = n.ReloadTLS() // failures are logged; the old certificates stay
		}
	}()
	select {
	case sig := <-sigs:
		cfg.Logger.Info("signal received; draining", "signal", sig.String())
	case err := <-n.Fatal():
		cfg.Logger.Error("stopping after a fatal error", "err", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- n.Drain(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			cfg.Logger.Warn("drain did not finish cleanly", "err", err)
			return 1
		}
		return 0
	case sig := <-sigs:
		cfg.Logger.Warn("second signal; exiting now", "signal", sig.String())
		return 1
	}
}

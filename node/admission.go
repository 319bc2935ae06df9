package node

import (
	"context"
	"log/slog"

	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/audit"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/auth"
	"github.com/infermesh/infermesh/node/legacy"
	"github.com/infermesh/infermesh/node/limits"
)

// admissionDeps are what the api.Admission needs besides the raft group
// it reads keys, prices and leases from (start).
type admissionDeps struct {
	nodeID, listen  string
	trustProxy      bool
	legacyAllowPull bool // the legacy listener's keyless caller may pull
	limits          LimitsConfig
	inflightCap     int
	fastTimers      bool
	cluster         *cluster   // raft, once Start built it
	obs             *observer  // metrics of admitted requests
	audit           *audit.Log // nil when the audit log is off
	log             *slog.Logger
	reg             *prometheus.Registry
	clock           func() time.Time
	localServed     func(model string) // a request this node served ended (model memory)
}

// admission is the api.Admission: callers are authenticated from the
// replicated keys (node/auth) and counted work is admitted against rpm
// buckets and raft-leased quotas and budgets (node/limits). It owns the
// busy gate the local handler is wrapped in (gateLocal).
type admission struct {
	admissionDeps
	authn   *auth.Authenticator
	limiter *limits.Limiter
	gate    *limits.Gate // busy gate ordering engine work by priority
}

func newAdmission(d admissionDeps) *admission { return &admission{admissionDeps: d} }

var _ api.Admission = (*admission)(nil)

// replicatedKeys is auth's KeyStore over the local raft replica.
type replicatedKeys struct{ n *consensus.Node }

// KeyByHash looks a key up by the SHA-256 of its plaintext.
func (v replicatedKeys) KeyByHash(h [32]byte) (auth.Key, bool) {
	k, ok := v.n.State().KeyByHash(consensus.KeyHash(h))
	if !ok {
		return auth.Key{}, false
	}
	return auth.Key{
		ID: k.ID, Hash: h, Name: k.Name, App: k.App, Admin: k.Admin, Endpoints: k.Endpoints,
		Limits:    auth.Limits{RPM: k.Limits.RPM, DailyQuota: k.Limits.DailyQuota, MonthlyBudgetMicros: k.Limits.MonthlyBudgetMicros},
		ExpiresAt: k.ExpiresAt, Revoked: k.Revoked,
	}, true
}

func denialError(d *auth.Denial) *apierr.Error {
	e := apierr.New(d.Status, d.Type, d.Code, "", d.Message)
	e.RetryAfter = d.RetryAfter
	e.Upgrade = limits.Upgrade(d)
	return e
}

// start builds the authenticator, busy gate and limiter over raft.
func (n *admission) start() {
	c := n.cluster
	n.authn = auth.New(auth.Config{LoopbackListener: auth.LoopbackOnly(n.listen), TrustProxy: n.trustProxy},
		replicatedKeys{c.raft}, n.log, n.reg, n.clock)
	// A budgeted request without an output cap reserves the local
	// decoder's default output cap, so the reservation covers the charge.
	lc := n.limits
	capacity := lc.BusyCapacity
	if capacity == 0 {
		capacity = n.inflightCap
	}
	n.gate = limits.NewGate(limits.GateConfig{MaxInflight: capacity, MaxQueue: lc.BusyQueue, Reserve: lc.BusyReserve, MaxWait: lc.BusyWait}, n.reg, n.clock)
	// The gate is entered where the work runs (gateLocal), not where the
	// request enters: a node that forwards a request holds no slot for it.
	lcfg := limits.Config{
		KeyRPM: lc.KeyRPM, ClientRPM: lc.ClientRPM,
		Prices: limits.NewConsensusPrices(c.raft), DefaultOutputTokens: defaultReservedOutput,
		Plan: limits.NewConsensusPlan(c.raft), ThirdPartyTools: lc.ThirdPartyTools,
	}
	if n.fastTimers {
		lcfg.LeaseTTL = 5 * time.Second // holdings of a killed node expire within a test
	}
	n.limiter = limits.New(lcfg, limits.NewConsensusLeaser(c.raft), n.log, n.reg, n.clock)
}

// Authenticate resolves the caller of a request.
func (n *admission) Authenticate(r *http.Request) (context.Context, *apierr.Error) {
	if legacy.FromLegacy(r.Context()) {
		c := legacyCaller(n.legacyAllowPull)
		if d := n.authn.Authorize(c, auth.Classify(r.Method, r.URL.Path)); d != nil {
			return nil, denialError(d)
		}
		return auth.WithCaller(r.Context(), c), nil
	}
	// A replica that has not caught up (just restarted, or cut off from the
	// leader) may not know a key created elsewhere yet: answer a key it does
	// not know with a retryable 503 rather than a 401 that would also count
	// toward the caller's wrong-key block. The chaos suite found restarted
	// nodes refusing valid keys for seconds.
	// (Not for a loopback-only node's own callers: an unknown key from them
	// is ignored by the loopback rule anyway.)
	ip := net.ParseIP(api.ClientAddr(r.Context()))
	operator := auth.LoopbackOnly(n.listen) && ip != nil && ip.IsLoopback()
	if key, ok := auth.KeyFromHeader(r.Header); ok && !operator && !n.cluster.raft.CaughtUp() {
		if _, known := (replicatedKeys{n.cluster.raft}).KeyByHash(auth.HashKey(key)); !known {
			e := apierr.New(http.StatusServiceUnavailable, apierr.TypeServer, apierr.CodeCatchingUp, "",
				"This node's copy of the API keys is catching up with the cluster; retry shortly or use another node.")
			e.RetryAfter = 1
			return nil, e
		}
	}
	caller, d := n.authn.Authenticate(r, api.ClientAddr(r.Context()), nil)
	if d != nil {
		return nil, denialError(d)
	}
	return auth.WithCaller(r.Context(), caller), nil
}

// CallerKeyID is the id of the key the caller in ctx authenticated with,
// "" for keyless callers.
func (n *admission) CallerKeyID(ctx context.Context) string {
	c, _ := auth.CallerFrom(ctx)
	return c.KeyID
}

// Admit counts a request for model against the caller's limits; done
// reports how it ended.
func (n *admission) Admit(r *http.Request, model string, body []byte) (func(api.Served), *apierr.Error) {
	caller, _ := auth.CallerFrom(r.Context())
	req := limits.Request{
		Caller:     caller,
		ClientAddr: api.ClientAddr(r.Context()),
		Class:      auth.Classify(r.Method, r.URL.Path),
		Counted:    auth.Counted(r.Method, r.URL.Path),
		Model:      model,
		Priority:   limits.ParsePriority(r.Header.Get(limits.PriorityHeader)),
		UserAgent:  r.Header.Get("User-Agent"),
		Batch:      strings.HasPrefix(r.URL.Path, "/v1/batch/"),
	}
	start := n.clock()
	if caller.Limits.MonthlyBudgetMicros > 0 && body != nil {
		// Only budgets need the estimate; it bounds the real cost from
		// above, so a reservation is never smaller than the charge.
		req.InputTokens, req.MaxOutputTokens = api.EstimateTokens(body)
	}
	t, d := n.limiter.Admit(r.Context(), req)
	audited := req.Counted && !caller.Forwarded
	if d != nil {
		if audited {
			auditRequest(n.audit, n.clock, r, model, start, api.Served{Status: d.Status})
		}
		return nil, denialError(d)
	}
	return func(s api.Served) {
		n.obs.served(r, model, s)
		if audited {
			auditRequest(n.audit, n.clock, r, model, start, s)
		}
		worker := s.Backend
		if worker == n.nodeID {
			worker = "" // the reporting node itself
			n.localServed(model)
		}
		t.Done(limits.Usage{Status: s.Status, PromptTokens: s.PromptTokens, CompletionTokens: s.CompletionTokens, Worker: worker})
	}, nil
}

// defaultReservedOutput is the output a budget reserves for a request that
// sets no max_tokens: the local decoder's default output cap.
const defaultReservedOutput = 1024

// envAdminKeyPrefix starts the id of the admin key stored from
// SERVICE_ADMIN_KEY; the rest is derived from the key's hash, so a new
// value gets a new id and never collides with the bootstrap key.
const envAdminKeyPrefix = "key_admin_env_"

// bootstrapAdminKeyID is the id of the admin key a bootstrapping node
// generates when SERVICE_ADMIN_KEY is not set.
const bootstrapAdminKeyID = "key_admin_bootstrap"

// AdminKeyFile is the file in the data directory that receives the
// bootstrap admin key (mode 0600); the log names the file, never the key.
const AdminKeyFile = "admin-key"

// ensureAdminKey makes sure an operator can reach the admin API. The key
// in SERVICE_ADMIN_KEY is stored under its own id (envAdminKeyPrefix +
// hash prefix); an env admin key stored earlier with another value is
// revoked, so changing the variable and restarting a node replaces the
// key. Without the variable, the node that bootstrapped the mesh creates
// one admin key when there is none and writes it to <data-dir>/admin-key.
func (n *Node) ensureAdminKey(bootstrapped bool) {
	plain := os.Getenv("SERVICE_ADMIN_KEY")
	if plain == "" && !bootstrapped {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := n.cluster.raft.WaitForLeader(ctx); err != nil {
		n.log.Warn("no raft leader; admin key not ensured", "err", err)
		return
	}
	if plain != "" {
		n.ensureEnvAdminKey(ctx, plain)
		return
	}
	for _, k := range n.cluster.raft.State().Keys() {
		if k.Admin && !k.Revoked {
			return
		}
	}
	plain, hash := auth.NewKey()
	path := filepath.Join(n.cfg.DataDir, AdminKeyFile)
	if err := writeSecretFile(path, plain+"\n"); err != nil {
		n.log.Warn("could not write the bootstrap admin key; none created", "file", path, "err", err)
		return
	}
	id := bootstrapAdminKeyID
	if _, taken := n.cluster.raft.State().Key(id); taken {
		id = "" // derived from the hash
	}
	cmd, err := consensus.CreateKey(consensus.KeySpec{ID: id, Hash: consensus.KeyHash(hash), Name: "bootstrap admin", Admin: true})
	if err == nil {
		_, err = n.cluster.raft.Apply(ctx, cmd)
	}
	if err != nil {
		os.Remove(path)
		n.log.Warn("could not store the bootstrap admin key", "err", err)
		return
	}
	n.log.Info("bootstrap admin key created and written to a file readable only by this user", "file", path)
}

// ensureEnvAdminKey stores the SERVICE_ADMIN_KEY key and revokes env
// admin keys of earlier values.
func (n *Node) ensureEnvAdminKey(ctx context.Context, plain string) {
	hash := consensus.KeyHash(auth.HashKey(plain))
	id := envAdminKeyPrefix + hex.EncodeToString(hash[:6])
	st := n.cluster.raft.State()
	if k, ok := st.KeyByHash(hash); ok {
		if k.Revoked || !k.Admin {
			n.log.Warn("SERVICE_ADMIN_KEY names a key that is revoked or not an admin key; set another value", "key_id", k.ID)
			return
		}
	} else {
		cmd, err := consensus.CreateKey(consensus.KeySpec{ID: id, Hash: hash, Name: "admin (SERVICE_ADMIN_KEY)", Admin: true})
		if err == nil {
			_, err = n.cluster.raft.Apply(ctx, cmd)
		}
		if err != nil {
			n.log.Warn("could not store SERVICE_ADMIN_KEY", "err", err)
			return
		}
		n.log.Info("SERVICE_ADMIN_KEY stored as an admin key", "key_id", id)
	}
	for _, k := range n.cluster.raft.State().Keys() {
		if !strings.HasPrefix(k.ID, envAdminKeyPrefix) || k.Hash == hash || k.Revoked {
			continue
		}
		cmd, err := consensus.RevokeKey(k.ID)
		if err == nil {
			_, err = n.cluster.raft.Apply(ctx, cmd)
		}
		if err != nil {
			n.log.Warn("could not revoke the previous SERVICE_ADMIN_KEY", "key_id", k.ID, "err", err)
			continue
		}
		n.log.Info("previous SERVICE_ADMIN_KEY revoked", "key_id", k.ID)
	}
}

// writeSecretFile writes content to path with mode 0600, atomically.
func writeSecretFile(path, content string) error {
	tmp := path + ".tmp"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

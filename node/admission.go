package node

import (
	"context"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/auth"
	"github.com/infermesh/infermesh/node/legacy"
	"github.com/infermesh/infermesh/node/limits"
)

// This file makes *Node the api.Admission: callers are authenticated from
// the replicated keys (node/auth) and counted work is admitted against
// rpm buckets and raft-leased quotas and budgets (node/limits).

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

func denialError(d *auth.Denial) *api.APIError {
	e := api.Errorf(d.Status, d.Type, d.Code, "", d.Message)
	e.RetryAfter = d.RetryAfter
	return e
}

// startAdmission builds the authenticator and limiter over raft.
func (n *Node) startAdmission() error {
	c := n.cluster
	n.authn = auth.New(auth.Config{LoopbackListener: auth.LoopbackOnly(n.cfg.Listen), TrustProxy: n.cfg.TrustProxy},
		replicatedKeys{c.raft}, n.log, n.reg, n.clock)
	n.limiter = limits.New(limits.Config{Prices: limits.NewConsensusPrices(c.raft)}, limits.NewConsensusLeaser(c.raft), n.log, n.reg, n.clock)
	return nil
}

// Authenticate resolves the caller of a request.
func (n *Node) Authenticate(r *http.Request) (context.Context, *api.APIError) {
	if legacy.FromLegacy(r.Context()) {
		c := legacyCaller(n.cfg.Legacy.AllowPull)
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
	operator := auth.LoopbackOnly(n.cfg.Listen) && ip != nil && ip.IsLoopback()
	if key, ok := auth.KeyFromHeader(r.Header); ok && !operator && !n.cluster.raft.CaughtUp() {
		if _, known := (replicatedKeys{n.cluster.raft}).KeyByHash(auth.HashKey(key)); !known {
			e := api.Errorf(http.StatusServiceUnavailable, api.TypeServer, "replica_catching_up", "",
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

// Admit counts a request for model against the caller's limits; done
// reports how it ended.
func (n *Node) Admit(r *http.Request, model string) (func(status int), *api.APIError) {
	caller, _ := auth.CallerFrom(r.Context())
	t, d := n.limiter.Admit(r.Context(), limits.Request{
		Caller:     caller,
		ClientAddr: api.ClientAddr(r.Context()),
		Class:      auth.Classify(r.Method, r.URL.Path),
		Counted:    auth.Counted(r.Method, r.URL.Path),
		Model:      model,
		Priority:   limits.ParsePriority(r.Header.Get(limits.PriorityHeader)),
	})
	if d != nil {
		return nil, denialError(d)
	}
	return func(status int) { t.Done(limits.Usage{Status: status}) }, nil
}

// ensureAdminKey makes sure an operator can reach the admin API: the key in
// SERVICE_ADMIN_KEY is stored (idempotently), or the node that bootstrapped
// the mesh creates one admin key and prints it once.
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
	var hash [32]byte
	if plain != "" {
		hash = auth.HashKey(plain)
		if _, ok := n.cluster.raft.State().KeyByHash(consensus.KeyHash(hash)); ok {
			return
		}
	} else {
		for _, k := range n.cluster.raft.State().Keys() {
			if k.Admin {
				return
			}
		}
		plain, hash = auth.NewKey()
	}
	cmd, err := consensus.CreateKey(consensus.KeySpec{ID: "key_admin_bootstrap", Hash: consensus.KeyHash(hash), Name: "bootstrap admin", Admin: true})
	if err == nil {
		_, err = n.cluster.raft.Apply(ctx, cmd)
	}
	if err != nil {
		n.log.Warn("could not store the admin key", "err", err)
		return
	}
	if os.Getenv("SERVICE_ADMIN_KEY") == "" {
		// Printed once, on the node that bootstrapped the mesh; only its
		// hash is stored.
		n.log.Info("bootstrap admin key created; it is shown only now", "admin_key", plain)
	}
}

package auth

import (
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the wrong-key throttle.
const (
	DefaultMaxFailures    = 10
	DefaultFailureWindow  = time.Minute
	DefaultBlockFor       = time.Minute
	DefaultTrackedClients = 10000
)

// Config configures an Authenticator.
type Config struct {
	// LoopbackListener is true when the node's client listener is bound to
	// loopback addresses only (see LoopbackOnly). Only then do loopback
	// callers need no key.
	LoopbackListener bool
	// TrustProxy is set when a proxy in front of the node supplies
	// X-Forwarded-For (SERVICE_TRUST_PROXY). Every request then needs a
	// key: behind a proxy, loopback says nothing about the real client.
	TrustProxy bool
	// MaxFailures wrong keys within FailureWindow block a client address
	// for BlockFor (defaults 10, 1m, 1m).
	MaxFailures   int
	FailureWindow time.Duration // see MaxFailures
	BlockFor      time.Duration // see MaxFailures
	// TrackedClients bounds the addresses the throttle remembers
	// (default 10000); the least recently seen are forgotten first.
	TrackedClients int
}

// Authenticator establishes the Caller of each request.
type Authenticator struct {
	cfg      Config
	keys     KeyStore
	log      *slog.Logger
	clock    func() time.Time
	throttle *throttle
	m        *metrics
}

// New returns an Authenticator over keys. reg receives its metrics (nil
// registers nothing); clock nil uses time.Now; logger nil discards.
func New(cfg Config, keys KeyStore, logger *slog.Logger, reg prometheus.Registerer, clock func() time.Time) *Authenticator {
	if cfg.MaxFailures <= 0 {
		cfg.MaxFailures = DefaultMaxFailures
	}
	if cfg.FailureWindow <= 0 {
		cfg.FailureWindow = DefaultFailureWindow
	}
	if cfg.BlockFor <= 0 {
		cfg.BlockFor = DefaultBlockFor
	}
	if cfg.TrackedClients <= 0 {
		cfg.TrackedClients = DefaultTrackedClients
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if clock == nil {
		clock = time.Now
	}
	a := &Authenticator{
		cfg: cfg, keys: keys, log: logger, clock: clock,
		throttle: newThrottle(cfg.MaxFailures, cfg.FailureWindow, cfg.BlockFor, cfg.TrackedClients),
	}
	a.m = newMetrics(reg, a.throttle)
	return a
}

// Authenticate establishes who sent r and whether they may use its
// endpoint. clientAddr is the client's IP as the node computed it (the
// first X-Forwarded-For hop only when the node trusts a proxy). forwarded
// is non-nil for a request a peer forwarded; its identity is used as is
// and the request is never treated as loopback. On refusal the Denial
// says how to answer.
func (a *Authenticator) Authenticate(r *http.Request, clientAddr string, forwarded *ForwardedIdentity) (Caller, *Denial) {
	if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
		a.m.public.Inc()
		return Caller{Public: true}, nil
	}
	class := Classify(r.Method, r.URL.Path)
	if class.Public() {
		a.m.public.Inc()
		return Caller{Public: true}, nil
	}
	if forwarded != nil {
		c := forwarded.Caller()
		if d := a.Authorize(c, class); d != nil {
			return c, d
		}
		a.m.forwarded.Inc()
		return c, nil
	}
	plaintext, present := KeyFromRequest(r)
	local := a.isLocal(r, clientAddr)
	if local && !present {
		a.m.local.Inc()
		return operator(), nil
	}
	if !local {
		if wait := a.throttle.blocked(clientAddr, a.clock); wait > 0 {
			a.m.throttled.Inc()
			return Caller{}, denyThrottled(wait)
		}
	}
	if !present {
		a.m.missing.Inc()
		return Caller{}, denyKey(msgMissingKey)
	}
	key, ok := a.keys.KeyByHash(HashKey(plaintext))
	if !ok {
		if local {
			// SDKs insist on some key; on loopback an unknown one is
			// ignored and the operator rule applies.
			a.m.local.Inc()
			return operator(), nil
		}
		a.m.invalid.Inc()
		return Caller{}, a.failed(clientAddr, a.clock(), msgWrongKey)
	}
	// The clock is read only for keys that can expire.
	if key.Revoked || !key.ExpiresAt.IsZero() && !key.Active(a.clock()) {
		a.m.inactive.Inc()
		if local {
			return Caller{}, denyKey(msgInactive)
		}
		return Caller{}, a.failed(clientAddr, a.clock(), msgInactive)
	}
	c := callerFromKey(key)
	if d := a.Authorize(c, class); d != nil {
		return c, d
	}
	a.m.key.Inc()
	return c, nil
}

// failed records a wrong key; the request that crosses the limit is
// already answered 429.
func (a *Authenticator) failed(addr string, now time.Time, msg string) *Denial {
	if a.throttle.fail(addr, now) {
		a.log.Warn("client blocked after repeated wrong API keys", "client", addr, "for", a.cfg.BlockFor)
		return denyThrottled(a.cfg.BlockFor)
	}
	return denyKey(msg)
}

// Authorize checks that an already identified caller may use an endpoint
// class: its allowlist, admin-only classes and the pull permission.
func (a *Authenticator) Authorize(c Caller, class Class) *Denial {
	if !c.Allows(class) {
		a.m.forbidden.Inc()
		return denyPermission("This API key is not allowed to use the " + class.String() + " endpoints.")
	}
	if class.AdminOnly() && !c.Admin {
		a.m.forbidden.Inc()
		return denyPermission("The " + class.String() + " endpoints need an admin API key.")
	}
	if class == ClassPull && !c.MayPull() {
		a.m.forbidden.Inc()
		return denyPermission("Pulling models needs an admin API key or a key whose allowlist names pull.")
	}
	return nil
}

// isLocal applies the loopback rule: a loopback-only listener, no trusted
// proxy, and both the connection's peer and the client address on
// loopback.
func (a *Authenticator) isLocal(r *http.Request, clientAddr string) bool {
	if !a.cfg.LoopbackListener || a.cfg.TrustProxy {
		return false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return isLoopback(host) && isLoopback(clientAddr)
}

func isLoopback(host string) bool {
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// KeyFromHeader returns the API key a request carries, from
// "Authorization: Bearer", "api-key" or "x-api-key" in that order.
func KeyFromHeader(h http.Header) (string, bool) {
	if v := h.Get("Authorization"); v != "" {
		if scheme, tok, ok := strings.Cut(strings.TrimSpace(v), " "); ok && strings.EqualFold(scheme, "Bearer") {
			if tok = strings.TrimSpace(tok); tok != "" {
				return tok, true
			}
		}
	}
	for _, name := range [...]string{"Api-Key", "X-Api-Key"} {
		if v := strings.TrimSpace(h.Get(name)); v != "" {
			return v, true
		}
	}
	return "", false
}

// KeyPrefixSubprotocol marks a WebSocket subprotocol that carries an API
// key: browsers cannot set headers on a WebSocket, so they offer
// "infermesh.key.<key>" next to the real subprotocol.
const KeyPrefixSubprotocol = "infermesh.key."

// KeyFromRequest returns the API key a request carries: from its headers
// (KeyFromHeader) or, for a WebSocket upgrade only, from the query
// parameter api_key or a subprotocol KeyPrefixSubprotocol+key. Headers win.
func KeyFromRequest(r *http.Request) (string, bool) {
	if k, ok := KeyFromHeader(r.Header); ok {
		return k, true
	}
	if r.Method != http.MethodGet || !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return "", false
	}
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			if k, ok := strings.CutPrefix(strings.TrimSpace(p), KeyPrefixSubprotocol); ok && k != "" {
				return k, true
			}
		}
	}
	if k := strings.TrimSpace(r.URL.Query().Get("api_key")); k != "" {
		return k, true
	}
	return "", false
}

// LoopbackOnly reports whether a listen address ("host:port") binds only
// loopback addresses: a loopback IP or "localhost". An empty host, a
// wildcard or any other address is not loopback-only.
func LoopbackOnly(listenAddr string) bool {
	host, _, err := net.SplitHostPort(listenAddr)
	if err != nil {
		host = listenAddr
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	return isLoopback(host)
}

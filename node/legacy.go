package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/infermesh/infermesh/node/auth"
	"github.com/infermesh/infermesh/node/legacy"
)

// LegacyConfig enables the legacy (Ollama-shaped) API on a second listener.
type LegacyConfig struct {
	// Listen is its address; empty leaves it off.
	Listen string
	// AllowRemote serves callers on other computers too.
	AllowRemote bool
	// AllowPull lets legacy callers (who carry no key) make the node
	// download models with /api/pull; off by default.
	AllowPull bool
	// EndDate is its last day (UTC); zero means legacy.DefaultEndDate().
	EndDate time.Time
}

// validate checks the legacy settings.
func (c LegacyConfig) validate() []error {
	if c.Listen == "" {
		return nil
	}
	if _, port, err := net.SplitHostPort(c.Listen); err != nil || port == "" {
		return []error{fmt.Errorf("legacy listen %q: want host:port", c.Listen)}
	}
	return nil
}

// legacyServer is the running legacy listener.
type legacyServer struct {
	srv    *http.Server
	ln     net.Listener
	served chan error
}

// legacyCaller is who a legacy API call is admitted as: no key (the legacy
// API needs none; it is loopback-only unless the operator opened it), not
// an admin, and only the endpoint classes the legacy calls map onto; pulls
// only when the operator enabled them (--legacy-allow-pull).
func legacyCaller(allowPull bool) auth.Caller {
	eps := []string{"chat", "embeddings", "models"}
	if allowPull {
		eps = append(eps, "pull")
	}
	return auth.Caller{Name: "legacy API", App: "legacy", Endpoints: eps}
}

// startLegacy opens the legacy listener when configured.
func (n *Node) startLegacy() error {
	lc := n.cfg.Legacy
	if lc.Listen == "" {
		return nil
	}
	ln, err := net.Listen("tcp", lc.Listen)
	if err != nil {
		return fmt.Errorf("legacy listen on %s: %w", lc.Listen, err)
	}
	scheme := "http://"
	if n.tls != nil && n.tls.client != nil {
		// The legacy port serves the client certificate too (reloaded
		// with it).
		scheme = "https://"
	}
	ln = n.tls.ClientListener(ln, 10*time.Second)
	h := legacy.New(legacy.Options{
		V1:          n.api.Handler(),
		EndDate:     lc.EndDate,
		AllowRemote: lc.AllowRemote,
		V1Base:      scheme + n.Addr(),
		Version:     n.cfg.Version,
		Logger:      n.log,
		Clock:       n.clock,
	})
	l := &legacyServer{ln: ln, served: make(chan error, 1), srv: &http.Server{
		Handler:           h.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(n.log.Handler(), slog.LevelWarn),
	}}
	n.legacy = l
	go func() { l.served <- l.srv.Serve(ln) }()
	n.log.Info("legacy API listening", "addr", ln.Addr().String(), "tls", scheme == "https://", "end_date", h.EndDate().Format(time.DateOnly), "allow_remote", lc.AllowRemote)
	return nil
}

// stopLegacy closes the legacy listener; calls still running finish
// within ctx (the node's drain waits for them like for any /v1 call).
func (n *Node) stopLegacy(ctx context.Context) {
	l := n.legacy
	if l == nil {
		return
	}
	l.srv.SetKeepAlivesEnabled(false)
	if err := l.srv.Shutdown(ctx); err != nil {
		l.srv.Close()
	}
	if err := <-l.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		n.log.Warn("legacy server stopped", "err", err)
	}
}

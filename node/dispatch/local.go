package dispatch

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/mesh/route"
)

type modelKey struct{}

// Local returns the node's local-only handler wrapped with in-flight
// accounting: it counts the requests this node serves (its own and those
// forwarded in), reports the count and per-model serve times to Load, and
// answers 503 with Retry-After when this node is at its cap (a forwarding
// peer then tries its next candidate). Give it to forward.NewServer.
// Upgrades (live sessions) are not requests in flight: they last minutes,
// so counting them would let a few idle sessions fill the cap; the API
// caps them apart (api.SessionLimits).
func (d *Dispatcher) Local() http.Handler {
	return http.HandlerFunc(d.serveLocal)
}

func (d *Dispatcher) serveLocal(w http.ResponseWriter, r *http.Request) {
	if upgradeProtocol(r) != "" {
		d.local.ServeHTTP(w, r)
		return
	}
	cap := d.localCap(d.policy.Policy())
	n := d.inFlight.Add(1)
	if cap > 0 && n > int64(cap) {
		d.reportInFlight(d.inFlight.Add(-1))
		d.met.localRejected.Inc()
		d.writeSaturated(w, r, d.selfRetryAfter(modelOf(r), int(n-1), cap))
		return
	}
	d.reportInFlight(n)
	start := d.cfg.Clock()
	defer func() {
		d.reportInFlight(d.inFlight.Add(-1))
		if m := modelOf(r); m != "" && d.load != nil {
			d.load.ObserveLatency(m, d.cfg.Clock().Sub(start))
		}
	}()
	d.local.ServeHTTP(w, r)
}

func (d *Dispatcher) reportInFlight(n int64) {
	d.met.inFlight.Set(float64(n))
	if d.load != nil {
		d.load.SetInFlight(int(n))
	}
}

// selfRetryAfter estimates when this node has room, from its own record.
func (d *Dispatcher) selfRetryAfter(model string, inFlight, cap int) time.Duration {
	for _, p := range d.peers.Peers() {
		if p.Self {
			p.InFlight, p.MaxInFlight = inFlight, cap
			p.Health = route.HealthReady
			if p.Models == nil || !p.Has(model) {
				p.Models = map[string]route.Model{model: {}}
			}
			return route.RetryAfter(model, []route.Peer{p})
		}
	}
	return time.Second
}

// modelOf returns the model a request is being served for.
func modelOf(r *http.Request) string {
	if m, ok := r.Context().Value(modelKey{}).(string); ok {
		return m
	}
	if i, ok := forward.InfoFrom(r.Context()); ok {
		return i.Model
	}
	return ""
}

// tryLocal serves the request on this node. When last is false a 502, 503
// or 504 from the local handler is held back and reported as not done, so
// the next candidate can serve instead. counted says whether to go through
// the in-flight accounting of Local.
func (d *Dispatcher) tryLocal(w http.ResponseWriter, r *http.Request, f Facts, body []byte, last bool, counted bool) (Outcome, bool) {
	aw := &attemptWriter{w: w, backend: d.cfg.NodeID, last: last, header: http.Header{}}
	lr := r.WithContext(context.WithValue(r.Context(), modelKey{}, f.Model))
	lr.Body = io.NopCloser(bytes.NewReader(body))
	lr.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	lr.ContentLength = int64(len(body))
	if len(body) == 0 {
		lr.Body = http.NoBody
	}
	if counted {
		d.serveLocal(aw, lr)
	} else {
		d.local.ServeHTTP(aw, lr)
	}
	if aw.suppressed {
		return Outcome{Err: fmt.Errorf("%w: %d from this node", errUnavailable, aw.status)}, false
	}
	if !aw.committed {
		aw.WriteHeader(http.StatusOK) // the handler wrote nothing
	}
	return Outcome{Backend: d.cfg.NodeID, Status: aw.status, Usage: aw.usage}, true
}

// attemptWriter stands between the local handler and the client for one
// attempt. It holds the handler's headers until the status is known; a
// retryable status on a non-final attempt is swallowed (nothing reaches the
// client), anything else is committed with X-Service-Backend set.
type attemptWriter struct {
	w          http.ResponseWriter
	backend    string
	last       bool
	header     http.Header
	status     int
	committed  bool
	suppressed bool
	usage      forward.Usage
}

// Header returns the handler's response headers.
func (a *attemptWriter) Header() http.Header { return a.header }

// WriteHeader commits the response, or swallows a retryable one. 101
// (an upgrade the handler then hijacks) commits like a final status.
func (a *attemptWriter) WriteHeader(code int) {
	if a.committed || a.suppressed || (code >= 100 && code < 200 && code != http.StatusSwitchingProtocols) {
		return
	}
	a.status = code
	if !a.last && retryableStatus(code) {
		a.suppressed = true
		return
	}
	dst := a.w.Header()
	for k, v := range a.header {
		dst[k] = v
	}
	dst.Set(BackendHeader, a.backend)
	a.committed = true
	a.w.WriteHeader(code)
}

// Write writes body bytes (discarded for a swallowed response).
func (a *attemptWriter) Write(p []byte) (int, error) {
	if !a.committed && !a.suppressed {
		a.WriteHeader(http.StatusOK)
	}
	if a.suppressed {
		return len(p), nil
	}
	return a.w.Write(p)
}

// Flush commits and flushes to the client.
func (a *attemptWriter) Flush() { _ = a.FlushError() }

// FlushError is Flush reporting failure.
func (a *attemptWriter) FlushError() error {
	if !a.committed && !a.suppressed {
		a.WriteHeader(http.StatusOK)
	}
	if a.suppressed {
		return nil
	}
	return http.NewResponseController(a.w).Flush()
}

// SetUsage records token usage (see forward.UsageSetter).
func (a *attemptWriter) SetUsage(promptTokens, completionTokens int64) {
	a.usage = forward.Usage{PromptTokens: promptTokens, CompletionTokens: completionTokens}
}

// Unwrap lets http.ResponseController reach the client's writer.
func (a *attemptWriter) Unwrap() http.ResponseWriter { return a.w }

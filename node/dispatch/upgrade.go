package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/mesh/route"
)

// Relayer relays HTTP upgrades (WebSockets) to peers (forward.Client
// implements it). A Forwarder that is not also a Relayer cannot send
// upgrades to peers; they are then served only by this node.
type Relayer interface {
	// Relay opens a relay of the upgrade request req (protocol is its
	// Upgrade header) to the peer at RPC address addr.
	Relay(ctx context.Context, addr string, req *forward.Request, protocol string) (*forward.Tunnel, error)
}

// upgradeProtocol returns the protocol a request asks to upgrade to (its
// Upgrade header, when Connection names upgrade), or "".
func upgradeProtocol(r *http.Request) string {
	up := strings.TrimSpace(r.Header.Get("Upgrade"))
	if up == "" || r.Method != http.MethodGet {
		return ""
	}
	for _, v := range r.Header["Connection"] {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), "upgrade") {
				return up
			}
		}
	}
	return ""
}

// tryUpgrade relays an upgrade request to peer p. Until the peer answers,
// failures fail over exactly as in tryRemote. A refusal (any status but
// 101) is passed on like a plain response. On 101 the client's connection
// is hijacked and bytes are copied both ways until either side closes; the
// attempt is then done.
func (d *Dispatcher) tryUpgrade(w http.ResponseWriter, r *http.Request, f Facts, p *route.Peer, protocol string, last bool) (Outcome, bool) {
	rl, ok := d.fwd.(Relayer)
	if !ok {
		return Outcome{Err: fmt.Errorf("%w: this node cannot relay upgrades", errUnavailable)}, false
	}
	// A relayed session is not counted as outbound work to p: it lasts
	// minutes, and counting it would make p look saturated to this node's
	// requests (sessions are capped apart, api.SessionLimits).
	req := &forward.Request{
		Method:    r.Method,
		Path:      r.URL.RequestURI(),
		Host:      r.Host,
		Header:    d.requestHeader(r.Header),
		Caller:    f.Caller,
		RequestID: f.RequestID,
		Model:     f.Model,
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	a := &attempt{cancel: cancel}
	d.watch.start(p.ID, a)
	t, err := rl.Relay(ctx, p.RPCAddr, req, protocol)
	var head forward.Head
	if err == nil {
		head, err = t.Head()
	}
	d.watch.stop(p.ID, a)
	if err != nil {
		if t != nil {
			t.Close()
		}
		return d.failedBeforeHead(w, r, f, p, a, err, "peer failed before answering an upgrade")
	}
	defer t.Close()
	if head.Status != http.StatusSwitchingProtocols {
		if !last && retryableStatus(head.Status) {
			return Outcome{Err: fmt.Errorf("%w: %d from %s", errUnavailable, head.Status, p.ID)}, false
		}
		dst := w.Header()
		for k, v := range head.Header {
			dst[k] = v
		}
		dst.Set(BackendHeader, p.ID)
		w.WriteHeader(head.Status)
		o := Outcome{Backend: p.ID, Status: head.Status, Forwarded: true}
		if _, err := io.Copy(w, t); err != nil {
			o.Err = fmt.Errorf("%w: refusal from %s broke off: %w", ErrIncomplete, p.ID, err)
		}
		return o, true
	}
	return d.splice(w, t, head, p.ID, protocol), true
}

// splice answers the client 101 with the peer's headers, hijacks its
// connection and copies bytes both ways until one side closes.
func (d *Dispatcher) splice(w http.ResponseWriter, t *forward.Tunnel, head forward.Head, backend, protocol string) Outcome {
	o := Outcome{Backend: backend, Status: http.StatusSwitchingProtocols, Forwarded: true}
	dst := w.Header()
	for k, v := range head.Header {
		dst[k] = v
	}
	dst.Set("Connection", "Upgrade")
	dst.Set("Upgrade", protocol)
	dst.Set(BackendHeader, backend)
	w.WriteHeader(http.StatusSwitchingProtocols)
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		o.Err = fmt.Errorf("%w: hijack the client connection: %w", ErrIncomplete, err)
		return o
	}
	defer conn.Close()
	var wg sync.WaitGroup
	var upErr error
	wg.Add(1)
	go func() { // client → peer
		defer wg.Done()
		_, upErr = io.Copy(t, brw.Reader) // buffered bytes first, then the connection
		t.CloseWrite()
	}()
	_, downErr := io.Copy(conn, t) // peer → client, until the peer closes
	conn.Close()                   // ends the client → peer copy too
	wg.Wait()
	if downErr != nil && !errors.Is(downErr, io.EOF) {
		o.Err = fmt.Errorf("%w: relay from %s broke: %w", ErrIncomplete, backend, downErr)
	}
	_ = upErr // the client going away is how sessions usually end
	return o
}

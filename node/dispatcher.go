package node

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/auth"
	"github.com/infermesh/infermesh/node/dispatch"
)

// dispatcher is the api.Dispatcher (and api.Pinned): it hands routed
// requests to node/dispatch, which startCluster built.
type dispatcher struct {
	cluster *cluster // disp, once Start built it
	log     *slog.Logger
}

var (
	_ api.Dispatcher = (*dispatcher)(nil)
	_ api.Pinned     = (*dispatcher)(nil)
)

// Serve hands a routed request to node/dispatch.
func (n *dispatcher) Serve(w http.ResponseWriter, r *http.Request, model string, body []byte, stream bool) api.Served {
	f := requestFacts(r, model)
	f.OnePiece = !stream
	o := n.cluster.disp.Serve(w, r, f, body)
	return api.Served{Backend: o.Backend, PromptTokens: o.Usage.PromptTokens, CompletionTokens: o.Usage.CompletionTokens,
		Aborted: n.brokeOff(f, o)}
}

// ServeOn makes the dispatcher an api.Pinned one: the request runs on the
// named node.
func (n *dispatcher) ServeOn(w http.ResponseWriter, r *http.Request, node string, body []byte) {
	f := requestFacts(r, "")
	if n.brokeOff(f, n.cluster.disp.ServeOn(w, r, f, node, body)) {
		panic(http.ErrAbortHandler)
	}
}

// requestFacts collects what dispatch needs to know about a request.
func requestFacts(r *http.Request, model string) dispatch.Facts {
	f := dispatch.Facts{Model: model, RequestID: api.RequestID(r.Context())}
	f.Caller.ClientAddress = api.ClientAddr(r.Context())
	if c, ok := auth.CallerFrom(r.Context()); ok {
		f.Caller.KeyID, f.Caller.App = c.KeyID, c.App
	}
	return f
}

// brokeOff reports (and logs) a response that broke off after it started:
// the caller aborts the client connection so the client sees the failure.
func (n *dispatcher) brokeOff(f dispatch.Facts, o dispatch.Outcome) bool {
	if o.Err != nil && errors.Is(o.Err, dispatch.ErrIncomplete) {
		n.log.Warn("response broke off after it started", "request_id", f.RequestID, "backend", o.Backend, "err", o.Err)
		return true
	}
	return false
}

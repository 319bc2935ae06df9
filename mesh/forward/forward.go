// Package forward carries a client's HTTP request from the node that
// received it to the peer chosen to serve it, over a Connect server-streaming
// call (infermesh.forward.v1.ForwardService), and streams the response back:
// the head, body chunks as the serving handler writes and flushes them, and
// a trailer with token usage.
//
// The Server authenticates callers by their signature under the cluster
// secret (mesh/peerauth; the secret itself is never sent), enforces the hop
// limit (a forwarded request is replayed into a local-only handler and never
// forwarded again), refuses new work while draining, and adapts the local
// handler's http.ResponseWriter to the stream. The Client keeps pooled
// connections to peers (HTTP/1.1 keep-alive by default, h2c on request).
// Neither exposes Connect types to HTTP handlers.
package forward

import (
	"context"
	"net/http"
	"net/textproto"
	"strings"
)

// MaxHops is the hop limit: a request crosses at most one node-to-node hop.
const MaxHops = 1

// RefusalHeader is set in a refusal's error metadata to say why the node
// refused ("draining").
const RefusalHeader = "Infermesh-Refusal"

// Caller is the identity the receiving node's API layer established for the
// request. The mesh carries it without interpreting it.
type Caller struct {
	// KeyID is the id of the API key that authenticated the request.
	KeyID string
	// App is the application the key belongs to.
	App string
	// ClientAddress is the client's address as the receiving node saw it.
	ClientAddress string
	// Priority is the admission priority class.
	Priority int32
}

// Request is one HTTP request to replay on a peer.
type Request struct {
	// Method is the HTTP method.
	Method string
	// Path is the request target: path and raw query.
	Path string
	// Host is the Host the client addressed.
	Host string
	// Header holds the request headers; hop-by-hop headers are dropped
	// when the request is sent.
	Header http.Header
	// Body is the request body, already read and size-limited.
	Body []byte
	// Caller is who is calling.
	Caller Caller
	// RequestID is the receiving node's request id.
	RequestID string
	// OriginNodeID is the id of the node that received the request.
	OriginNodeID string
	// Model is the model the request was routed for, if known.
	Model string
	// Unary says the response comes in one piece (no server-sent events):
	// it travels as one ForwardUnary message instead of a stream. A
	// handler flush is then ignored, and a response over the peer's unary
	// limit fails before any of it is sent.
	Unary bool
}

// Info describes a forwarded request to the local handler that serves it.
// InfoFrom returns it from the request's context.
type Info struct {
	// Caller is the identity established by the receiving node.
	Caller Caller
	// RequestID is the receiving node's request id.
	RequestID string
	// OriginNodeID is the node that received the request from the client.
	OriginNodeID string
	// Model is the model the request was routed for, if known.
	Model string
	// HopCount is the number of node-to-node hops taken (1).
	HopCount int
}

type infoKey struct{}

// InfoFrom reports whether ctx belongs to a forwarded request, and returns
// its description. Code downstream of the local-only handler uses it to
// know the request came from a peer and must not be routed again.
func InfoFrom(ctx context.Context) (Info, bool) {
	i, ok := ctx.Value(infoKey{}).(Info)
	return i, ok
}

// withInfo marks ctx as belonging to a forwarded request.
func withInfo(ctx context.Context, i Info) context.Context {
	return context.WithValue(ctx, infoKey{}, i)
}

// Usage is the token usage a serving handler reports.
type Usage struct {
	// PromptTokens counts input tokens.
	PromptTokens int64
	// CompletionTokens counts generated tokens.
	CompletionTokens int64
}

// UsageSetter is implemented by the http.ResponseWriter the Server hands to
// the local handler (and by dispatch's writers): a handler that knows the
// request's token usage reports it through SetUsage, and it travels back in
// the trailer. Handlers find it by type assertion, following Unwrap through
// any middleware writers.
type UsageSetter interface {
	// SetUsage records the request's prompt and completion token counts; a
	// later call replaces an earlier one.
	SetUsage(promptTokens, completionTokens int64)
}

// IsHopByHop reports whether a header is hop-by-hop (RFC 9110 section 7.6.1
// plus the legacy proxy headers) and therefore never forwarded.
func IsHopByHop(name string) bool {
	switch textproto.CanonicalMIMEHeaderKey(name) {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// connectionNamed returns the headers h's Connection header names (they are
// hop-by-hop too), or nil.
func connectionNamed(h http.Header) map[string]bool {
	var named map[string]bool
	for _, v := range h["Connection"] {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				if named == nil {
					named = map[string]bool{}
				}
				named[textproto.CanonicalMIMEHeaderKey(f)] = true
			}
		}
	}
	return named
}

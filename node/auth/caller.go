package auth

import (
	"context"
	"slices"
)

// LocalApp is the app name of the local operator (loopback, no key), used
// in usage records.
const LocalApp = "local"

// Caller is who sent a request, as established by Authenticate.
type Caller struct {
	KeyID     string   // key id; empty for the local operator and public requests
	Name      string   // key name, for logs
	App       string   // application the key belongs to; LocalApp for the operator
	Admin     bool     // may use usage and admin endpoints
	Local     bool     // the local operator: loopback, no key
	Public    bool     // a probe or CORS preflight: nobody in particular
	Forwarded bool     // identity received from the peer that authenticated it
	Endpoints []string // allowlist of class names; empty allows every class
	Limits    Limits   // the key's limits (zero for the operator and forwarded callers)
}

// Allows reports whether the caller's allowlist admits class. Unknown paths
// are admitted so the router can answer 404.
func (c Caller) Allows(class Class) bool {
	if class == ClassUnknown || class.Public() || len(c.Endpoints) == 0 {
		return true
	}
	return slices.Contains(c.Endpoints, class.String())
}

// MayPull reports whether the caller may make a node download models: an
// admin, or a key whose allowlist names "pull" explicitly. An empty
// allowlist (every endpoint) does not include pulls, which cost disk and
// bandwidth on every node.
func (c Caller) MayPull() bool {
	return c.Admin || slices.Contains(c.Endpoints, ClassPull.String())
}

// Forward returns the identity a peer needs to serve this caller's
// forwarded request.
func (c Caller) Forward() ForwardedIdentity {
	return ForwardedIdentity{
		KeyID: c.KeyID, Name: c.Name, App: c.App, Admin: c.Admin, Local: c.Local,
		Endpoints: slices.Clone(c.Endpoints),
	}
}

// ForwardedIdentity is the caller identity a forwarding node sends along
// with a request; the peer rebuilds the Caller from it without a key
// lookup, because the forwarding node already authenticated the key.
type ForwardedIdentity struct {
	KeyID     string   // key id; empty for the forwarding node's operator
	Name      string   // key name
	App       string   // application
	Admin     bool     // admin key (or operator)
	Local     bool     // the forwarding node's local operator
	Endpoints []string // allowlist class names
}

// Caller rebuilds the caller. It is marked Forwarded; limits were applied
// by the forwarding node and carry no values here.
func (f ForwardedIdentity) Caller() Caller {
	return Caller{
		KeyID: f.KeyID, Name: f.Name, App: f.App, Admin: f.Admin, Local: f.Local,
		Forwarded: true, Endpoints: slices.Clone(f.Endpoints),
	}
}

type callerKey struct{}

// WithCaller stores the caller in a context.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller stored by WithCaller.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

func callerFromKey(k Key) Caller {
	return Caller{KeyID: k.ID, Name: k.Name, App: k.App, Admin: k.Admin, Endpoints: k.Endpoints, Limits: k.Limits}
}

func operator() Caller {
	return Caller{Name: "local operator", App: LocalApp, Admin: true, Local: true}
}

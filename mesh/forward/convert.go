package forward

import (
	"net/http"
	"net/textproto"
	"strings"

	forwardv1 "github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1"
)

// headersToProto converts the end-to-end headers of h.
func headersToProto(h http.Header) []*forwardv1.Header {
	named := connectionNamed(h)
	vals := make([]forwardv1.Header, 0, len(h))
	for k, vs := range h {
		if IsHopByHop(k) || named[textproto.CanonicalMIMEHeaderKey(k)] {
			continue
		}
		vals = append(vals, forwardv1.Header{Name: k, Values: vs})
	}
	out := make([]*forwardv1.Header, len(vals))
	for i := range vals {
		out[i] = &vals[i]
	}
	return out
}

// headersFromProto rebuilds an http.Header, dropping hop-by-hop headers in
// case the sender did not.
func headersFromProto(hs []*forwardv1.Header) http.Header {
	h := make(http.Header, len(hs))
	for _, f := range hs {
		name := f.GetName()
		if name == "" || strings.ContainsAny(name, " \t\r\n:") || IsHopByHop(name) {
			continue
		}
		k := textproto.CanonicalMIMEHeaderKey(name)
		if h[k] == nil {
			h[k] = f.GetValues() // the message is not reused: share its slice
		} else {
			h[k] = append(h[k], f.GetValues()...)
		}
	}
	return h
}

func callerToProto(c Caller) *forwardv1.Caller {
	if c == (Caller{}) {
		return nil
	}
	return &forwardv1.Caller{KeyId: c.KeyID, App: c.App, ClientAddress: c.ClientAddress, Priority: c.Priority}
}

func callerFromProto(c *forwardv1.Caller) Caller {
	return Caller{KeyID: c.GetKeyId(), App: c.GetApp(), ClientAddress: c.GetClientAddress(), Priority: c.GetPriority()}
}

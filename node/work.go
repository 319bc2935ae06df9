package node

import (
	"net/http"

	"github.com/infermesh/infermesh/mesh/forward"
	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/auth"
)

// workCaller is the api.WorkCaller: the share a request's work counts
// against on the node that runs it. A key's requests share one, whether
// they entered here or were forwarded by a peer; a keyless caller other
// than an operator shares one per client address; the local operator
// (of this node or of the peer that forwarded the request) has none.
func workCaller(r *http.Request) string {
	if i, ok := forward.InfoFrom(r.Context()); ok {
		c := i.Caller
		switch {
		case c.KeyID != "":
			return "key:" + c.KeyID
		case c.App == auth.LocalApp:
			return ""
		}
		return "addr:" + c.ClientAddress
	}
	c, ok := auth.CallerFrom(r.Context())
	switch {
	case !ok || c.Local:
		return ""
	case c.KeyID != "":
		return "key:" + c.KeyID
	}
	return "addr:" + api.ClientAddr(r.Context())
}

package forward

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"

	"connectrpc.com/connect"
)

// errBadSecret is what a caller without the right cluster secret hears.
var errBadSecret = errors.New("cluster secret missing or wrong")

// secretCheck is a Connect interceptor that admits only calls carrying the
// cluster secret. Both sides are hashed before the constant-time compare so
// the secret's length does not leak through timing either.
type secretCheck struct {
	want [sha256.Size]byte
}

func newSecretCheck(secret string) *secretCheck {
	return &secretCheck{want: sha256.Sum256([]byte(secret))}
}

func (s *secretCheck) ok(got []string) bool {
	if len(got) != 1 {
		return false
	}
	h := sha256.Sum256([]byte(got[0]))
	return subtle.ConstantTimeCompare(h[:], s.want[:]) == 1
}

// WrapUnary checks unary calls.
func (s *secretCheck) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !s.ok(req.Header().Values(SecretHeader)) {
			return nil, connect.NewError(connect.CodeUnauthenticated, errBadSecret)
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient leaves client streams alone (the Client sets the
// header itself).
func (s *secretCheck) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler checks streaming calls before the handler runs.
func (s *secretCheck) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if !s.ok(conn.RequestHeader().Values(SecretHeader)) {
			return connect.NewError(connect.CodeUnauthenticated, errBadSecret)
		}
		return next(ctx, conn)
	}
}

// SecretInterceptor returns the interceptor that admits only calls carrying
// secret in SecretHeader, for other node-to-node services (mesh/transfer)
// mounted on the same RPC port.
func SecretInterceptor(secret string) connect.Interceptor { return newSecretCheck(secret) }

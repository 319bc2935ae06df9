package forward

import (
	"errors"

	"connectrpc.com/connect"

	"github.com/infermesh/infermesh/mesh/peerauth"
)

// signerFor returns the interceptor that signs this client's calls:
// cfg.Signer, or a peerauth.Signer for cfg.ClusterSecret. With neither the
// client cannot be built.
func signerFor(cfg ClientConfig) (connect.Interceptor, error) {
	if cfg.Signer != nil {
		return cfg.Signer, nil
	}
	if cfg.ClusterSecret == "" {
		return nil, errors.New("forward: a cluster secret is required to forward requests")
	}
	return peerauth.NewSigner(cfg.ClusterSecret, peerauth.Options{})
}

// verifierFor returns the interceptor that authenticates callers:
// cfg.Verifier, or a peerauth.Verifier for cfg.ClusterSecret. With neither
// the server cannot be built: a node never serves forwarded work to
// unauthenticated callers.
func verifierFor(cfg ServerConfig) (connect.Interceptor, error) {
	if cfg.Verifier != nil {
		return cfg.Verifier, nil
	}
	if cfg.ClusterSecret == "" {
		return nil, errors.New("forward: a cluster secret is required to serve forwarded requests")
	}
	return peerauth.NewVerifier(cfg.ClusterSecret, peerauth.Options{})
}

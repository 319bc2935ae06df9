// Package auth decides who is calling a node and whether that caller may use
// the endpoint it asked for.
//
// A request's key comes from "Authorization: Bearer", "api-key" or
// "x-api-key". It is hashed with SHA-256 and looked up through a KeyStore
// (the node adapts the replicated consensus state). Only hashes are ever looked up or stored.
//
// Classify maps a method and path to an endpoint Class, the unit of key
// allowlists: chat, embeddings, images, audio, vision, models, pull, usage,
// admin and metrics; probes (/readyz, the dashboard page) and CORS
// preflights need no key. Counted says which requests count toward limits
// (package node/limits).
//
// Rules, in order:
//
//   - a CORS preflight or a probe is public;
//   - a request forwarded by a peer carries the identity the first node
//     established (ForwardedIdentity) and is never treated as loopback;
//   - on a node whose client listener is loopback-only and that does not
//     trust a proxy, a caller connecting from loopback without a key is the
//     local operator (an admin). A key it does send is used when valid, and
//     refused when revoked or expired; an unknown key is ignored, because SDKs
//     insist on sending some key;
//   - every other request needs an active key: missing, unknown, revoked or
//     expired keys are 401 invalid_api_key;
//   - a key whose allowlist does not name the endpoint's class is 403
//     permission_denied, and so is a non-admin key on usage and admin
//     endpoints;
//   - a client address that sent MaxFailures wrong keys within FailureWindow
//     is answered 429 too_many_failed_auth for BlockFor, whatever it sends.
//
// Denials map one to one onto the OpenAI error body (status, type, code,
// message, Retry-After).
package auth

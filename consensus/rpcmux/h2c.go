package rpcmux

import (
	"context"
	"net"
	"net/http"
	"time"
)

// Health check of client connections: a connection that has received
// nothing for PingAfter is pinged, and closed (failing every call on it) when
// the answer takes longer than PingTimeout.
const (
	PingAfter   = 2 * time.Second
	PingTimeout = 2 * time.Second
)

// NewClient returns an http.Client that speaks HTTP/2 cleartext with prior
// knowledge to http:// URLs, the transport for node-to-node Connect calls.
// dialTimeout bounds connection setup.
//
// HTTP/2 carries every call to a peer on one TCP connection, so a
// connection whose packets stopped (a partition, a paused peer) must not
// stay in the pool: calls queued on it after the network heals wait behind
// the kernel's retransmission backoff, which grows to tens of seconds. The
// health check (PingAfter, PingTimeout) closes such a connection; the next
// call dials afresh.
func NewClient(dialTimeout time.Duration) *http.Client {
	return NewPeerClient(dialTimeout, nil)
}

// NewPeerClient is NewClient under peer TLS: with a non-nil p each
// connection is mutual TLS (ALPN h2) and HTTP/2 runs over it, still for
// http:// URLs (see PeerTLS.DialContext). A nil p is NewClient.
func NewPeerClient(dialTimeout time.Duration, p *PeerTLS) *http.Client {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	dial := (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	if p != nil {
		dial = p.DialContext(ALPNHTTP2, dialTimeout)
	}
	return &http.Client{Transport: &http.Transport{
		Protocols: &protos,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dial(ctx, network, addr)
		},
		IdleConnTimeout: 2 * time.Minute,
		HTTP2:           &http.HTTP2Config{SendPingTimeout: PingAfter, PingTimeout: PingTimeout},
	}}
}

package rpcmux

import (
	"context"
	"net"
	"net/http"
	"time"
)

// NewServer returns an http.Server for the HTTP side of the mux that speaks
// HTTP/1.1 and HTTP/2 cleartext (prior knowledge), as Connect clients from
// NewClient do. Run it with srv.Serve(mux.HTTP()).
func NewServer(h http.Handler) *http.Server {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           h,
		Protocols:         &p,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
}

// NewClient returns an http.Client that speaks HTTP/2 cleartext with prior
// knowledge to http:// URLs, the transport for node-to-node Connect calls.
// dialTimeout bounds connection setup.
func NewClient(dialTimeout time.Duration) *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		Protocols: &p,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
		IdleConnTimeout: 2 * time.Minute,
	}}
}

package forward

import (
	"log/slog"
	"net/http"
	"time"
)

// NewHTTPServer returns an *http.Server for the internal RPC listener that
// speaks HTTP/1.1 and HTTP/2 over cleartext (h2c, prior knowledge), the two
// protocols Client dials. Mount the Server's handler (and anything else
// internal, such as raft's transport) on h. It sets header and idle
// timeouts but no read or write timeout, since forwarded streams may run
// long.
func NewHTTPServer(h http.Handler, logger *slog.Logger) *http.Server {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &http.Server{
		Handler:           h,
		Protocols:         p,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          1000,
			MaxReadFrameSize:              256 << 10,
			MaxReceiveBufferPerConnection: 4<<20 - 1,
			MaxReceiveBufferPerStream:     1 << 20,
			SendPingTimeout:               30 * time.Second,
			PingTimeout:                   10 * time.Second,
		},
	}
}

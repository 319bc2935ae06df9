package rpcmux_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/consensus/rpcmux"
	"github.com/infermesh/infermesh/consensus/rpcmux/tlstest"
	"github.com/infermesh/infermesh/mesh/forward"
)

const benchSecret = "bench-cluster-secret"

// hop is a forwarding server behind a mux and a client for it, set up as
// the node does, with or without peer TLS.
type hop struct {
	addr   string
	client *forward.Client
}

func startHop(b *testing.B, server, client *rpcmux.PeerTLS, h http.Handler) *hop {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	m, err := rpcmux.New(ln, benchSecret, nil, rpcmux.WithPeerTLS(server))
	if err != nil {
		b.Fatal(err)
	}
	go m.Serve()
	srv, err := forward.NewServer(forward.ServerConfig{NodeID: "srv", ClusterSecret: benchSecret, ChunkSize: 32 << 10}, h, nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(srv.Handler())
	hs := forward.NewHTTPServer(mux, nil)
	if server != nil {
		hs.Protocols.SetHTTP2(true)
	}
	go hs.Serve(m.HTTP())
	cfg := forward.ClientConfig{NodeID: "origin", ClusterSecret: benchSecret}
	if client != nil {
		cfg.Dial = client.DialContext(rpcmux.ALPNHTTP1, 2*time.Second)
	}
	c, err := forward.NewClient(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(); hs.Close(); m.Close() })
	return &hop{addr: m.Addr().String(), client: c}
}

func (h *hop) call(b *testing.B, req *forward.Request) {
	s, err := h.client.Forward(context.Background(), h.addr, req)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Head(); err != nil {
		b.Fatal(err)
	}
	for {
		_, _, err := s.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	s.Close()
}

// BenchmarkForwardHopMTLS measures the forwarding hop (mesh/forward over
// the RPC mux, signed calls, 1 KiB JSON answers, as the node forwards
// embeddings) with mutual TLS on the RPC port and without, interleaved so
// that load from other processes hits both alike. c1 alternates single
// calls; c64 alternates rounds of 64 concurrent callers. Each reports the
// calls per second of both and mtls/clear, the throughput ratio
// (connections are pooled, so TLS handshakes happen once per connection).
func BenchmarkForwardHopMTLS(b *testing.B) {
	body := make([]byte, 1024)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
	ca := tlstest.NewCA(b, "bench-ca")
	srvTLS, err := rpcmux.NewPeerTLS(ca.Valid(b, "server").TLS, ca.Pool())
	if err != nil {
		b.Fatal(err)
	}
	cliTLS, err := rpcmux.NewPeerTLS(ca.Valid(b, "client").TLS, ca.Pool())
	if err != nil {
		b.Fatal(err)
	}
	hops := [2]*hop{startHop(b, nil, nil, h), startHop(b, srvTLS, cliTLS, h)}
	req := &forward.Request{Method: "POST", Path: "/v1/embeddings", Body: []byte(`{"model":"m","input":"the quick brown fox jumps over the lazy dog"}`),
		Header: http.Header{"Content-Type": {"application/json"}}, Unary: true}
	report := func(b *testing.B, spent [2]time.Duration, calls float64) {
		clear, mtls := calls/spent[0].Seconds(), calls/spent[1].Seconds()
		b.ReportMetric(clear, "clear-calls/s")
		b.ReportMetric(mtls, "mtls-calls/s")
		b.ReportMetric(mtls/clear, "mtls/clear")
	}
	b.Run("c1", func(b *testing.B) {
		var spent [2]time.Duration
		first := 0
		for b.Loop() {
			for k := range 2 {
				i := (first + k) % 2
				start := time.Now()
				hops[i].call(b, req)
				spent[i] += time.Since(start)
			}
			first = 1 - first
		}
		report(b, spent, float64(b.N))
	})
	b.Run("c64", func(b *testing.B) {
		const workers, perWorker = 64, 20
		var spent [2]time.Duration
		first := 0
		round := func(hp *hop) time.Duration {
			start := time.Now()
			var wg sync.WaitGroup
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range perWorker {
						hp.call(b, req)
					}
				}()
			}
			wg.Wait()
			return time.Since(start)
		}
		for b.Loop() {
			for k := range 2 {
				i := (first + k) % 2
				spent[i] += round(hops[i])
			}
			first = 1 - first
		}
		report(b, spent, float64(b.N*workers*perWorker))
	})
}

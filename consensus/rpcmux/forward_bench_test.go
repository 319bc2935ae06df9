package rpcmux_test

import (
	"context"
	"crypto/subtle"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
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

// startHop starts a hop. With auth nil the calls are signed by peerauth
// (the node's way); else auth signs and checks them. muxBody < 0 keeps every
// request on a call of its own (the hop before the multiplexed stream);
// 0 is the client's default.
func startHop(b *testing.B, server, client *rpcmux.PeerTLS, auth connect.Interceptor, muxBody int, h http.Handler) *hop {
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
	srv, err := forward.NewServer(forward.ServerConfig{NodeID: "srv", ClusterSecret: benchSecret, Verifier: auth, ChunkSize: 32 << 10}, h, nil, prometheus.NewRegistry())
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
	cfg := forward.ClientConfig{NodeID: "origin", ClusterSecret: benchSecret, Signer: auth, MuxMaxBody: muxBody}
	if client != nil {
		cfg.Dial = client.DialContext(rpcmux.ALPNHTTP1, 2*time.Second)
		cfg.DialHTTP2 = client.DialContext(rpcmux.ALPNHTTP2, 2*time.Second)
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

// secretHeader is how node-to-node calls were authenticated before
// mesh/peerauth: the cluster secret itself in a header, compared on the
// callee. It is the baseline ("today's throughput") of the benchmark.
type secretHeader struct{ secret string }

const secretHeaderName = "X-Infermesh-Cluster-Secret"

func (s secretHeader) check(h http.Header) error {
	if subtle.ConstantTimeCompare([]byte(h.Get(secretHeaderName)), []byte(s.secret)) != 1 {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("wrong secret"))
	}
	return nil
}

func (s secretHeader) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			req.Header().Set(secretHeaderName, s.secret)
		} else if err := s.check(req.Header()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (s secretHeader) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		c := next(ctx, spec)
		c.RequestHeader().Set(secretHeaderName, s.secret)
		return c
	}
}

func (s secretHeader) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := s.check(conn.RequestHeader()); err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// BenchmarkForwardHopMTLS measures the forwarding hop (mesh/forward over
// the RPC mux, 1 KiB JSON answers, as the node forwards embeddings) three
// ways, interleaved so that load from other processes hits all alike:
//
//   - base: cleartext, the secret in a header, every request a call of
//     its own (the hop before issue 21 and before the multiplexed stream);
//   - auth: cleartext, the stream open signed by mesh/peerauth and every
//     frame MACed (the node's default);
//   - mtls: mutual TLS on the RPC port and peerauth (a node with
//     --peer-cert); the stream's frames carry no MACs.
//
// c1 alternates single calls; c64 alternates rounds of 64 concurrent
// callers, 20 calls each. Each reports the calls per second of every
// variant, and auth/base, mtls/base and mtls/auth as the median over
// rounds of each round's ratio (a round runs every variant once, in a
// rotating order), which a burst of load elsewhere moves less than a
// ratio of totals; cpu-<ratio> is the same over the process's CPU time
// (user+system, both ends of the hop run in this process), the throughput
// ratio of a CPU-bound hop, which the load of other processes on a shared
// machine moves even less. Connections are pooled and opened by an untimed first
// round: TLS handshakes happen once per connection, before timing.
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
	const base, auth, mtls = 0, 1, 2
	names := [3]string{"base", "auth", "mtls"}
	hops := [3]*hop{startHop(b, nil, nil, secretHeader{benchSecret}, -1, h), startHop(b, nil, nil, nil, 0, h), startHop(b, srvTLS, cliTLS, nil, 0, h)}
	req := &forward.Request{Method: "POST", Path: "/v1/embeddings", Body: []byte(`{"model":"m","input":"the quick brown fox jumps over the lazy dog"}`),
		Header: http.Header{"Content-Type": {"application/json"}}, Unary: true}
	// run times one round of every variant per iteration and reports.
	run := func(b *testing.B, callsPerRound int, round func(*hop)) {
		var spent, cpuSpent [3]time.Duration
		var ratios, cpuRatios [3][]float64 // auth/base, mtls/base, mtls/auth per round
		// A first round, untimed, opens the pooled connections (and
		// makes the TLS handshakes) the timed rounds reuse, as a node's
		// pool does in steady state.
		for _, hp := range hops {
			round(hp)
		}
		// The multiplexed streams open in the background on first use.
		time.Sleep(200 * time.Millisecond)
		for _, hp := range hops {
			round(hp)
		}
		first := 0
		for b.Loop() {
			var t, c [3]time.Duration
			for k := range 3 {
				i := (first + k) % 3
				start, cpu0 := time.Now(), processCPU(b)
				round(hops[i])
				t[i], c[i] = time.Since(start), processCPU(b)-cpu0
				spent[i] += t[i]
				cpuSpent[i] += c[i]
			}
			first = (first + 1) % 3
			// Throughput ratio = inverse time ratio.
			for j, pair := range [3][2]int{{base, auth}, {base, mtls}, {auth, mtls}} {
				ratios[j] = append(ratios[j], t[pair[0]].Seconds()/t[pair[1]].Seconds())
				cpuRatios[j] = append(cpuRatios[j], c[pair[0]].Seconds()/c[pair[1]].Seconds())
			}
		}
		calls := float64(b.N * callsPerRound)
		for i, n := range names {
			b.ReportMetric(calls/spent[i].Seconds(), n+"-calls/s")
			b.ReportMetric(float64(cpuSpent[i].Nanoseconds())/1e3/calls, n+"-cpu-µs/call")
		}
		for i, n := range [3]string{"auth/base", "mtls/base", "mtls/auth"} {
			b.ReportMetric(median(ratios[i]), n)
			b.ReportMetric(median(cpuRatios[i]), "cpu-"+n)
		}
	}
	b.Run("c1", func(b *testing.B) {
		run(b, 1, func(hp *hop) { hp.call(b, req) })
	})
	b.Run("c64", func(b *testing.B) {
		const workers, perWorker = 64, 20
		run(b, workers*perWorker, func(hp *hop) {
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
		})
	})
}

func median(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	s := slices.Clone(x)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

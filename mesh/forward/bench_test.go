package forward_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/infermesh/infermesh/mesh/forward"
)

// BenchmarkForwardRoundTrip measures one forwarded request with a 1 KiB
// response over loopback at concurrency 1: as a stream (Forward) and as one
// message (ForwardUnary), each authenticated two ways — signed (peerauth,
// what the node does) and with the cluster secret in a header (the scheme
// peerauth replaced, rebuilt here only to compare) — and, as the baseline
// in the same run, the same handler behind a plain net/http server called
// with a plain keep-alive client (the hop a reverse proxy makes). The
// signed and secret-header paths are calls of their own; "mux" is the
// signed client's default, the peer's multiplexed stream.
func BenchmarkForwardRoundTrip(b *testing.B) {
	body := make([]byte, 1024)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})
	reqBody := []byte(`{"model":"m","input":"the quick brown fox jumps over the lazy dog"}`)
	hdr := http.Header{"Content-Type": {"application/json"}, "User-Agent": {"bench"}}
	signed := startPeerChunk(b, 32<<10, h)
	cSigned, _ := forward.NewClient(forward.ClientConfig{ClusterSecret: secret, MuxMaxBody: -1}, nil, nil)
	defer cSigned.Close()
	legacy := startPeerConfig(b, forward.ServerConfig{NodeID: "srv", Verifier: secretHeaderCheck(secret), ChunkSize: 32 << 10}, h)
	cLegacy, _ := forward.NewClient(forward.ClientConfig{Signer: secretHeaderSend(secret), MuxMaxBody: -1}, nil, nil)
	defer cLegacy.Close()
	cMux, _ := forward.NewClient(forward.ClientConfig{ClusterSecret: secret}, nil, nil)
	defer cMux.Close()
	paths := []struct {
		name string
		c    *forward.Client
		p    *peer
	}{{"signed", cSigned, signed}, {"secret-header", cLegacy, legacy}, {"mux", cMux, signed}}
	for _, unary := range []bool{false, true} {
		mode := "stream"
		if unary {
			mode = "unary"
		}
		for _, path := range paths {
			b.Run(mode+"/"+path.name, func(b *testing.B) {
				req := &forward.Request{Method: "POST", Path: "/v1/embeddings", Body: reqBody, Header: hdr, Unary: unary}
				b.ReportAllocs()
				for b.Loop() {
					s, err := path.c.Forward(context.Background(), path.p.addr, req)
					if err != nil {
						b.Fatal(err)
					}
					if _, _, _, err := readAll(b, s); err != nil {
						b.Fatal(err)
					}
					s.Close()
				}
			})
		}
	}
	b.Run("http", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := &http.Server{Handler: h}
		go srv.Serve(ln)
		defer srv.Close()
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
		url := "http://" + ln.Addr().String() + "/v1/embeddings"
		b.ReportAllocs()
		for b.Loop() {
			req, _ := http.NewRequest("POST", url, bytes.NewReader(reqBody))
			req.Header = hdr.Clone()
			resp, err := hc.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}

// BenchmarkForwardAuth compares the two authentication schemes of
// BenchmarkForwardRoundTrip interleaved call by call (alternating which
// goes first), so that load from other processes on a shared
// machine hits both alike. It reports each scheme's mean time per forwarded
// call and the throughput ratio signed/secret-header (1 = no cost).
func BenchmarkForwardAuth(b *testing.B) {
	body := make([]byte, 1024)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write(body)
	})
	reqBody := []byte(`{"model":"m","input":"the quick brown fox jumps over the lazy dog"}`)
	signed := startPeerChunk(b, 32<<10, h)
	cSigned, _ := forward.NewClient(forward.ClientConfig{ClusterSecret: secret, MuxMaxBody: -1}, nil, nil)
	defer cSigned.Close()
	legacy := startPeerConfig(b, forward.ServerConfig{NodeID: "srv", Verifier: secretHeaderCheck(secret), ChunkSize: 32 << 10}, h)
	cLegacy, _ := forward.NewClient(forward.ClientConfig{Signer: secretHeaderSend(secret), MuxMaxBody: -1}, nil, nil)
	defer cLegacy.Close()
	for _, unary := range []bool{false, true} {
		mode := "stream"
		if unary {
			mode = "unary"
		}
		b.Run(mode, func(b *testing.B) {
			req := &forward.Request{Method: "POST", Path: "/v1/embeddings", Body: reqBody, Header: http.Header{"Content-Type": {"application/json"}}, Unary: unary}
			one := func(c *forward.Client, addr string) time.Duration {
				start := time.Now()
				s, err := c.Forward(context.Background(), addr, req)
				if err != nil {
					b.Fatal(err)
				}
				if _, _, _, err := readAll(b, s); err != nil {
					b.Fatal(err)
				}
				s.Close()
				return time.Since(start)
			}
			var tSigned, tLegacy time.Duration
			odd := false
			for b.Loop() {
				if odd { // alternate which goes first
					tLegacy += one(cLegacy, legacy.addr)
					tSigned += one(cSigned, signed.addr)
				} else {
					tSigned += one(cSigned, signed.addr)
					tLegacy += one(cLegacy, legacy.addr)
				}
				odd = !odd
			}
			n := float64(b.N)
			b.ReportMetric(float64(tSigned.Nanoseconds())/n, "signed-ns/call")
			b.ReportMetric(float64(tLegacy.Nanoseconds())/n, "header-ns/call")
			b.ReportMetric(float64(tLegacy)/float64(tSigned), "throughput-ratio")
		})
	}
}

// legacySecretHeader is the header the replaced scheme sent the secret in.
const legacySecretHeader = "X-Infermesh-Cluster-Secret"

// secretHeaderSend puts the secret in a header of every call, as clients
// did before peerauth.
func secretHeaderSend(secret string) connect.Interceptor {
	return legacyInterceptor{secret: secret}
}

// secretHeaderCheck compares that header in constant time, as servers did.
func secretHeaderCheck(secret string) connect.Interceptor {
	return legacyInterceptor{want: sha256.Sum256([]byte(secret)), check: true}
}

type legacyInterceptor struct {
	secret string
	want   [sha256.Size]byte
	check  bool
}

func (l legacyInterceptor) ok(h http.Header) error {
	got := sha256.Sum256([]byte(h.Get(legacySecretHeader)))
	if subtle.ConstantTimeCompare(got[:], l.want[:]) != 1 {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("cluster secret missing or wrong"))
	}
	return nil
}

func (l legacyInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if l.check {
			if err := l.ok(req.Header()); err != nil {
				return nil, err
			}
		} else {
			req.Header().Set(legacySecretHeader, l.secret)
		}
		return next(ctx, req)
	}
}

func (l legacyInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set(legacySecretHeader, l.secret)
		return conn
	}
}

func (l legacyInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := l.ok(conn.RequestHeader()); err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// BenchmarkForwardMux compares the multiplexed stream with calls of their
// own (both signed, 1 KiB JSON answers, ForwardUnary's framing), in the
// same run: c1 alternates single calls and reports each path's median
// latency and their ratio; c64 alternates rounds of 64 concurrent callers
// (20 calls each) and reports throughput and the median of the per-round
// ratios. A ratio above 1 means the stream is faster.
func BenchmarkForwardMux(b *testing.B) {
	body := make([]byte, 1024)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})
	p := startPeerChunk(b, 32<<10, h)
	perCall, _ := forward.NewClient(forward.ClientConfig{ClusterSecret: secret, MuxMaxBody: -1}, nil, nil)
	defer perCall.Close()
	mux, _ := forward.NewClient(forward.ClientConfig{ClusterSecret: secret}, nil, nil)
	defer mux.Close()
	clients := [2]*forward.Client{perCall, mux}
	req := &forward.Request{Method: "POST", Path: "/v1/embeddings", Body: []byte(`{"model":"m","input":"the quick brown fox jumps over the lazy dog"}`),
		Header: http.Header{"Content-Type": {"application/json"}}, Unary: true}
	one := func(b *testing.B, c *forward.Client) {
		s, err := c.Forward(context.Background(), p.addr, req)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, _, err := readAll(b, s); err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
	// Open the pooled connections and the stream (in the background on
	// first use) before timing.
	for range 3 {
		one(b, perCall)
		one(b, mux)
		time.Sleep(50 * time.Millisecond)
	}
	b.Run("c1", func(b *testing.B) {
		var lat [2][]float64
		k := 0
		for b.Loop() {
			for j := range 2 {
				i := (k + j) % 2
				start := time.Now()
				one(b, clients[i])
				lat[i] = append(lat[i], float64(time.Since(start).Microseconds()))
			}
			k++
		}
		b.ReportMetric(medianOf(lat[0]), "percall-p50-µs")
		b.ReportMetric(medianOf(lat[1]), "mux-p50-µs")
		b.ReportMetric(medianOf(lat[0])/medianOf(lat[1]), "p50-percall/mux")
	})
	b.Run("c64", func(b *testing.B) {
		var spent [2]time.Duration
		var ratios []float64
		k := 0
		for b.Loop() {
			var t [2]time.Duration
			for j := range 2 {
				i := (k + j) % 2
				start := time.Now()
				var wg sync.WaitGroup
				for range 64 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range 20 {
							one(b, clients[i])
						}
					}()
				}
				wg.Wait()
				t[i] = time.Since(start)
				spent[i] += t[i]
			}
			ratios = append(ratios, t[0].Seconds()/t[1].Seconds())
			k++
		}
		calls := float64(b.N * 64 * 20)
		b.ReportMetric(calls/spent[0].Seconds(), "percall-calls/s")
		b.ReportMetric(calls/spent[1].Seconds(), "mux-calls/s")
		b.ReportMetric(medianOf(ratios), "mux/percall")
	})
}

func medianOf(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}

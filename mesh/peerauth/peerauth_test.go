package peerauth_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/mesh/peerauth"
	forwardv1 "github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1"
	"github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1/forwardv1connect"
)

const secret = "peerauth-test-secret"

// echo serves ForwardService and counts the calls its handlers ran.
type echo struct {
	forwardv1connect.UnimplementedForwardServiceHandler
	calls atomic.Int32
}

func (e *echo) ForwardUnary(_ context.Context, req *connect.Request[forwardv1.ForwardRequest]) (*connect.Response[forwardv1.Whole], error) {
	e.calls.Add(1)
	return connect.NewResponse(&forwardv1.Whole{Body: req.Msg.GetBody()}), nil
}

func (e *echo) Forward(_ context.Context, req *connect.Request[forwardv1.ForwardRequest], s *connect.ServerStream[forwardv1.ForwardResponse]) error {
	e.calls.Add(1)
	return s.Send(&forwardv1.ForwardResponse{Frame: &forwardv1.ForwardResponse_Whole{Whole: &forwardv1.Whole{Body: req.Msg.GetBody()}}})
}

type server struct {
	addr string
	svc  *echo
	reg  *prometheus.Registry
}

// start serves ForwardService behind a Verifier on a real loopback socket.
func start(t *testing.T, opts peerauth.Options) *server {
	t.Helper()
	s := &server{svc: &echo{}, reg: prometheus.NewRegistry()}
	opts.Registerer = s.reg
	v, err := peerauth.NewVerifier(secret, opts)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(forwardv1connect.NewForwardServiceHandler(s.svc, connect.WithInterceptors(v)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	s.addr = "http://" + ln.Addr().String()
	return s
}

func (s *server) refused(reason string) float64 {
	mfs, _ := s.reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func client(addr string, icpts ...connect.Interceptor) forwardv1connect.ForwardServiceClient {
	return forwardv1connect.NewForwardServiceClient(http.DefaultClient, addr, connect.WithInterceptors(icpts...))
}

func signer(t *testing.T, secret string, clock func() time.Time) *peerauth.Signer {
	t.Helper()
	s, err := peerauth.NewSigner(secret, peerauth.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// call makes one unary or one server-streaming call and returns its error.
func call(c forwardv1connect.ForwardServiceClient, stream bool, msg *forwardv1.ForwardRequest, header http.Header) error {
	req := connect.NewRequest(msg)
	for k, v := range header {
		req.Header()[k] = v
	}
	if !stream {
		resp, err := c.ForwardUnary(context.Background(), req)
		if err == nil && string(resp.Msg.GetBody()) != string(msg.GetBody()) {
			return errors.New("wrong echo")
		}
		return err
	}
	s, err := c.Forward(context.Background(), req)
	if err != nil {
		return err
	}
	defer s.Close()
	for s.Receive() {
	}
	return s.Err()
}

func msg(body string) *forwardv1.ForwardRequest {
	return &forwardv1.ForwardRequest{Method: "POST", Path: "/v1/chat/completions", Body: []byte(body), Model: "m"}
}

func TestSignedCallsPassOthersAreRefused(t *testing.T) {
	for _, stream := range []bool{false, true} {
		name := map[bool]string{false: "unary", true: "stream"}[stream]
		t.Run(name, func(t *testing.T) {
			s := start(t, peerauth.Options{})
			good := client(s.addr, signer(t, secret, nil))
			if err := call(good, stream, msg("hello"), nil); err != nil {
				t.Fatalf("signed call: %v", err)
			}
			if s.svc.calls.Load() != 1 {
				t.Fatalf("handler ran %d times, want 1", s.svc.calls.Load())
			}
			now := time.Now
			cases := []struct {
				name   string
				c      forwardv1connect.ForwardServiceClient
				header http.Header
				reason string
			}{
				{"no signature", client(s.addr), nil, "missing"},
				{"wrong secret", client(s.addr, signer(t, "another-secret", nil)), nil, "signature"},
				{"old", client(s.addr, signer(t, secret, func() time.Time { return now().Add(-31 * time.Second) })), nil, "stale"},
				{"future", client(s.addr, signer(t, secret, func() time.Time { return now().Add(31 * time.Second) })), nil, "stale"},
				{"garbage", client(s.addr), http.Header{peerauth.Header: {"v1.1.2.3"}}, "malformed"},
				{"the cluster secret itself", client(s.addr), http.Header{peerauth.Header: {secret}, "X-Infermesh-Cluster-Secret": {secret}}, "malformed"},
			}
			for _, tc := range cases {
				err := call(tc.c, stream, msg("hello"), tc.header)
				if connect.CodeOf(err) != connect.CodeUnauthenticated {
					t.Fatalf("%s: %v, want unauthenticated", tc.name, err)
				}
				if s.refused(tc.reason) == 0 {
					t.Fatalf("%s: not counted as %q", tc.name, tc.reason)
				}
			}
			if s.svc.calls.Load() != 1 {
				t.Fatalf("a refused call reached the handler (%d calls)", s.svc.calls.Load())
			}
		})
	}
}

// capture records the headers the signer set on the last call.
type capture struct {
	header http.Header
}

func (c *capture) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		c.header = req.Header().Clone()
		return next(ctx, req)
	}
}

func (c *capture) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		return &captureConn{StreamingClientConn: next(ctx, spec), c: c}
	}
}

func (c *capture) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

type captureConn struct {
	connect.StreamingClientConn
	c *capture
}

func (cc *captureConn) Send(m any) error {
	err := cc.StreamingClientConn.Send(m)
	cc.c.header = cc.RequestHeader().Clone()
	return err
}

func TestReplayedAndTamperedCallsAreRefused(t *testing.T) {
	for _, stream := range []bool{false, true} {
		name := map[bool]string{false: "unary", true: "stream"}[stream]
		t.Run(name, func(t *testing.T) {
			s := start(t, peerauth.Options{})
			cp := &capture{}
			// The signer is the outer interceptor: cp sees its header.
			good := client(s.addr, signer(t, secret, nil), cp)
			if err := call(good, stream, msg("pay 1"), nil); err != nil {
				t.Fatal(err)
			}
			sig := http.Header{peerauth.Header: cp.header.Values(peerauth.Header)}
			if len(sig[peerauth.Header]) != 1 {
				t.Fatalf("signed call carried %v", cp.header)
			}
			if v := sig.Get(peerauth.Header); len(v) > 0 && containsSecret(cp.header) {
				t.Fatal("the cluster secret travelled in a header")
			}
			raw := client(s.addr)
			// The same signature on another message: refused, not a replay
			// (the nonce is still unused by an accepted call).
			if err := call(raw, stream, msg("pay 1000"), sig); connect.CodeOf(err) != connect.CodeUnauthenticated || s.refused("signature") != 1 {
				t.Fatalf("tampered message: %v", err)
			}
			// The exact call again: refused as a replay.
			if err := call(raw, stream, msg("pay 1"), sig); connect.CodeOf(err) != connect.CodeUnauthenticated || s.refused("replayed") != 1 {
				t.Fatalf("replayed call: %v", err)
			}
			if s.svc.calls.Load() != 1 {
				t.Fatalf("handler ran %d times, want 1", s.svc.calls.Load())
			}
			// A fresh signature for the same message passes.
			if err := call(good, stream, msg("pay 1"), nil); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func containsSecret(h http.Header) bool {
	for _, vs := range h {
		for _, v := range vs {
			if v == secret {
				return true
			}
		}
	}
	return false
}

func TestEmptySecretIsRefused(t *testing.T) {
	if _, err := peerauth.NewSigner("", peerauth.Options{}); err == nil {
		t.Fatal("signer without a secret")
	}
	if _, err := peerauth.NewVerifier("", peerauth.Options{}); err == nil {
		t.Fatal("verifier without a secret")
	}
}

func TestReplayCacheIsBounded(t *testing.T) {
	s := start(t, peerauth.Options{MaxReplay: 2})
	good := client(s.addr, signer(t, secret, nil))
	for i := 0; i < 2; i++ {
		if err := call(good, false, msg("x"), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := call(good, false, msg("x"), nil); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("call over the replay bound: %v, want unavailable", err)
	}
	if got := s.refused("replay_full"); got != 1 {
		t.Fatalf("replay_full counted %v", got)
	}
}

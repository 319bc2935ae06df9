package forward

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/infermesh/infermesh/mesh/peerauth"
	forwardv1 "github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1"
	"github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1/forwardv1connect"
)

const authSecret = "mux-secret"

// startMuxPeer serves a forward server over h2c and counts handler runs.
func startMuxPeer(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	var runs atomic.Int32
	srv, err := NewServer(ServerConfig{NodeID: "srv", ClusterSecret: authSecret}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Write([]byte("ok"))
	}), nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(srv.Handler())
	hs := NewHTTPServer(mux, nil)
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String(), &runs
}

// rawMux opens a Multiplex stream by hand, signed by sign (nil: unsigned).
func rawMux(t *testing.T, addr string, sign connect.Interceptor) *connect.BidiStreamForClient[forwardv1.MultiplexRequest, forwardv1.MultiplexResponse] {
	t.Helper()
	tr := newTransport(ClientConfig{H2C: true, DialTimeout: 2e9, PingAfter: 10e9, PingTimeout: 5e9})
	t.Cleanup(tr.CloseIdleConnections)
	var opts []connect.ClientOption
	if sign != nil {
		opts = append(opts, connect.WithInterceptors(sign))
	}
	c := forwardv1connect.NewForwardServiceClient(memBody{tr}, "http://"+addr, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return c.Multiplex(ctx)
}

// openRaw opens a stream and returns it with its frame MAC.
func openRaw(t *testing.T, addr string, sign connect.Interceptor) (*connect.BidiStreamForClient[forwardv1.MultiplexRequest, forwardv1.MultiplexResponse], *frameMAC, error) {
	t.Helper()
	bs := rawMux(t, addr, sign)
	priv, err := newMuxKey()
	if err != nil {
		t.Fatal(err)
	}
	pub := priv.PublicKey().Bytes()
	_ = bs.Send(&forwardv1.MultiplexRequest{Frame: &forwardv1.MultiplexRequest_Open{Open: &forwardv1.MultiplexOpen{PublicKey: pub}}})
	msg, err := bs.Receive()
	if err != nil {
		return bs, nil, err
	}
	ready := msg.GetReady()
	if ready == nil || !ready.GetFrameMacs() {
		t.Fatalf("ready frame %v: want one asking for frame MACs on a cleartext stream", msg)
	}
	mac, err := newFrameMAC(priv, ready.GetPublicKey(), pub, ready.GetPublicKey())
	if err != nil {
		t.Fatal(err)
	}
	return bs, mac, nil
}

func callFrame(t *testing.T, mac *frameMAC, id uint64) *forwardv1.MultiplexRequest {
	t.Helper()
	raw, err := proto.Marshal(&forwardv1.ForwardRequest{Method: "GET", Path: "/x", HopCount: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := &forwardv1.MultiplexCall{Id: id, Request: raw}
	if mac != nil {
		c.Mac = mac.sum(nil, frameCall, id, raw)
	}
	return &forwardv1.MultiplexRequest{Frame: &forwardv1.MultiplexRequest_Call{Call: c}}
}

// TestMultiplexOpenNeedsTheSecret checks that a stream opened without a
// signature, or signed under another secret, is refused before any call.
func TestMultiplexOpenNeedsTheSecret(t *testing.T) {
	addr, runs := startMuxPeer(t)
	wrong, err := peerauth.NewSigner("not-the-secret", peerauth.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, sign := range map[string]connect.Interceptor{"unsigned": nil, "wrong secret": wrong} {
		bs, _, err := openRaw(t, addr, sign)
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("%s open: %v, want unauthenticated", name, err)
		}
		// Whatever follows is not served either.
		_ = bs.Send(callFrame(t, nil, 1))
		if _, err := bs.Receive(); err == nil {
			t.Fatalf("%s: a frame after a refused open was answered", name)
		}
	}
	if runs.Load() != 0 {
		t.Fatal("the handler ran for an unauthenticated stream")
	}
}

// TestMultiplexRefusesReplayedAndForgedFrames checks that on a cleartext
// stream a call frame sent again (same id), a frame with a wrong MAC and a
// frame copied from another stream are refused, and the stream closed.
func TestMultiplexRefusesReplayedAndForgedFrames(t *testing.T) {
	addr, runs := startMuxPeer(t)
	sign, err := peerauth.NewSigner(authSecret, peerauth.Options{})
	if err != nil {
		t.Fatal(err)
	}

	bs, mac, err := openRaw(t, addr, sign)
	if err != nil {
		t.Fatal(err)
	}
	first := callFrame(t, mac, 1)
	if err := bs.Send(first); err != nil {
		t.Fatal(err)
	}
	msg, err := bs.Receive()
	if err != nil || msg.GetId() != 1 || msg.GetResponse().GetWhole() == nil {
		t.Fatalf("first call: %v, %v", msg, err)
	}
	if err := bs.Send(first); err != nil { // the same frame again
		t.Fatal(err)
	}
	if _, err := bs.Receive(); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("replayed frame: %v, want unauthenticated", err)
	}

	// A frame under another stream's key: copied from the first stream.
	bs2, _, err := openRaw(t, addr, sign)
	if err != nil {
		t.Fatal(err)
	}
	if err := bs2.Send(callFrame(t, mac, 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := bs2.Receive(); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("frame from another stream: %v, want unauthenticated", err)
	}

	// No MAC at all.
	bs3, _, err := openRaw(t, addr, sign)
	if err != nil {
		t.Fatal(err)
	}
	if err := bs3.Send(callFrame(t, nil, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := bs3.Receive(); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("frame without a MAC: %v, want unauthenticated", err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1 (only the first, genuine call)", n)
	}
}

// testCerts returns a CA pool and a certificate it signed for 127.0.0.1,
// usable by servers and clients.
func testCerts(t *testing.T) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "mux-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return pool, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}
}

// TestMultiplexOverMutualTLSNeedsNoFrameMACs checks that a stream over a
// connection whose client certificate the server verified carries no frame
// MACs, and that TLS without a verified client certificate still needs them.
func TestMultiplexOverMutualTLSNeedsNoFrameMACs(t *testing.T) {
	pool, cert := testCerts(t)
	for _, mutual := range []bool{true, false} {
		srv, err := NewServer(ServerConfig{NodeID: "srv", ClusterSecret: authSecret}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("ok"))
		}), nil, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle(srv.Handler())
		hs := NewHTTPServer(mux, nil)
		hs.Protocols.SetHTTP2(true) // as the node does under peer TLS
		hs.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, NextProtos: []string{"h2"}, ClientAuth: tls.NoClientCert}
		if mutual {
			hs.TLSConfig.ClientAuth = tls.RequireAndVerifyClientCert
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go hs.ServeTLS(ln, "", "")
		t.Cleanup(func() { hs.Close() })

		dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := tls.Dialer{Config: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}}
			return d.DialContext(ctx, network, addr)
		}
		sign, err := peerauth.NewSigner(authSecret, peerauth.Options{})
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewClient(ClientConfig{NodeID: "origin", Signer: sign, Dial: dial, DialHTTP2: dial}, nil, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		p := &muxPeer{addr: ln.Addr().String()}
		mc, err := c.mux.dial(p)
		if err != nil {
			t.Fatalf("mutual=%v: open: %v", mutual, err)
		}
		if (mc.mac == nil) != mutual {
			t.Fatalf("mutual=%v: frame MACs on=%v", mutual, mc.mac != nil)
		}
		go mc.readLoop(p)
		s, err := mc.forward(context.Background(), &forwardv1.ForwardRequest{Method: "GET", Path: "/x", HopCount: 1}, true)
		if err != nil {
			t.Fatal(err)
		}
		if h, err := s.Head(); err != nil || h.Status != 200 {
			t.Fatalf("mutual=%v: %+v %v", mutual, h, err)
		}
		s.Close()
		mc.fail(errors.New("test over"))
	}
}

package forward_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/infermesh/infermesh/mesh/forward"
)

// BenchmarkForwardRoundTrip measures one forwarded request with a 1 KiB
// response over loopback at concurrency 1: as a stream (Forward), as one
// message (ForwardUnary), and, as the baseline in the same run, the same
// handler behind a plain net/http server called with a plain keep-alive
// client (the hop a reverse proxy makes).
func BenchmarkForwardRoundTrip(b *testing.B) {
	body := make([]byte, 1024)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})
	reqBody := []byte(`{"model":"m","input":"the quick brown fox jumps over the lazy dog"}`)
	hdr := http.Header{"Content-Type": {"application/json"}, "User-Agent": {"bench"}}
	p := startPeerChunk(b, 32<<10, h)
	c, _ := forward.NewClient(forward.ClientConfig{ClusterSecret: secret}, nil, nil)
	defer c.Close()
	for _, unary := range []bool{false, true} {
		name := "stream"
		if unary {
			name = "unary"
		}
		b.Run(name, func(b *testing.B) {
			req := &forward.Request{Method: "POST", Path: "/v1/embeddings", Body: reqBody, Header: hdr, Unary: unary}
			b.ReportAllocs()
			for b.Loop() {
				s, err := c.Forward(context.Background(), p.addr, req)
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

package forward_test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/infermesh/infermesh/mesh/forward"
)

// BenchmarkForwardRoundTrip measures one forwarded request with a 1 KiB
// response over loopback h2c, at concurrency 1.
func BenchmarkForwardRoundTrip(b *testing.B) {
	body := make([]byte, 1024)
	p := startPeerChunk(b, 32<<10, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	c, _ := forward.NewClient(forward.ClientConfig{ClusterSecret: secret}, nil, nil)
	defer c.Close()
	req := &forward.Request{Method: "POST", Path: "/v1/embeddings", Body: []byte(`{"input":"x"}`), Header: http.Header{"Content-Type": {"application/json"}}}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s, err := c.Forward(context.Background(), p.addr, req)
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
}

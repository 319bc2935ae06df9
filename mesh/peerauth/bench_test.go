package peerauth

import (
	"net/http"
	"testing"

	forwardv1 "github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1"
	"github.com/infermesh/infermesh/proto/gen/infermesh/forward/v1/forwardv1connect"
)

// BenchmarkSignVerify is the CPU peerauth adds to one call: signing on the
// caller plus verifying (digest, MAC, replay cache) on the callee, for a
// forwarded request with a 1 KiB body.
func BenchmarkSignVerify(b *testing.B) {
	s, _ := NewSigner("bench-secret", Options{})
	v, _ := NewVerifier("bench-secret", Options{})
	m := &forwardv1.ForwardRequest{Method: "POST", Path: "/v1/embeddings", Body: make([]byte, 1024), Model: "m"}
	proc := forwardv1connect.ForwardServiceForwardUnaryProcedure
	h := http.Header{}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.sign(h, proc, m); err != nil {
			b.Fatal(err)
		}
		if err := v.verify(streamMethod, proc, "peer", h, m); err != nil {
			b.Fatal(err)
		}
	}
}

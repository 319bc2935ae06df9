package forward

import (
	"net/http"
	"testing"
)

// Hop-by-hop headers, and those the Connection header names, stay behind.
func TestHeadersToProtoDropsHopByHop(t *testing.T) {
	src := http.Header{
		"Connection":          {"keep-alive, X-Foo"},
		"X-Foo":               {"1"},
		"Upgrade":             {"h2c"},
		"Proxy-Authorization": {"Basic x"},
		"Content-Type":        {"text/plain"},
		"X-Bar":               {"a", "b"},
	}
	got := map[string][]string{}
	for _, h := range headersToProto(src) {
		got[h.GetName()] = h.GetValues()
	}
	if len(got) != 2 || len(got["Content-Type"]) != 1 || len(got["X-Bar"]) != 2 {
		t.Fatalf("headers = %v", got)
	}
}

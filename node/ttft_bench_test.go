package node_test

import (
	"bufio"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node"
)

// startNode runs an in-process node on loopback ports with the given cached
// models installed, joining join.
func startNode(b *testing.B, id string, join []string, modelNames ...string) *node.Node {
	b.Helper()
	return runNode(b, id, modelNames, func(c *node.Config) { c.Join = join })
}

// firstToken sends a streamed chat request and returns the time until the
// first SSE data line arrives, then drains the stream.
func firstToken(b *testing.B, addr string) time.Duration {
	body := `{"model":"tiny-llama:test","messages":[{"role":"user","content":"Tell me about the weather."}],"max_tokens":8,"seed":1,"stream":true}`
	start := time.Now()
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			b.Fatalf("stream ended before a token: %v (status %d)", err, resp.StatusCode)
		}
		if strings.HasPrefix(line, "data: {") {
			d := time.Since(start)
			io.Copy(io.Discard, r)
			return d
		}
	}
}

// BenchmarkTTFTForwarded measures time to first token of a streamed chat on
// the node that holds the model (direct) and through a peer that forwards
// it (forwarded), alternating in the same run, and reports the p50s and
// their ratio.
func BenchmarkTTFTForwarded(b *testing.B) {
	a := startNode(b, "ttft-a", nil, "tiny-llama")
	gossip := a.GossipAddr()
	c := startNode(b, "ttft-b", []string{gossip})
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + c.Addr() + "/v1/models/tiny-llama:test")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("the forwarding node never saw the model")
		}
		time.Sleep(20 * time.Millisecond)
	}
	firstToken(b, a.Addr())
	firstToken(b, c.Addr())
	var direct, forwarded []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct = append(direct, firstToken(b, a.Addr()))
		forwarded = append(forwarded, firstToken(b, c.Addr()))
	}
	b.StopTimer()
	slices.Sort(direct)
	slices.Sort(forwarded)
	d, f := direct[len(direct)/2], forwarded[len(forwarded)/2]
	b.ReportMetric(float64(d.Microseconds())/1000, "direct_p50_ms")
	b.ReportMetric(float64(f.Microseconds())/1000, "forwarded_p50_ms")
	b.ReportMetric(float64(f)/float64(d), "x_forwarded/direct")
}

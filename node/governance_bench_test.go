package node_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node"
)

const benchAdminKey = "bench-admin-key-0123456789"

// startGoverned runs a node that needs keys (it listens on all
// interfaces), with rate limits, prices and the audit log on when
// governed, or a loopback node with audit off when not.
func startGoverned(b *testing.B, id string, governed bool) *node.Node {
	b.Helper()
	return runNode(b, id, []string{"tiny-bert"}, func(cfg *node.Config) {
		cfg.Audit.Enabled = governed
		if governed {
			cfg.Listen = "0.0.0.0:0"
			cfg.Limits.KeyRPM, cfg.Limits.ClientRPM = 1_000_000, 1_000_000
		}
	})
}

func benchCall(b *testing.B, c *http.Client, method, url, key string, body any) []byte {
	b.Helper()
	var rd io.Reader
	if body != nil {
		j, _ := json.Marshal(body)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		b.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, out)
	}
	return out
}

// BenchmarkGovernanceOverhead measures embeddings throughput at 16
// concurrent clients on a node with authentication, rate limits, a daily
// quota, a token-priced monthly budget and signed audit records, against
// a node with none of them (keyless loopback operator, audit off), in
// alternating rounds of the same run, and reports the ratio.
func BenchmarkGovernanceOverhead(b *testing.B) {
	b.Setenv("SERVICE_ADMIN_KEY", benchAdminKey)
	plain := startGoverned(b, "gov-plain", false)
	gov := startGoverned(b, "gov-on", true)
	_, port, _ := net.SplitHostPort(gov.Addr())
	govURL := "http://127.0.0.1:" + port
	plainURL := "http://" + plain.Addr()
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	// The admin key is stored through raft shortly after start.
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequest("GET", govURL+"/v1/server/keys", nil)
		req.Header.Set("Authorization", "Bearer "+benchAdminKey)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("the admin key never worked")
		}
		time.Sleep(50 * time.Millisecond)
	}
	benchCall(b, c, "PUT", govURL+"/v1/server/policy", benchAdminKey, map[string]any{"models": map[string]any{
		"onnx/tiny-bert/test-128": map[string]any{"price_per_million_input_tokens": 0.01}}})
	var k struct {
		Key string `json:"key"`
	}
	json.Unmarshal(benchCall(b, c, "POST", govURL+"/v1/server/keys", benchAdminKey,
		map[string]any{"name": "bench", "app": "bench", "rpm": 1_000_000, "daily_quota": 1_000_000_000, "monthly_budget": 1_000_000}), &k)
	body := map[string]any{"model": "tiny-bert:test-128", "input": []string{"the quick brown fox jumps over the lazy dog", "a second sentence about the weather"}}
	round := func(url, key string, n int) time.Duration {
		var wg sync.WaitGroup
		work := make(chan struct{}, n)
		for range n {
			work <- struct{}{}
		}
		close(work)
		start := time.Now()
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range work {
					benchCall(b, c, "POST", url+"/v1/embeddings", key, body)
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	round(plainURL, "", 64)
	round(govURL, k.Key, 64)
	// Rounds alternate, and the order within a pair flips each time, so
	// load from elsewhere on the machine hits both sides alike; the ratio
	// is the median of the pairs'.
	var tPlain, tGov time.Duration
	var ratios []float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var p, g time.Duration
		if i%2 == 0 {
			p, g = round(plainURL, "", 256), round(govURL, k.Key, 256)
		} else {
			g, p = round(govURL, k.Key, 256), round(plainURL, "", 256)
		}
		tPlain, tGov = tPlain+p, tGov+g
		ratios = append(ratios, p.Seconds()/g.Seconds())
	}
	b.StopTimer()
	slices.Sort(ratios)
	n := float64(256 * b.N)
	b.ReportMetric(n/tPlain.Seconds(), "plain_req/s")
	b.ReportMetric(n/tGov.Seconds(), "governed_req/s")
	b.ReportMetric(ratios[len(ratios)/2], "x_governed/plain")
}

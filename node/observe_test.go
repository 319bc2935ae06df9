package node_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/infermesh/infermesh/node"
)

// Model ids of the test assets, as clients name them and as metrics label
// them.
const (
	bertWire  = "tiny-bert:test-128"
	bertID    = "onnx/tiny-bert/test-128"
	llamaWire = "tiny-llama:test"
	llamaID   = "onnx/tiny-llama/test"
)

// observedNode starts an in-process node on loopback ports with the named
// cached models installed; log nil discards the node's log.
func observedNode(t *testing.T, id string, join []string, log *slog.Logger, modelNames ...string) *node.Node {
	t.Helper()
	return runNode(t, id, modelNames, func(c *node.Config) {
		c.Join = join
		if log != nil {
			c.Logger = log
		}
	})
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitForModel waits until n lists the model (gossip has carried it).
func waitForModel(t *testing.T, n *node.Node, wire string) {
	waitFor(t, n.ID()+" to see "+wire, 20*time.Second, func() bool {
		resp, err := http.Get("http://" + n.Addr() + "/v1/models/" + wire)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// post sends a JSON body and returns the status, the serving node and the
// body.
func post(t *testing.T, addr, path, body string, header http.Header) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Service-Backend"), string(b)
}

// scrape reads a node's /v1/server/metrics.
func scrape(t *testing.T, n *node.Node) []byte {
	t.Helper()
	resp, err := http.Get("http://" + n.Addr() + "/v1/server/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %d %v: %s", n.ID(), resp.StatusCode, err, b)
	}
	return b
}

// families parses a text exposition.
func families(t *testing.T, b []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parse exposition: %v", err)
	}
	return fams
}

// value returns the value of the series of family name whose labels
// include want (a counter, gauge or a histogram's count), and whether it
// exists.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// promtool runs `promtool check metrics` on an exposition; a missing
// promtool fails the test.
func promtool(t *testing.T, who string, exposition []byte) {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (Debian package prometheus): %v", err)
	}
	cmd := exec.Command(bin, "check", "metrics")
	cmd.Stdin = bytes.NewReader(exposition)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check metrics on %s's exposition: %v\n%s", who, err, out)
	}
}

// TestMetricsScrapePassesPromtool runs two nodes, sends embeddings and
// chat requests through the one without models (so they are forwarded)
// and to the model holder directly, then scrapes both: each exposition
// passes `promtool check metrics` and carries the per-model, per-worker,
// per-peer, engine, raft, gossip and build series with the traffic's
// values.
func TestMetricsScrapePassesPromtool(t *testing.T) {
	a := observedNode(t, "metrics-a", nil, nil, "tiny-bert", "tiny-llama")
	b := observedNode(t, "metrics-b", []string{a.GossipAddr()}, nil)
	waitForModel(t, b, bertWire)
	waitForModel(t, b, llamaWire)

	var wg sync.WaitGroup
	for i := range 4 {
		for _, n := range []*node.Node{a, b} {
			wg.Go(func() {
				body := fmt.Sprintf(`{"model":%q,"input":["the weather is fine %d","a second line of input"]}`, bertWire, i)
				if code, _, out := post(t, n.Addr(), "/v1/embeddings", body, nil); code != http.StatusOK {
					t.Errorf("embeddings via %s: %d %s", n.ID(), code, out)
				}
			})
		}
	}
	wg.Wait()
	chat := `{"model":%q,"messages":[{"role":"user","content":"Tell me about the weather."}],"max_tokens":6,"seed":1,"stream":%t}`
	for _, stream := range []bool{true, false} {
		code, backend, out := post(t, b.Addr(), "/v1/chat/completions", fmt.Sprintf(chat, llamaWire, stream), nil)
		if code != http.StatusOK || backend != a.ID() {
			t.Fatalf("chat (stream %t) via %s: %d from %q: %s", stream, b.ID(), code, backend, out)
		}
	}
	// A request the serving node refuses: counted as a client error.
	if code, _, _ := post(t, b.Addr(), "/v1/embeddings", fmt.Sprintf(`{"model":%q,"input":[]}`, bertWire), nil); code != http.StatusBadRequest {
		t.Fatalf("empty input: status %d, want 400", code)
	}

	// Gossip probes run on their own timer, and b joins raft once the
	// leader adds it: wait until b timed a probe and heard from a leader.
	waitFor(t, "a timed gossip probe and raft contact on "+b.ID(), 20*time.Second, func() bool {
		fb := families(t, scrape(t, b))
		probes, _ := value(fb, "infermesh_gossip_probe_rtt_seconds", nil)
		_, contact := value(fb, "infermesh_raft_last_contact_seconds", nil)
		return probes > 0 && contact
	})
	expB := scrape(t, b)
	expA := scrape(t, a)
	promtool(t, b.ID(), expB)
	promtool(t, a.ID(), expA)
	fb, fa := families(t, expB), families(t, expA)

	type want struct {
		fams   map[string]*dto.MetricFamily
		name   string
		labels map[string]string
		check  func(float64) bool
		text   string
	}
	atLeast := func(n float64) func(float64) bool { return func(v float64) bool { return v >= n } }
	equal := func(n float64) func(float64) bool { return func(v float64) bool { return v == n } }
	for _, w := range []want{
		{fb, "infermesh_model_requests_total", map[string]string{"model": bertID, "code": "200"}, equal(4), "4 embeddings admitted on b"},
		{fb, "infermesh_model_requests_total", map[string]string{"model": bertID, "code": "400"}, equal(1), "the refused request"},
		{fb, "infermesh_model_errors_total", map[string]string{"model": bertID, "kind": "client"}, equal(1), "one client error"},
		{fb, "infermesh_model_requests_total", map[string]string{"model": llamaID, "code": "200"}, equal(2), "2 chats"},
		{fb, "infermesh_model_request_duration_seconds", map[string]string{"model": bertID}, equal(5), "latency samples"},
		{fb, "infermesh_model_tokens_total", map[string]string{"model": bertID, "type": "prompt"}, atLeast(8), "embedding prompt tokens"},
		{fb, "infermesh_model_tokens_total", map[string]string{"model": llamaID, "type": "completion"}, atLeast(2), "chat completion tokens"},
		{fb, "infermesh_model_time_to_first_token_seconds", map[string]string{"model": llamaID}, equal(1), "one streamed chat"},
		{fb, "infermesh_worker_requests_total", map[string]string{"worker": a.ID(), "code": "200"}, equal(6), "requests b forwarded to a"},
		{fb, "infermesh_peer_health", map[string]string{"peer": a.ID(), "state": "ready"}, equal(1), "b sees a ready"},
		{fb, "infermesh_peer_health", map[string]string{"peer": a.ID(), "state": "draining"}, equal(0), "b sees a not draining"},
		{fb, "infermesh_peer_inflight_cap", map[string]string{"peer": a.ID()}, atLeast(0), "a's cap"},
		{fb, "infermesh_peer_saturation_ratio", map[string]string{"peer": a.ID()}, atLeast(0), "a's saturation"},
		{fb, "infermesh_peer_models", map[string]string{"peer": a.ID(), "state": "warm"}, equal(2), "a's warm models"},
		{fb, "infermesh_gossip_members", map[string]string{"state": "alive"}, equal(2), "two gossip members"},
		{fb, "infermesh_raft_has_leader", nil, equal(1), "b knows the leader"},
		{fb, "infermesh_raft_state", map[string]string{"state": "follower"}, equal(1), "b follows"},
		{fa, "infermesh_raft_state", map[string]string{"state": "leader"}, equal(1), "a leads"},
		{fa, "infermesh_raft_term", nil, atLeast(1), "a's term"},
		{fa, "infermesh_raft_commit_index", nil, atLeast(1), "a's commit index"},
		{fb, "infermesh_raft_last_contact_seconds", nil, atLeast(0), "b heard from the leader"},
		{fa, "infermesh_model_requests_total", map[string]string{"model": bertID, "code": "200"}, equal(4), "4 embeddings admitted on a"},
		{fa, "infermesh_engine_batch_size", map[string]string{"model": bertID}, atLeast(1), "embedding batches on a"},
		{fa, "infermesh_model_queue_depth", map[string]string{"model": bertID}, equal(0), "an idle queue"},
		{fa, "infermesh_build_info", nil, equal(1), "build info"},
		{fa, "infermesh_engine_decode_steps_total", map[string]string{"model": llamaID}, atLeast(2), "decode steps of the chats"},
		{fa, "infermesh_engine_decode_rows_total", map[string]string{"model": llamaID}, atLeast(2), "decode rows of the chats"},
		{fa, "infermesh_engine_prefix_cache_lookups_total", map[string]string{"model": llamaID}, equal(2), "one prefix lookup per chat"},
		{fa, "infermesh_model_queue_depth", map[string]string{"model": llamaID}, equal(0), "no chat waiting"},
	} {
		v, ok := value(w.fams, w.name, w.labels)
		if !ok || !w.check(v) {
			t.Errorf("%s %v = %v (present %t): want %s", w.name, w.labels, v, ok, w.text)
		}
	}
	// The batcher merged the 8 concurrent 2-input calls into fewer runs
	// than inputs, and counted every input.
	if f := fa["infermesh_engine_batch_size"]; f != nil {
		h := f.GetMetric()[0].GetHistogram()
		if h.GetSampleSum() < 16 {
			t.Errorf("batch sizes sum to %v rows, want at least 16 (8 calls of 2 inputs)", h.GetSampleSum())
		}
	}
}

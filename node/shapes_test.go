package node_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node"
)

// TestAdminShapes pins the JSON of the admin and model-hub routes byte for
// byte (values that change from run to run masked): the contracts behind
// them are typed, and their shapes are what clients parse.
func TestAdminShapes(t *testing.T) {
	n := runNode(t, "shapes", []string{"tiny-bert"}, func(c *node.Config) { c.Dashboard = true })
	base := "http://" + n.Addr()
	waitFor(t, "a raft leader", 20*time.Second, func() bool {
		_, body := call(t, http.MethodGet, base+"/v1/server/state-digest", "")
		return strings.Contains(body, `"is_leader":true`)
	})
	mask := func(s string) string {
		for _, m := range []struct{ re, to string }{
			{`"digest":"[^"]*"`, `"digest":"D"`},
			{`"applied_index":\d+`, `"applied_index":N`},
			{`"revision":\d+`, `"revision":N`},
			{`"leader":"[^"]*"`, `"leader":"L"`},
			{`"created":\d+`, `"created":N`},
			{`"uptime_seconds":\d+`, `"uptime_seconds":N`},
			{`"generated_at_ms":\d+`, `"generated_at_ms":N`},
			{`"http_addr":"[^"]*"`, `"http_addr":"A"`},
			{`"rpc_addr":"[^"]*"`, `"rpc_addr":"A"`},
		} {
			s = regexp.MustCompile(m.re).ReplaceAllString(s, m.to)
		}
		return strings.TrimSpace(s)
	}
	policy := `{"strategy":"weighted","governance":"federated","plan":"pro","first_party_apps":["web"],` +
		`"workers":{"shapes":{"weight":3,"canary":true,"canary_percent":10,"inflight_cap":4}},` +
		`"models":{"onnx/tiny-bert/test-128":{"lifecycle":"deprecated","replacement":"onnx/x/y","price_per_request":0.5,"price_per_million_input_tokens":1.25,"price_per_million_output_tokens":2}}}`
	wantPolicy := `{"strategy":"weighted","governance":"federated","plan":"pro","first_party_apps":["web"],` +
		`"workers":{"shapes":{"weight":3,"canary":true,"canary_percent":10,"inflight_cap":4}},` +
		`"models":{"onnx/tiny-bert/test-128":{"lifecycle":"deprecated","replacement":"onnx/x/y","price_per_request":0.5,"price_per_million_input_tokens":1.25,"price_per_million_output_tokens":2}},"revision":N}`
	for _, c := range []struct{ method, path, body, want string }{
		{http.MethodGet, "/v1/server/policy", "", `{"strategy":"round-robin","governance":"open"}`},
		{http.MethodPut, "/v1/server/policy", policy, wantPolicy},
		{http.MethodGet, "/v1/server/policy", "", wantPolicy},
		{http.MethodGet, "/v1/server/usage?by=model&since=2026-01-01", "", `{"by":"model","data":[],"object":"list","since":"2026-01-01"}`},
		{http.MethodGet, "/v1/server/state-digest", "", `{"applied_index":N,"digest":"D","is_leader":true,"leader":"L","node_id":"shapes"}`},
		{http.MethodGet, "/v1/server/models/onnx/all-minilm-l6-v2/fp32/provenance", "", `{"model":"onnx/all-minilm-l6-v2/fp32","object":"model.card",` +
			`"publisher":"sentence-transformers (ONNX export by Xenova)","source":"https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2","license":"apache-2.0",` +
			`"intended_use":I,"known_limitations":K}`},
		{http.MethodPost, "/v1/models/catalog/refresh", "", `{"added":[],"changed":[],"entries":21,"object":"catalog.refresh","removed":[],"sources":[{"source":"builtin","entries":21}]}`},
		// The first entry whole, then the end of the list.
		{http.MethodGet, "/v1/models/catalog", "", `{"data":[{"key":"onnx/all-minilm-l6-v2/fp32","display_name":"all-MiniLM-L6-v2 (fp32)",` +
			`"description":"sentence-transformers all-MiniLM-L6-v2, a 6-layer MiniLM sentence encoder producing 384-dimensional embeddings, as Xenova's fp32 ONNX export.",` +
			`"parameters":"22M","quantization":"fp32","download_size_bytes":90900000,"on_disk_size_bytes":90900000,"modalities":["embeddings"],` +
			`"tags":["embeddings","sentence-transformers","bert","minilm","english","mean-pooling","384-dimensions"],"context_window_tokens":256,` +
			`"license":"apache-2.0","homepage_url":"https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2",` +
			`"source_repository":"https://huggingface.co/Xenova/all-MiniLM-L6-v2","is_installed":false,"is_active":false,"last_used_utc":null,"installed_on":[]},...],"object":"list"}`},
		// The keys in order, and this node's part whole.
		{http.MethodGet, "/dashboard/data", "", `{"client_errors_total":…,"engine":"local","errors_total":…,"generated_at_ms":N,"governance":…,"inflight":…,"latency":…,"latency_all":…,"live_sessions":…,"live_sessions_cap":…,"mesh_series":…,` +
			`"models":[{"id":"onnx/tiny-bert/test-128","wire_id":"tiny-bert:test-128","task":"embeddings","warm":true}],"node_id":"shapes","peers":…,"raft":…,"reason":…,"requests_total":…,` +
			`"series":…,"state":…,"uptime_seconds":N,"usage_by_worker":…,"version":"dev","workers":…}`},
	} {
		status, body := call(t, c.method, base+c.path, c.body)
		got := mask(body)
		switch {
		case strings.HasPrefix(c.path, "/v1/server/models/"):
			got = regexp.MustCompile(`"intended_use":"[^"]*","known_limitations":"[^"]*"`).ReplaceAllString(got, `"intended_use":I,"known_limitations":K`)
		case c.path == "/v1/models/catalog":
			if i := strings.Index(got, `},{"key"`); i > 0 {
				got = got[:i+1] + ",...]" + got[strings.LastIndex(got, `,"object"`):]
			}
		case c.path == "/dashboard/data":
			got = topLevel(t, body, "engine", "generated_at_ms", "models", "node_id", "uptime_seconds", "version")
			got = mask(got)
		}
		if status != http.StatusOK || got != c.want {
			t.Errorf("%s %s: %d\n got %s\nwant %s", c.method, c.path, status, got, c.want)
		}
	}
}

// topLevel rewrites a JSON object with its keys in their order and the
// values of keys not in show replaced by "…".
func topLevel(t *testing.T, body string, show ...string) string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(body))
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	var parts []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		val := "…"
		if slices.Contains(show, k.(string)) {
			val = string(v)
		}
		parts = append(parts, fmt.Sprintf("%q:%s", k, val))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// call sends a request with an optional JSON body and returns the status
// and the body.
func call(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// installedSizes returns key -> size_bytes from /v1/models/installed.
func installedSizes(p *proc) (map[string]int64, error) {
	r, err := http.Get(p.url("/v1/models/installed"))
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	var out struct {
		Data []struct {
			Key  string `json:"key"`
			Size int64  `json:"size_bytes"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&out); err != nil {
		return nil, err
	}
	m := map[string]int64{}
	for _, d := range out.Data {
		m[d.Key] = d.Size
	}
	return m, nil
}

// TestPeerModelsSizesAndForwardedLegacyCalls: a node lists the sizes of
// models only its peer holds (/v1/models/installed and the legacy
// /api/tags), and legacy calls forwarded to the peer complete cleanly: no
// "broke off" warning and no failed forward in the metrics.
func TestPeerModelsSizesAndForwardedLegacyCalls(t *testing.T) {
	const legacyAddr = "127.0.64.1:11434"
	a := startMeshNode(t, meshNode{"peermodels-a", "127.0.64.1", nil}, "", "--legacy-listen", legacyAddr, "--legacy-end-date", "2999-12-31")
	b := startMeshNode(t, meshNode{"peermodels-b", "127.0.64.2", []string{"tiny-bert", "tiny-llama"}}, "127.0.64.1:17946")
	waitMembers(t, []*proc{a, b}, 2)
	const bert = "onnx/tiny-bert/test-128"
	own, err := installedSizes(b)
	if err != nil || own[bert] <= 0 {
		t.Fatalf("b's own size: %v %v", own, err)
	}
	eventually(t, 10*time.Second, "a lists b's model with its size", func() error {
		got, err := installedSizes(a)
		if err != nil {
			return err
		}
		if got[bert] != own[bert] {
			return fmt.Errorf("a says %d bytes, b %d", got[bert], own[bert])
		}
		return nil
	})
	r, err := http.Get("http://" + legacyAddr + "/api/tags")
	if err != nil {
		t.Fatal(err)
	}
	var tags struct {
		Models []struct {
			Name string `json:"name"`
			Size int64  `json:"size"`
		} `json:"models"`
	}
	json.NewDecoder(r.Body).Decode(&tags)
	r.Body.Close()
	for _, m := range tags.Models {
		if m.Size <= 0 || (m.Name == "tiny-bert:test-128" && m.Size != own[bert]) {
			t.Errorf("/api/tags on a: %+v, want b's sizes (tiny-bert %d bytes)", tags.Models, own[bert])
		}
	}

	calls := []struct{ path, body, want string }{
		{"/api/embed", `{"model":"tiny-bert:test-128","input":["hello","world"]}`, "embeddings"},
		{"/api/embeddings", `{"model":"tiny-bert:test-128","prompt":"hello"}`, "embedding"},
		{"/api/chat", `{"model":"tiny-llama:test","messages":[{"role":"user","content":"hi"}],"stream":false,"options":{"num_predict":4}}`, "message"},
		{"/api/chat", `{"model":"tiny-llama:test","messages":[{"role":"user","content":"hi"}],"options":{"num_predict":4}}`, `"done":true`},
		{"/api/generate", `{"model":"tiny-llama:test","prompt":"hi","stream":false,"options":{"num_predict":4}}`, "response"},
		{"/api/generate", `{"model":"tiny-llama:test","prompt":"hi","options":{"num_predict":4}}`, `"done":true`},
		{"/api/show", `{"model":"tiny-llama:test"}`, "details"},
	}
	for i := 0; i < 3; i++ {
		for _, c := range calls {
			resp, err := http.Post("http://"+legacyAddr+c.path, "application/json", bytes.NewReader([]byte(c.body)))
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(raw), c.want) {
				t.Fatalf("legacy %s via a: %d %s", c.path, resp.StatusCode, raw)
			}
		}
	}
	time.Sleep(200 * time.Millisecond)
	if strings.Contains(a.stderr.String(), "broke off") {
		t.Errorf("a logged a broken-off response for complete legacy calls:\n%s", a.stderr)
	}
	mr, err := http.Get(a.url("/v1/server/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(mr.Body)
	mr.Body.Close()
	for _, line := range strings.Split(string(metrics), "\n") {
		if strings.HasPrefix(line, "infermesh_forward_client_calls_total{") && !strings.Contains(line, `result="ok"`) && !strings.HasSuffix(line, " 0") {
			t.Errorf("forward calls that did not end ok: %s", line)
		}
		if strings.HasPrefix(line, "infermesh_dispatch_outcomes_total{") && strings.Contains(line, `"failed"`) && !strings.HasSuffix(line, " 0") {
			t.Errorf("dispatch failures: %s", line)
		}
	}
}

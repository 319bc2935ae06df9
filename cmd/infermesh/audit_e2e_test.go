package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAuditExportVerifiesAcrossNodes: requests served through two nodes of
// a keyed mesh leave signed audit records on the node each entered; an
// export through either node holds both nodes' chains and verifies with
// the replicated public keys; one flipped byte makes verify fail naming
// the line; vision records hold no key or app, and no record holds
// request content.
func TestAuditExportVerifiesAcrossNodes(t *testing.T) {
	t.Setenv("SERVICE_ADMIN_KEY", adminKey)
	ps := startKeyedMesh(t, "127.0.72")[:2]
	waitMembersKeyed(t, ps)
	key := createKey(t, ps[0], map[string]any{"name": "audited", "app": "notes"})
	for _, p := range ps {
		eventuallyEvery(t, 10*time.Second, 200*time.Millisecond, "key known on "+p.id, func() error {
			if code, c := keyed(p, key, "GET", "/v1/models", nil); code != 200 {
				return fmt.Errorf("%d %s", code, c)
			}
			return nil
		})
	}
	const secret = "the-prompt-text-must-never-reach-the-audit-log"
	for i, p := range ps {
		for j := range 3 {
			if code, c := keyed(p, key, "POST", "/v1/embeddings", map[string]any{"model": "tiny-bert:test-128", "input": fmt.Sprintf("%s %d %d", secret, i, j)}); code != 200 {
				t.Fatalf("embeddings on %s: %d %s", p.id, code, c)
			}
		}
	}
	// A refused request is audited too: a key with a daily quota of one.
	tight := createKey(t, ps[0], map[string]any{"name": "tight", "app": "notes", "daily_quota": 1})
	eventuallyEvery(t, 10*time.Second, 200*time.Millisecond, "tight key known", func() error {
		if code, c := keyed(ps[0], tight, "GET", "/v1/models", nil); code != 200 {
			return fmt.Errorf("%d %s", code, c)
		}
		return nil
	})
	for want := range []int{200, 429} {
		code, c := keyed(ps[0], tight, "POST", "/v1/embeddings", map[string]any{"model": "tiny-bert:test-128", "input": "x"})
		if code != []int{200, 429}[want] {
			t.Fatalf("tight key call %d: %d %s", want, code, c)
		}
	}
	// The audit keys reach the replicated state once each node published.
	eventually(t, 20*time.Second, "both audit keys replicated", func() error {
		var k struct {
			Keys map[string]string `json:"keys"`
		}
		if code, _, err := adminReq(ps[1], "GET", "/v1/server/audit/keys", nil, &k); err != nil || code != 200 || len(k.Keys) < 2 {
			return fmt.Errorf("%d %v %v", code, k.Keys, err)
		}
		return nil
	})
	dir := t.TempDir()
	export := filepath.Join(dir, "audit.jsonl")
	cli := func(args ...string) (string, int) {
		cmd := exec.Command(binPath, args...)
		cmd.Env = append(os.Environ(), "SERVICE_ADMIN_KEY="+adminKey)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), code
	}
	var records []map[string]any
	eventually(t, 20*time.Second, "export holds both nodes' records", func() error {
		out, code := cli("audit", "export", "--node", "http://"+ps[1].addr)
		if code != 0 {
			return fmt.Errorf("export: exit %d: %s", code, out)
		}
		records = records[:0]
		nodes := map[string]int{}
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			var r map[string]any
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				return fmt.Errorf("record %q: %v", sc.Text(), err)
			}
			if r["endpoint"] == "/v1/embeddings" {
				nodes[fmt.Sprint(r["node"])]++
			}
			records = append(records, r)
		}
		if nodes[ps[0].id] < 3 || nodes[ps[1].id] < 3 {
			return fmt.Errorf("embeddings records by node %v", nodes)
		}
		if strings.Contains(out, secret) {
			t.Fatalf("the audit export holds request content")
		}
		return os.WriteFile(export, []byte(out), 0o600)
	})
	refused := 0
	for _, r := range records {
		if r["status"] == float64(429) {
			refused++
		}
	}
	if refused != 1 {
		t.Fatalf("%d audit records of refused requests, want 1", refused)
	}
	for _, r := range records {
		if r["endpoint"] == "/v1/embeddings" && r["status"] == float64(200) && (r["key_id"] == nil || r["app"] != "notes" || r["worker"] == nil || r["status"] != float64(200)) {
			t.Fatalf("embeddings record without key, app, worker or status: %v", r)
		}
	}
	if out, code := cli("audit", "verify", export, "--node", "http://"+ps[0].addr); code != 0 || !strings.Contains(out, "OK") {
		t.Fatalf("verify: exit %d: %s", code, out)
	} else {
		t.Logf("verify: %s", strings.TrimSpace(out))
	}
	b, _ := os.ReadFile(export)
	lines := bytes.Split(b, []byte("\n"))
	i := len(lines) / 2
	flipAt := bytes.Index(lines[i], []byte(`"status":`)) + len(`"status":`)
	lines[i][flipAt] ^= 0x01 // one digit of the status changes
	tampered := filepath.Join(dir, "tampered.jsonl")
	os.WriteFile(tampered, bytes.Join(lines, []byte("\n")), 0o600)
	out, code := cli("audit", "verify", tampered, "--node", "http://"+ps[0].addr)
	if code != 1 || !strings.Contains(out, fmt.Sprintf("line %d", i+1)) {
		t.Fatalf("verify of a flipped byte on line %d: exit %d: %s", i+1, code, out)
	}
	t.Logf("tampered: %s", strings.TrimSpace(out))
}

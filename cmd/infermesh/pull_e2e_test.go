package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// sseEvent is one event of a pull stream, with its data decoded.
type sseEvent struct {
	Name string
	Data map[string]any
}

// pullVia posts a pull to p and reads its event stream, calling on for
// each event (nil is fine). A non-200 answer returns its status and the
// error code.
func pullVia(p *proc, key, target string, on func(sseEvent)) (int, string, []sseEvent, error) {
	body, _ := json.Marshal(map[string]string{"model_key": key, "node": target})
	resp, err := http.Post(p.url("/v1/models/pull"), "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error.Code, nil, nil
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		return resp.StatusCode, "", nil, fmt.Errorf("content type %q", ct)
	}
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.Name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.Data); err != nil {
				return 200, "", out, err
			}
		case line == "":
			if cur.Name != "" {
				out = append(out, cur)
				if on != nil {
					on(cur)
				}
			}
			cur = sseEvent{}
		}
	}
	return 200, "", out, sc.Err()
}

// checkPullStream asserts the spec's order: started with the key, progress
// with every field and monotone completed, then done with duration_ms.
func checkPullStream(t *testing.T, who string, evs []sseEvent, key string) {
	t.Helper()
	if len(evs) < 3 || evs[0].Name != "started" || evs[0].Data["model_key"] != key {
		t.Fatalf("%s: stream %v does not start with started/%s", who, evs, key)
	}
	last := -1.0
	for _, e := range evs[1 : len(evs)-1] {
		if e.Name != "progress" {
			t.Fatalf("%s: %s event in the middle of the stream: %v", who, e.Name, e.Data)
		}
		for _, f := range []string{"phase", "completed", "total", "bps", "eta_seconds"} {
			if _, ok := e.Data[f]; !ok {
				t.Fatalf("%s: progress without %s: %v", who, f, e.Data)
			}
		}
		c := e.Data["completed"].(float64)
		if c < last {
			t.Fatalf("%s: completed went back from %v to %v", who, last, c)
		}
		last = c
	}
	end := evs[len(evs)-1]
	if end.Name != "done" || end.Data["model_key"] != key {
		t.Fatalf("%s: stream ended with %s %v", who, end.Name, end.Data)
	}
	if _, ok := end.Data["duration_ms"].(float64); !ok {
		t.Fatalf("%s: done without duration_ms: %v", who, end.Data)
	}
}

// tinyBertEntry writes a catalogue source with one entry for the cached
// tiny-bert files at urlBase, under key and wire name:tag.
func tinyBertEntry(t *testing.T, key, name, tag, urlBase string) string {
	t.Helper()
	var m struct {
		Task    string            `json:"task"`
		Files   map[string]string `json:"files"`
		Options map[string]string `json:"options"`
	}
	b, err := os.ReadFile(onnxtest.AssetDir(t, "tiny-bert", "manifest.json") + "/manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(b, &m)
	var files []map[string]any
	for _, f := range []string{"model.onnx", "tokenizer.json"} {
		data, err := os.ReadFile(filepath.Join(onnxtest.AssetDir(t, "tiny-bert", f), f))
		if err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(data)
		files = append(files, map[string]any{"name": f, "url": urlBase + "/" + f, "size": len(data), "sha256": hex.EncodeToString(s[:])})
	}
	src := map[string]any{"entries": []any{map[string]any{
		"key": key, "display_name": "Tiny BERT (test)", "description": "generated test encoder", "parameters": "0.8M",
		"quantization": "fp32", "download_size_bytes": 3181634, "on_disk_size_bytes": 3181634, "modalities": []string{"embeddings"},
		"tags": []string{"test"}, "context_window_tokens": 512, "license": "MIT", "homepage_url": "https://example.invalid/tiny-bert",
		"source_repository": "testdata/models/gen_tiny_bert.py",
		"install":           map[string]any{"name": name, "tag": tag, "task": m.Task, "files": m.Files, "options": m.Options},
		"files":             files,
		"card": map[string]any{"publisher": "infermesh tests", "source": "testdata/models/gen_tiny_bert.py", "license": "MIT",
			"intended_use": "tests only", "known_limitations": "random weights; vectors are meaningless"},
	}}}
	out, _ := json.Marshal(src)
	return writeTemp(t, string(out))
}

// fileHub serves the cached tiny-bert files slowly enough that concurrent
// pulls overlap, and counts the requests per file.
func fileHub(t *testing.T) (*httptest.Server, map[string]*atomic.Int64) {
	counts := map[string]*atomic.Int64{"model.onnx": {}, "tokenizer.json": {}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/")
		c, ok := counts[name]
		if !ok {
			http.NotFound(w, r)
			return
		}
		c.Add(1)
		data, err := os.ReadFile(filepath.Join(onnxtest.AssetDir(t, "tiny-bert", name), name))
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(data)))
		step := len(data)/10 + 1
		for i := 0; i < len(data); i += step {
			w.Write(data[i:min(i+step, len(data))])
			w.(http.Flusher).Flush()
			time.Sleep(30 * time.Millisecond)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, counts
}

// catalogRowOn returns a node's catalogue row for key.
func catalogRowOn(p *proc, key string) (map[string]any, error) {
	var out struct {
		Data []map[string]any `json:"data"`
	}
	if code, err := call(p, http.MethodGet, "/v1/models/catalog", nil, &out); err != nil || code != 200 {
		return nil, fmt.Errorf("catalog: %d %v", code, err)
	}
	for _, r := range out.Data {
		if r["key"] == key {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%s not in the catalogue", key)
}

func TestPullSharedAcrossNodesThenRoutable(t *testing.T) {
	hubSrv, counts := fileHub(t)
	const key = "onnx/tiny-bert/pulled"
	src := tinyBertEntry(t, key, "tiny-bert-pulled", "v1", hubSrv.URL)
	nodes := []meshNode{{"pull-a", "127.0.30.1", nil}, {"pull-b", "127.0.30.2", nil}, {"pull-c", "127.0.30.3", nil}}
	var ps []*proc
	for i, n := range nodes {
		join := ""
		if i > 0 {
			join = nodes[0].ip + ":17946"
		}
		ps = append(ps, startMeshNode(t, n, join, "--catalog-source", src))
	}
	waitMembers(t, ps, 3)

	row, err := catalogRowOn(ps[1], key)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"key", "display_name", "description", "parameters", "quantization", "download_size_bytes", "on_disk_size_bytes",
		"modalities", "tags", "context_window_tokens", "license", "homepage_url", "source_repository", "is_installed", "is_active", "last_used_utc"} {
		if _, ok := row[f]; !ok {
			t.Fatalf("catalogue entry without %s: %v", f, row)
		}
	}
	if row["is_installed"] != false {
		t.Fatalf("not yet pulled, but %v", row)
	}

	// Two clients on two nodes pull the same model to pull-a at once.
	var wg sync.WaitGroup
	results := make([][]sseEvent, 2)
	errs := make([]error, 2)
	for i, entry := range []*proc{ps[0], ps[1]} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, ecode, evs, err := pullVia(entry, key, "pull-a", nil)
			if err == nil && code != 200 {
				err = fmt.Errorf("status %d %s", code, ecode)
			}
			results[i], errs[i] = evs, err
		}()
	}
	wg.Wait()
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("pull through %s: %v", ps[i].id, errs[i])
		}
		checkPullStream(t, ps[i].id, results[i], key)
	}
	for f, c := range counts {
		if c.Load() != 1 {
			t.Fatalf("the hub served %s %d times, want once (one shared download)", f, c.Load())
		}
	}
	t.Logf("events: %d through pull-a, %d through pull-b", len(results[0]), len(results[1]))

	row, err = catalogRowOn(ps[0], key)
	if err != nil {
		t.Fatal(err)
	}
	if row["is_installed"] != true || row["is_active"] != true {
		t.Fatalf("after the pull pull-a says %v", row)
	}
	// Routable from every node, served by pull-a.
	for _, p := range ps {
		eventually(t, 10*time.Second, "embeddings via "+p.id, func() error {
			backend, err := embedModelVia(context.Background(), p, "tiny-bert-pulled:v1")
			if err != nil {
				return err
			}
			if backend != "pull-a" {
				return fmt.Errorf("served by %s", backend)
			}
			return nil
		})
	}
	if row, _ := catalogRowOn(ps[0], key); row["last_used_utc"] == nil {
		t.Fatalf("last_used_utc not set after use: %v", row)
	}

	// The CLI pulls it to pull-c, which gets it from pull-a, not the hub.
	out, err := exec.Command(binPath, "pull", "--node", "http://"+ps[2].addr, key).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "pulling "+key) || !strings.Contains(string(out), "from peer pull-a") || !strings.Contains(string(out), "done: "+key) {
		t.Fatalf("infermesh pull: %v\n%s", err, out)
	}
	t.Logf("infermesh pull output:\n%s", out)
	for f, c := range counts {
		if c.Load() != 1 {
			t.Fatalf("the hub served %s %d times; the second node should have pulled from its peer", f, c.Load())
		}
	}

	// Provenance: the registered card, and 404 where none is registered.
	var card map[string]any
	if code, err := call(ps[2], http.MethodGet, "/v1/server/models/"+key+"/provenance", nil, &card); err != nil || code != 200 || card["publisher"] != "infermesh tests" || card["known_limitations"] == "" {
		t.Fatalf("provenance: %d %v %v", code, err, card)
	}
	if code, _ := call(ps[2], http.MethodGet, "/v1/server/models/onnx/none/none/provenance", nil, nil); code != 404 {
		t.Fatalf("provenance of an unknown model: %d", code)
	}
	// The client delete route refuses.
	if code, _ := call(ps[0], http.MethodDelete, "/v1/models/"+key, nil, nil); code != http.StatusForbidden {
		t.Fatalf("DELETE /v1/models: %d, want 403", code)
	}

	// Governance and permission refusals.
	for _, tc := range []struct {
		policy map[string]any
		status int
		code   string
	}{
		{map[string]any{"governance": "curated"}, 403, "governance_denied"},
		{map[string]any{"governance": "federated", "models": map[string]any{key: map[string]any{"lifecycle": "blocked"}}}, 403, "model_blocked"},
	} {
		if code, err := call(ps[1], http.MethodPut, "/v1/server/policy", tc.policy, nil); err != nil || code != 200 {
			t.Fatalf("set policy %v: %d %v", tc.policy, code, err)
		}
		eventually(t, 5*time.Second, fmt.Sprintf("pull refused with %s on every node", tc.code), func() error {
			for _, p := range ps {
				code, ecode, _, err := pullVia(p, key, "", nil)
				if err != nil || code != tc.status || ecode != tc.code {
					return fmt.Errorf("%s: %d %s %v", p.id, code, ecode, err)
				}
			}
			return nil
		})
	}
	if code, err := call(ps[1], http.MethodPut, "/v1/server/policy", map[string]any{"governance": "open"}, nil); err != nil || code != 200 {
		t.Fatalf("reset policy: %d %v", code, err)
	}
	limited := createKey(t, ps[0], map[string]any{"name": "no-pull", "allow": []string{"embeddings"}})
	eventually(t, 5*time.Second, "a key without pull is refused", func() error {
		code, body := keyed(ps[2], limited, http.MethodPost, "/v1/models/pull", map[string]any{"model_key": key})
		if code != 403 || !strings.Contains(body, "permission_denied") {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
	if code, ecode, _, _ := pullVia(ps[0], "onnx/unknown/model", "", nil); code != 404 || ecode != "model_not_found" {
		t.Fatalf("pull of an unknown key: %d %s", code, ecode)
	}
	if code, ecode, _, _ := pullVia(ps[0], key, "no-such-node", nil); code != 404 || ecode != "node_not_found" {
		t.Fatalf("pull to an unknown node: %d %s", code, ecode)
	}
}

// embedModelVia creates an embedding of model through p and returns the
// serving node.
func embedModelVia(ctx context.Context, p *proc, model string) (string, error) {
	body, _ := json.Marshal(map[string]any{"model": model, "input": "hello mesh"})
	resp, err := http.Post(p.url("/v1/embeddings"), "application/json", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("status %d", resp.StatusCode)
	}
	return resp.Header.Get("X-Service-Backend"), nil
}

func TestPullFromPeersWhenTheSourceIsUnreachable(t *testing.T) {
	const key = "onnx/tiny-bert/test-128"
	// The outside source is a closed port: only peers can supply the files.
	src := tinyBertEntry(t, key, "tiny-bert", "test-128", "http://"+closedAddr(t))
	slow := []string{"--catalog-source", src, "--transfer-rate", "600000"}
	nodes := []meshNode{
		{"peer-a", "127.0.31.1", []string{"tiny-bert"}},
		{"peer-b", "127.0.31.2", []string{"tiny-bert"}},
		{"peer-c", "127.0.31.3", nil},
	}
	byID := map[string]*proc{}
	var ps []*proc
	for i, n := range nodes {
		join := ""
		if i > 0 {
			join = nodes[0].ip + ":17946"
		}
		p := startMeshNode(t, n, join, slow...)
		ps = append(ps, p)
		byID[n.id] = p
	}
	waitMembers(t, ps, 3)
	fresh := startMeshNode(t, meshNode{"peer-new", "127.0.31.4", nil}, nodes[0].ip+":17946", slow...)
	waitMembers(t, append(ps, fresh), 4)

	// Pull to the new node; once a peer has sent a good part of the file,
	// SIGKILL that peer. The pull must finish from the other one.
	var killed atomic.Value
	code, ecode, evs, err := pullVia(fresh, key, "", func(e sseEvent) {
		if e.Name != "progress" || killed.Load() != nil {
			return
		}
		phase, _ := e.Data["phase"].(string)
		done, _ := e.Data["completed"].(float64)
		for id, p := range byID {
			if strings.Contains(phase, "model.onnx from peer "+id) && done > 1<<20 && done < 2<<20 {
				p.cmd.Process.Signal(syscall.SIGKILL)
				killed.Store(id)
				t.Logf("killed %s at %v bytes (%s)", id, done, phase)
			}
		}
	})
	if err != nil || code != 200 {
		t.Fatalf("pull: %d %s %v", code, ecode, err)
	}
	checkPullStream(t, "peer-new", evs, key)
	victim, _ := killed.Load().(string)
	if victim == "" {
		t.Fatalf("never saw a peer mid-transfer to kill; events %v", evs)
	}
	other := "peer-a"
	if victim == "peer-a" {
		other = "peer-b"
	}
	sawOther := false
	for _, e := range evs {
		if ph, _ := e.Data["phase"].(string); strings.Contains(ph, "from peer "+other) {
			sawOther = true
		}
		if ph, _ := e.Data["phase"].(string); strings.Contains(ph, "from 127.0.0.1") {
			t.Fatalf("the unreachable outside source was used: %v", e.Data)
		}
	}
	if !sawOther {
		t.Fatalf("the pull did not move to %s after %s died: %v", other, victim, evs)
	}
	row, err := catalogRowOn(fresh, key)
	if err != nil {
		t.Fatal(err)
	}
	if row["is_installed"] != true || row["is_active"] != true {
		t.Fatalf("after the pull the new node says %v", row)
	}
	// The new node serves it: round-robin over the two warm survivors
	// reaches it.
	eventually(t, 15*time.Second, "peer-new serves the pulled model", func() error {
		backend, err := embedModelVia(context.Background(), byID["peer-c"], "tiny-bert:test-128")
		if err != nil {
			return err
		}
		if backend != "peer-new" {
			return fmt.Errorf("served by %s", backend)
		}
		return nil
	})
}

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// cliRun runs the binary with args (and extra environment) and returns
// stdout, stderr and the exit code.
func cliRun(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// cliCommands is every operator command with the arguments that make it
// otherwise complete (so -h and a bad flag are the only problem).
var cliCommands = [][]string{
	{"models", "import", "DIR"}, {"models", "list"}, {"models", "rm", "ID"},
	{"pull", "KEY"}, {"members"}, {"usage"},
	{"audit", "export"}, {"audit", "verify", "FILE"},
	{"keys", "create", "--name", "n"}, {"keys", "list"}, {"keys", "revoke", "ID"},
	{"policy", "get"}, {"policy", "set", "FILE"},
	{"raft", "peers"}, {"raft", "remove-peer", "ID"}, {"raft", "recover", "--yes"},
}

// -h exits 0 for every command and command group; an unknown flag or
// command exits 2.
func TestCLIHelpAndUsageErrors(t *testing.T) {
	if _, errOut, code := cliRun(t, nil, "serve", "-h"); code != 0 || !strings.Contains(errOut, "-listen") {
		t.Errorf("serve -h: exit %d, want 0 and the flags\n%s", code, errOut)
	}
	if _, errOut, code := cliRun(t, nil, "serve", "--no-such-flag"); code != 2 {
		t.Errorf("serve --no-such-flag: exit %d, want 2\n%s", code, errOut)
	}
	for _, c := range cliCommands {
		name := strings.Join(c[:min(2, len(c))], " ")
		if _, errOut, code := cliRun(t, nil, append(c, "-h")...); code != 0 {
			t.Errorf("%s -h: exit %d, want 0\n%s", name, code, errOut)
		}
		if _, errOut, code := cliRun(t, nil, append(c, "--no-such-flag")...); code != 2 {
			t.Errorf("%s --no-such-flag: exit %d, want 2\n%s", name, code, errOut)
		}
	}
	for _, g := range []string{"models", "keys", "policy", "raft", "audit"} {
		out, errOut, code := cliRun(t, nil, g, "-h")
		if code != 0 || !strings.Contains(out+errOut, "infermesh") {
			t.Errorf("%s -h: exit %d, want 0 and the usage\n%s%s", g, code, out, errOut)
		}
		if _, _, code := cliRun(t, nil, g, "no-such-command"); code != 2 {
			t.Errorf("%s no-such-command: exit %d, want 2", g, code)
		}
		if _, _, code := cliRun(t, nil, g); code != 2 {
			t.Errorf("%s alone: exit %d, want 2", g, code)
		}
	}
	for _, args := range [][]string{{"-h"}, {"help"}, {"version"}} {
		if _, _, code := cliRun(t, nil, args...); code != 0 {
			t.Errorf("%v: exit %d, want 0", args, code)
		}
	}
	for _, args := range [][]string{{}, {"no-such-command"}, {"members", "--format", "yaml"}, {"keys", "list", "--format", "xml"},
		{"models", "list", "--format", "csv"}, {"policy", "get", "--format", "yaml"}, {"usage", "--format", "yaml"},
		{"raft", "peers", "--format", "yaml"}, {"pull"}, {"keys", "create", "--name", "x", "--expires", "-1h"}} {
		if _, _, code := cliRun(t, nil, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	// pull -h says what Ctrl-C does to the download.
	out, errOut, _ := cliRun(t, nil, "pull", "-h")
	if !strings.Contains(out+errOut, "Ctrl-C stops following, not the download") {
		t.Errorf("pull -h does not document Ctrl-C:\n%s%s", out, errOut)
	}
}

// Every command that talks to a node exits 1, naming the problem, when
// the node cannot be reached.
func TestCLIUnreachableNode(t *testing.T) {
	dead := "http://" + closedPort(t)
	for _, c := range [][]string{
		{"members"}, {"members", "--format", "json"}, {"usage"}, {"usage", "--format", "json"},
		{"keys", "list"}, {"keys", "list", "--format", "json"}, {"keys", "create", "--name", "n"}, {"keys", "revoke", "k1"},
		{"policy", "get"}, {"policy", "get", "--format", "json"},
		{"raft", "peers"}, {"raft", "peers", "--format", "json"}, {"raft", "remove-peer", "n1"},
		{"audit", "export"}, {"pull", "some/model"},
	} {
		out, errOut, code := cliRun(t, nil, append(c, "--node", dead)...)
		if code != 1 || !strings.Contains(errOut, "connection refused") {
			t.Errorf("%v against a dead node: exit %d, want 1 and the error\nstdout: %s\nstderr: %s", c, code, out, errOut)
		}
	}
}

// closedPort is a loopback address nothing listens on: a port bound, noted
// and closed again.
func closedPort(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.Listener.Addr().String()
	srv.Close()
	return addr
}

// jsonOut runs a command that must succeed and decodes its stdout.
func jsonOut(t *testing.T, v any, args ...string) {
	t.Helper()
	out, errOut, code := cliRun(t, nil, args...)
	if code != 0 {
		t.Fatalf("%v: exit %d\n%s", args, code, errOut)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("%v: not JSON (%v):\n%s", args, err, out)
	}
}

// --format json on every read command prints valid JSON with the fields
// the API documents; keys create --expires sets an expiry keys list shows.
func TestCLIJSONOutput(t *testing.T) {
	p := startNode(t, "cli-json", "tiny-bert")
	node := "http://" + p.addr
	if _, err := embedVia(t.Context(), p, "usage for the CLI"); err != nil {
		t.Fatal(err)
	}

	// keys create --expires 1h, as JSON, then visible in keys list.
	before := time.Now()
	var created struct {
		ID        string `json:"id"`
		Key       string `json:"key"`
		Name      string `json:"name"`
		ExpiresAt *int64 `json:"expires_at"`
	}
	jsonOut(t, &created, "keys", "create", "--node", node, "--name", "cli-expiring", "--expires", "1h", "--format", "json")
	if created.ID == "" || created.Key == "" || created.Name != "cli-expiring" || created.ExpiresAt == nil {
		t.Fatalf("keys create: %+v", created)
	}
	if want := before.Add(time.Hour).Unix(); *created.ExpiresAt < want-1 || *created.ExpiresAt > want+5 {
		t.Fatalf("expires_at %d, want about %d (an hour from now)", *created.ExpiresAt, want)
	}
	var keys struct {
		Object string `json:"object"`
		Data   []struct {
			ID        string `json:"id"`
			Name      string `json:"name"`
			Revoked   bool   `json:"revoked"`
			ExpiresAt *int64 `json:"expires_at"`
		} `json:"data"`
	}
	jsonOut(t, &keys, "keys", "list", "--node", node, "--format", "json")
	found := false
	for _, k := range keys.Data {
		if k.ID == created.ID {
			found = true
			if k.ExpiresAt == nil || *k.ExpiresAt != *created.ExpiresAt || k.Name != "cli-expiring" {
				t.Fatalf("keys list shows %+v, created %+v", k, created)
			}
		}
	}
	if !found {
		t.Fatalf("keys list --format json lacks %s: %+v", created.ID, keys)
	}
	text, _, code := cliRun(t, nil, "keys", "list", "--node", node)
	stamp := time.Unix(*created.ExpiresAt, 0).UTC().Format(time.RFC3339)
	if code != 0 || !strings.Contains(text, "EXPIRES") || !strings.Contains(text, stamp) {
		t.Fatalf("keys list (text) does not show the expiry %s:\n%s", stamp, text)
	}

	var members struct {
		Data []struct {
			ID       string `json:"id"`
			HTTPAddr string `json:"http_addr"`
			State    string `json:"state"`
			Self     bool   `json:"self"`
		} `json:"data"`
	}
	jsonOut(t, &members, "members", "--node", node, "--format", "json")
	if len(members.Data) != 1 || members.Data[0].ID != "cli-json" || !members.Data[0].Self || members.Data[0].State != "ready" || members.Data[0].HTTPAddr != p.addr {
		t.Fatalf("members: %+v", members)
	}

	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID        string `json:"id"`
			WireID    string `json:"wire_id"`
			Task      string `json:"task"`
			SizeBytes int64  `json:"size_bytes"`
		} `json:"data"`
	}
	jsonOut(t, &models, "models", "list", "--data-dir", dataDirOf(p), "--format", "json")
	if models.Object != "list" || len(models.Data) != 1 || models.Data[0].WireID != "tiny-bert:test-128" || models.Data[0].Task == "" || models.Data[0].SizeBytes <= 0 {
		t.Fatalf("models list: %+v", models)
	}

	var peers struct {
		Leader string `json:"leader"`
		Data   []struct {
			ID       string `json:"id"`
			Address  string `json:"address"`
			Suffrage string `json:"suffrage"`
			Leader   bool   `json:"leader"`
		} `json:"data"`
	}
	jsonOut(t, &peers, "raft", "peers", "--node", node, "--format", "json")
	if peers.Leader != "cli-json" || len(peers.Data) != 1 || peers.Data[0].Suffrage != "voter" || !peers.Data[0].Leader || peers.Data[0].Address == "" {
		t.Fatalf("raft peers: %+v", peers)
	}

	var usage struct {
		Object string `json:"object"`
		By     string `json:"by"`
		Data   []struct {
			Group        string `json:"group"`
			Requests     int64  `json:"requests"`
			PromptTokens int64  `json:"prompt_tokens"`
		} `json:"data"`
	}
	eventually(t, 10*time.Second, "usage of the embedding", func() error {
		usage.Data = nil
		jsonOut(t, &usage, "usage", "--node", node, "--by", "model", "--format", "json")
		for _, r := range usage.Data {
			if strings.Contains(r.Group, "tiny-bert") && r.Requests >= 1 && r.PromptTokens > 0 {
				return nil
			}
		}
		return fmt.Errorf("usage: %+v", usage)
	})
	if usage.By != "model" {
		t.Fatalf("usage by %q", usage.By)
	}

	doc := filepath.Join(t.TempDir(), "policy.json")
	os.WriteFile(doc, []byte(`{"strategy": "least-connections"}`), 0o600)
	if _, errOut, code := cliRun(t, nil, "policy", "set", "--node", node, doc); code != 0 {
		t.Fatalf("policy set: %d %s", code, errOut)
	}
	var policy struct {
		Strategy string `json:"strategy"`
		Revision uint64 `json:"revision"`
	}
	jsonOut(t, &policy, "policy", "get", "--node", node, "--format", "json")
	if policy.Strategy != "least-connections" || policy.Revision == 0 {
		t.Fatalf("policy get: %+v", policy)
	}

	// audit export writes JSON Lines: one JSON object per line.
	out, errOut, code := cliRun(t, nil, "audit", "export", "--node", node)
	if code != 0 || strings.TrimSpace(out) == "" {
		t.Fatalf("audit export: %d %s", code, errOut)
	}
	for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit export line %d is not JSON: %v\n%s", i+1, err, line)
		}
	}
}

// slowHub serves the tiny-bert files slowly (about 4 s for the model) and
// counts the bytes it sent.
func slowHub(t *testing.T) (*httptest.Server, *atomic.Int64, *atomic.Int64) {
	var sent, finished atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/")
		data, err := os.ReadFile(filepath.Join(onnxtest.AssetDir(t, "tiny-bert", name), name))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(data)))
		step := len(data)/40 + 1
		for i := 0; i < len(data); i += step {
			time.Sleep(100 * time.Millisecond)
			if _, err := w.Write(data[i:min(i+step, len(data))]); err != nil {
				return
			}
			sent.Add(int64(min(step, len(data)-i)))
			w.(http.Flusher).Flush()
		}
		finished.Add(1) // before the client can have read the last byte
	}))
	t.Cleanup(srv.Close)
	return srv, &sent, &finished
}

// Ctrl-C during `infermesh pull` stops following at once (exit 130, a
// message saying the download goes on); the node finishes the download
// and installs the model with nobody waiting; pulling again reports it
// done.
func TestCLIPullInterrupt(t *testing.T) {
	hub, _, finished := slowHub(t)
	const key = "onnx/tiny-bert/cli-interrupt"
	src := tinyBertEntry(t, key, "tiny-bert-cli", "v1", hub.URL)
	p := startNodeArgs(t, "cli-pull", nil, "--listen", "127.0.0.1:0", "--gossip-listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0", "--catalog-source", src)
	cmd := exec.Command(binPath, "pull", "--node", "http://"+p.addr, key)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	sc := bufio.NewScanner(stdout)
	progress := make(chan string, 1)
	go func() {
		for sc.Scan() {
			if strings.Contains(sc.Text(), "%") {
				select {
				case progress <- sc.Text():
				default:
				}
			}
		}
	}()
	select {
	case line := <-progress:
		t.Logf("progress before Ctrl-C: %s", line)
	case <-time.After(30 * time.Second):
		t.Fatalf("no progress line; stderr: %s", errb.String())
	}
	if finished.Load() == 2 {
		t.Fatal("the download finished before the interrupt; the hub is too fast for this test")
	}
	t0 := time.Now()
	cmd.Process.Signal(syscall.SIGINT)
	err = cmd.Wait()
	took := time.Since(t0)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 || took > 2*time.Second {
		t.Fatalf("after SIGINT: %v after %s, want exit 130 at once; stderr: %s", err, took, errb.String())
	}
	if !strings.Contains(errb.String(), "the node keeps downloading it") {
		t.Fatalf("stderr does not say the download goes on: %s", errb.String())
	}
	t.Logf("pull stopped following %s after SIGINT: %s", took.Round(time.Millisecond), strings.TrimSpace(errb.String()))
	// Nobody follows the pull now; the node still finishes and installs it.
	eventually(t, 60*time.Second, "the model installed with nobody waiting", func() error {
		row, err := catalogRowOn(p, key)
		if err != nil {
			return err
		}
		if row["is_installed"] != true {
			return fmt.Errorf("not installed yet (hub finished %d files)", finished.Load())
		}
		return nil
	})
	eventually(t, 5*time.Second, "the hub sent both files in full", func() error {
		if finished.Load() != 2 {
			return fmt.Errorf("%d files", finished.Load())
		}
		return nil
	})
	out, errOut, code := cliRun(t, nil, "pull", "--node", "http://"+p.addr, key)
	if code != 0 || !strings.Contains(out, "done: "+key) {
		t.Fatalf("pulling again: %d\n%s%s", code, out, errOut)
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// meshNode describes one process of a multi-process mesh test. Each node
// has its own loopback address, so the gossip and RPC ports can be fixed.
type meshNode struct {
	id, ip string
	models []string
}

const meshSecret = "e2e-cluster-secret"

func startMeshNode(t *testing.T, n meshNode, join string, extra ...string) *proc {
	t.Helper()
	args := []string{"--listen", n.ip + ":0", "--gossip-listen", n.ip + ":17946", "--rpc-listen", n.ip + ":17947",
		"--cluster-secret", meshSecret, "--fast-timers", "--drain-timeout", "60s"}
	if join != "" {
		args = append(args, "--join", join)
	}
	return startNodeArgs(t, n.id, n.models, append(args, extra...)...)
}

// members asks a node for its view of the mesh.
func members(p *proc) (map[string]string, error) {
	r, err := http.Get(p.url("/v1/server/members"))
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	var out struct {
		Data []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&out); err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, d := range out.Data {
		m[d.ID] = d.State
	}
	return m, nil
}

// waitMembers polls every node until each sees want nodes ready.
func waitMembers(t *testing.T, ps []*proc, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range ps {
		for {
			m, err := members(p)
			ready := 0
			for _, st := range m {
				if st == "ready" {
					ready++
				}
			}
			if err == nil && ready == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s sees %v (err %v), want %d ready", p.addr, m, err, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func embedVia(ctx context.Context, p *proc, text string) (string, error) {
	c := p.client()
	var resp *http.Response
	res, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
		Model: "tiny-bert:test-128",
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String(text)},
	}, option.WithResponseInto(&resp))
	if err != nil {
		return "", err
	}
	if len(res.Data) != 1 || len(res.Data[0].Embedding) != 128 {
		return "", fmt.Errorf("bad embedding response: %d vectors", len(res.Data))
	}
	return resp.Header.Get("X-Service-Backend"), nil
}

func TestMeshThreeProcesses(t *testing.T) {
	nodes := []meshNode{
		{"mesh-a", "127.0.10.1", []string{"tiny-bert"}},
		{"mesh-b", "127.0.10.2", []string{"tiny-bert", "isnet"}},
		{"mesh-c", "127.0.10.3", nil},
	}
	join := nodes[0].ip + ":17946"
	ps := []*proc{startMeshNode(t, nodes[0], "")}
	for _, n := range nodes[1:] {
		ps = append(ps, startMeshNode(t, n, join))
	}
	waitMembers(t, ps, 3)
	ctx := context.Background()
	out, err := exec.Command(binPath, "members", "--node", "http://"+ps[2].addr).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("mesh-c (this)")) || bytes.Count(out, []byte("ready")) != 3 || !bytes.Contains(out, []byte("onnx/tiny-bert/test-128")) {
		t.Fatalf("infermesh members: %v\n%s", err, out)
	}

	// Every node answers for every model; the backend holds the model.
	holders := map[string]bool{"mesh-a": true, "mesh-b": true}
	for i, p := range ps {
		seen := map[string]int{}
		for j := 0; j < 12; j++ {
			backend, err := embedVia(ctx, p, fmt.Sprintf("request %d through %s", j, nodes[i].id))
			if err != nil {
				t.Fatalf("embeddings through %s: %v", nodes[i].id, err)
			}
			if !holders[backend] {
				t.Fatalf("embeddings through %s served by %q, which lacks the model", nodes[i].id, backend)
			}
			seen[backend]++
		}
		t.Logf("embeddings entering %s served by %v", nodes[i].id, seen)
		c := p.client()
		page, err := c.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range page.Data {
			ids = append(ids, m.ID)
		}
		sort.Strings(ids)
		if fmt.Sprint(ids) != "[onnx/isnet/general-use-small onnx/tiny-bert/test-128]" {
			t.Errorf("models listed by %s: %v", nodes[i].id, ids)
		}
	}
	// Background removal entering the node without models is served by b,
	// and the bytes arrive intact (a decodable PNG of the right size).
	photo := onnxtest.GoTestdata(t, "video-001.png")
	body, _ := json.Marshal(map[string]string{"model": "isnet:small", "image": base64.StdEncoding.EncodeToString(photo)})
	resp, err := http.Post(ps[2].url("/v1/vision/background"), "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get("X-Service-Backend"); got != "mesh-b" {
		t.Errorf("vision through mesh-c served by %q, want mesh-b", got)
	}
	if img := decodeBackground(t, resp); img.Bounds().Dx() != 150 || img.Bounds().Dy() != 103 {
		t.Errorf("forwarded background removal returned %v", img.Bounds())
	}

	// Replicated policy: block one model, deprecate the other, from any node.
	pol := `{"strategy":"least-connections","workers":{"mesh-a":{"weight":2}},"models":{"onnx/isnet/general-use-small":{"lifecycle":"blocked"},"onnx/tiny-bert/test-128":{"lifecycle":"deprecated","replacement":"onnx/tiny-bert/v2"}}}`
	polFile := t.TempDir() + "/policy.json"
	os.WriteFile(polFile, []byte(pol), 0o644)
	if out, err := exec.Command(binPath, "policy", "set", "--node", "http://"+ps[1].addr, polFile).CombinedOutput(); err != nil {
		t.Fatalf("policy set: %v\n%s", err, out)
	}
	for _, p := range ps {
		eventually(t, time.Second, "policy applied on "+p.addr, func() error {
			c := p.client()
			page, err := c.Models.List(ctx)
			if err != nil {
				return err
			}
			if len(page.Data) != 1 || page.Data[0].ID != "onnx/tiny-bert/test-128" {
				return fmt.Errorf("models %v", page.Data)
			}
			var resp *http.Response
			if _, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "tiny-bert:test-128",
				Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}}, option.WithResponseInto(&resp)); err != nil {
				return err
			}
			if got := resp.Header.Get("X-AI-Model-Deprecated"); got != "onnx/tiny-bert/v2" {
				return fmt.Errorf("deprecation header %q", got)
			}
			return nil
		})
	}
	if _, err := exec.Command(binPath, "policy", "set", "--node", "http://"+ps[0].addr, writeTemp(t, `{"strategy":"round-robin"}`)).CombinedOutput(); err != nil {
		t.Fatal(err)
	}

	// SIGKILL of mesh-b under load against a and c: no request fails.
	ok, failed := loadWhile(t, []*proc{ps[0], ps[2]}, 32, func() {
		ps[1].cmd.Process.Signal(syscall.SIGKILL)
	})
	t.Logf("SIGKILL mesh-b under load: %d ok, %d failed", ok, len(failed))
	if len(failed) > 0 {
		t.Fatalf("requests failed after SIGKILL: %v", failed[:min(5, len(failed))])
	}
}

// loadWhile runs conc closed-loop embedding clients spread over entry
// nodes, fires fault once traffic flows, keeps going for a while after it,
// and returns the number of successes and the failures.
func loadWhile(t *testing.T, entries []*proc, conc int, fault func()) (int64, []error) {
	t.Helper()
	var okN, started atomic.Int64
	var mu sync.Mutex
	var failed []error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < conc; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			p := entries[i%len(entries)]
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := embedVia(ctx, p, fmt.Sprintf("load %d %d", i, j))
				cancel()
				started.Add(1)
				if err != nil {
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
					continue
				}
				okN.Add(1)
			}
		}(i)
	}
	for started.Load() < int64(4*conc) {
		time.Sleep(5 * time.Millisecond)
	}
	fault()
	before := started.Load()
	// Keep the load on until many requests have run after the fault.
	for started.Load() < before+int64(20*conc) {
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	return okN.Load(), failed
}

func TestMeshDrainUnderLoad(t *testing.T) {
	nodes := []meshNode{
		{"drain-a", "127.0.11.1", []string{"tiny-bert"}},
		{"drain-b", "127.0.11.2", []string{"tiny-bert"}},
		{"drain-c", "127.0.11.3", []string{"tiny-bert"}},
	}
	join := nodes[0].ip + ":17946"
	ps := []*proc{startMeshNode(t, nodes[0], "")}
	for _, n := range nodes[1:] {
		ps = append(ps, startMeshNode(t, n, join))
	}
	waitMembers(t, ps, 3)
	ok, failed := loadWhile(t, []*proc{ps[0], ps[1]}, 32, func() {
		ps[2].cmd.Process.Signal(syscall.SIGTERM)
	})
	t.Logf("SIGTERM drain-c under load: %d ok, %d failed", ok, len(failed))
	if len(failed) > 0 {
		t.Fatalf("requests failed during drain: %v", failed[:min(5, len(failed))])
	}
	<-ps[2].exited
	var ee *exec.ExitError
	if ps[2].err != nil && !errors.As(ps[2].err, &ee) {
		t.Fatalf("drained node: %v", ps[2].err)
	}
	if ps[2].err != nil {
		t.Fatalf("drained node exited with %v\n%s", ps[2].err, ps[2].stderr)
	}
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	f := t.TempDir() + "/f.json"
	if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

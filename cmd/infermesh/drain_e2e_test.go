package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// postRaw sends a JSON body and returns the status, the error code and the
// Retry-After header.
func postRaw(p *proc, path string, body any) (int, string, string, error) {
	b, _ := json.Marshal(body)
	resp, err := http.Post(p.url(path), "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Error.Code, resp.Header.Get("Retry-After"), nil
}

// holdDraining keeps a request in flight on p (a body that trickles in a
// byte a second), so that after SIGTERM p stays draining until stop closes.
func holdDraining(t *testing.T, p *proc) chan struct{} {
	t.Helper()
	stop := make(chan struct{})
	go slowBody(p.addr, "/v1/embeddings", 1<<20, stop)
	waitInFlight(t, p)
	t.Cleanup(func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
	})
	return stop
}

func expectDraining(t *testing.T, what string, status int, code, retry string, err error) {
	t.Helper()
	if err != nil || status != http.StatusServiceUnavailable || code != "server_draining" || retry == "" {
		t.Errorf("%s: %d %q Retry-After %q (%v); want 503 server_draining with Retry-After", what, status, code, retry, err)
	}
}

// A single node that got SIGTERM refuses new model work with 503
// server_draining + Retry-After (it has no peer to hand it to), while the
// request already running keeps the drain open.
func TestDrainingSingleNodeRefusesNewWork(t *testing.T) {
	p := startNode(t, "drain-single", "tiny-bert")
	emb := map[string]any{"model": "tiny-bert:test-128", "input": "hello"}
	if st, code, _, err := postRaw(p, "/v1/embeddings", emb); err != nil || st != 200 {
		t.Fatalf("before drain: %d %s %v", st, code, err)
	}
	stop := holdDraining(t, p)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// 503 alone could still be "not_ready" from start-up: wait for the
	// drain itself.
	eventually(t, 5*time.Second, "readyz 503 draining", func() error {
		r, err := http.Get(p.url("/readyz"))
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 503 || !strings.Contains(string(b), "draining") {
			return fmt.Errorf("%d %s", r.StatusCode, b)
		}
		return nil
	})
	st, code, retry, err := postRaw(p, "/v1/embeddings", emb)
	expectDraining(t, "embeddings", st, code, retry, err)
	st, code, retry, err = postRaw(p, "/v1/batch/embeddings", map[string]any{"model": "tiny-bert:test-128", "input": []string{"a"}})
	expectDraining(t, "batch", st, code, retry, err)
	close(stop)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("node did not exit after the drain")
	}
}

// In a mesh, a request whose only holders are draining is answered 503
// server_draining with Retry-After by a live node (not 404, and not 501 for
// a vision request without a model).
func TestDrainingHoldersGive503InMesh(t *testing.T) {
	a := startMeshNode(t, meshNode{"drainmesh-a", "127.0.60.1", nil}, "")
	b := startMeshNode(t, meshNode{"drainmesh-b", "127.0.60.2", []string{"tiny-bert", "isnet"}}, "127.0.60.1:17946")
	waitMembers(t, []*proc{a, b}, 2)
	emb := map[string]any{"model": "tiny-bert:test-128", "input": "hello"}
	if st, code, _, err := postRaw(a, "/v1/embeddings", emb); err != nil || st != 200 {
		t.Fatalf("before drain: %d %s %v", st, code, err)
	}
	holdDraining(t, b)
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a sees b draining", func() error {
		m, err := members(a)
		if err != nil {
			return err
		}
		if m["drainmesh-b"] != "draining" {
			return errState(m["drainmesh-b"])
		}
		return nil
	})
	st, code, retry, err := postRaw(a, "/v1/embeddings", emb)
	expectDraining(t, "embeddings via a", st, code, retry, err)
	st, code, retry, err = postRaw(a, "/v1/vision/background", map[string]any{"image": "data:image/png;base64,AAAA"})
	expectDraining(t, "vision without model via a", st, code, retry, err)
	st, code, retry, err = postRaw(b, "/v1/embeddings", emb)
	expectDraining(t, "embeddings via draining b", st, code, retry, err)
	// A model nobody holds is still a 404.
	if st, code, _, _ := postRaw(a, "/v1/embeddings", map[string]any{"model": "nobody:has", "input": "x"}); st != 404 {
		t.Errorf("unknown model: %d %s, want 404", st, code)
	}
}

type errState string

func (e errState) Error() string { return "state " + string(e) }

// readyState returns /readyz's status code and body fields.
func readyState(p *proc) (int, string, string) {
	r, err := http.Get(p.url("/readyz"))
	if err != nil {
		return 0, "", err.Error()
	}
	defer r.Body.Close()
	var b struct {
		Status string `json:"status"`
		Reason string `json:"reason"`
	}
	json.NewDecoder(r.Body).Decode(&b)
	return r.StatusCode, b.Status, b.Reason
}

// TestReadyzMeansKeyedRequestsWork: a restarted node's /readyz says 503
// with a reason while its raft replica catches up, and once it says 200 a
// valid key is served (never 503 replica_catching_up).
func TestReadyzMeansKeyedRequestsWork(t *testing.T) {
	t.Setenv("SERVICE_ADMIN_KEY", adminKey)
	const ip = "127.0.61.1"
	p := startNodeArgs(t, "readyz", nil, "--listen", "0.0.0.0:0", "--advertise", ip, "--gossip-listen", ip+":17946",
		"--rpc-listen", ip+":17947", "--cluster-secret", meshSecret, "--fast-timers")
	fix := func(p *proc) {
		_, port, _ := net.SplitHostPort(p.addr)
		p.addr = net.JoinHostPort(ip, port)
	}
	fix(p)
	eventually(t, 30*time.Second, "admin key usable", func() error {
		if code, c := keyed(p, adminKey, "GET", "/v1/server/keys", nil); code != 200 {
			return fmt.Errorf("%d %s", code, c)
		}
		return nil
	})
	k := createKey(t, p, map[string]any{"name": "probe"})
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	p = restartProc(t, p)
	fix(p)
	notReady, ready := 0, 0
	for i := 0; i < 400 && ready < 5; i++ {
		code, status, reason := readyState(p)
		switch {
		case code == 503 && status == "not_ready" && reason != "":
			notReady++
		case code == 200:
			if kc, c := keyed(p, k, "GET", "/v1/models", nil); kc != 200 {
				t.Fatalf("/readyz said ready but a valid key got %d %s", kc, c)
			}
			ready++
		default:
			t.Fatalf("/readyz answered %d %q %q", code, status, reason)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if notReady == 0 || ready < 5 {
		t.Fatalf("readyz: %d not-ready answers with a reason, %d ready; want both", notReady, ready)
	}
}

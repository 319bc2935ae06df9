package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// keyed sends a request with an API key (empty: none) and returns the
// status and error code.
func keyed(p *proc, key, method, path string, body any) (int, string) {
	return keyedWith(http.DefaultClient, p, key, method, path, body)
}

// keyedWith is keyed through client c.
func keyedWith(c *http.Client, p *proc, key, method, path string, body any) (int, string) {
	var buf bytes.Buffer
	if body != nil {
		json.NewEncoder(&buf).Encode(body)
	}
	req, _ := http.NewRequest(method, p.url(path), &buf)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Error.Code
}

// startKeyedMesh starts three nodes whose client listeners are not
// loopback-only (0.0.0.0), so every caller needs a key.
func startKeyedMesh(t *testing.T, base string) []*proc {
	t.Helper()
	var ps []*proc
	for i := 1; i <= 3; i++ {
		ip := fmt.Sprintf("%s.%d", base, i)
		args := []string{"--listen", "0.0.0.0:0", "--advertise", ip, "--gossip-listen", ip + ":17946", "--rpc-listen", ip + ":17947",
			"--cluster-secret", meshSecret, "--fast-timers"}
		if i > 1 {
			args = append(args, "--join", base+".1:17946")
		}
		var models []string
		if i == 1 {
			models = []string{"tiny-bert"}
		}
		p := startNodeArgs(t, fmt.Sprintf("auth-%d", i), models, args...)
		// The node listens on all interfaces; talk to it on its own address.
		_, port, _ := net.SplitHostPort(p.addr)
		p.addr = net.JoinHostPort(ip, port)
		ps = append(ps, p)
	}
	return ps
}

const adminKey = "im-test-admin-key-for-e2e"

func TestAuthAndExactQuotaAcrossProcesses(t *testing.T) {
	t.Setenv("SERVICE_ADMIN_KEY", adminKey)
	ps := startKeyedMesh(t, "127.0.14")
	embed := map[string]any{"model": "tiny-bert:test-128", "input": "hello"}
	// Poll slowly: a key the node does not know yet counts as a wrong key,
	// and ten of those in a minute block the caller.
	eventuallyEvery(t, 30*time.Second, 2*time.Second, "admin key usable everywhere", func() error {
		for _, p := range ps {
			if code, c := keyed(p, adminKey, "GET", "/v1/server/keys", nil); code != 200 {
				return fmt.Errorf("%s: %d %s", p.id, code, c)
			}
		}
		return nil
	})
	waitMembersKeyed(t, ps)
	if code, c := keyed(ps[1], "", "POST", "/v1/embeddings", embed); code != 401 || c != "invalid_api_key" {
		t.Fatalf("no key: %d %s", code, c)
	}
	// A wrong key is 401; in the first seconds after a node learns its
	// leader it may be a retryable 503 (replica_catching_up) instead.
	eventuallyEvery(t, 10*time.Second, 500*time.Millisecond, "wrong key refused", func() error {
		code, c := keyed(ps[1], "im-wrong", "POST", "/v1/embeddings", embed)
		if code == 503 && c == "replica_catching_up" {
			return fmt.Errorf("%d %s", code, c)
		}
		if code != 401 || c != "invalid_api_key" {
			t.Fatalf("wrong key: %d %s", code, c)
		}
		return nil
	})

	// A key made through one node works on all of them within a second.
	var k keyView
	body, _ := json.Marshal(map[string]any{"name": "svc", "allow": []string{"embeddings"}})
	req, _ := http.NewRequest("POST", ps[0].url("/v1/server/keys"), bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("create key: %v %v", err, resp)
	}
	json.NewDecoder(resp.Body).Decode(&k)
	resp.Body.Close()
	for _, p := range ps {
		eventuallyEvery(t, time.Second, 150*time.Millisecond, "new key accepted on "+p.id, func() error {
			if code, c := keyed(p, k.Key, "POST", "/v1/embeddings", embed); code != 200 {
				return fmt.Errorf("%d %s", code, c)
			}
			return nil
		})
		if code, c := keyed(p, k.Key, "POST", "/v1/vision/background", map[string]any{"image": "aGk="}); code != 403 || c != "permission_denied" {
			t.Errorf("allowlisted key on vision via %s: %d %s", p.id, code, c)
		}
		if code, c := keyed(p, k.Key, "GET", "/v1/server/keys", nil); code != 403 {
			t.Errorf("non-admin key on the admin API via %s: %d %s", p.id, code, c)
		}
	}
	// Revoked through another node: refused everywhere.
	req, _ = http.NewRequest("DELETE", ps[2].url("/v1/server/keys/"+k.ID), nil)
	req.Header.Set("Authorization", "Bearer "+adminKey)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("revoke: %v", err)
	}
	for _, p := range ps {
		eventually(t, time.Second, "revoked key refused on "+p.id, func() error {
			if code, c := keyed(p, k.Key, "POST", "/v1/embeddings", embed); code != 401 {
				return fmt.Errorf("%d %s", code, c)
			}
			return nil
		})
	}

	// Exactness: a daily quota of N spread over three nodes under
	// concurrent load admits exactly N, counted here.
	const quota = 40
	body, _ = json.Marshal(map[string]any{"name": "quota", "daily_quota": quota})
	req, _ = http.NewRequest("POST", ps[0].url("/v1/server/keys"), bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("create quota key: %v", err)
	}
	var qk keyView
	json.NewDecoder(resp.Body).Decode(&qk)
	resp.Body.Close()
	for _, p := range ps {
		eventuallyEvery(t, 5*time.Second, 200*time.Millisecond, "quota key known", func() error {
			if code, _ := keyed(p, qk.Key, "GET", "/v1/models", nil); code != 200 {
				return fmt.Errorf("%d", code)
			}
			return nil
		})
	}
	var admitted, refused, other atomic.Int64
	var mu sync.Mutex
	others := map[string]int{}
	var wg sync.WaitGroup
	for w := 0; w < 12; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			p := ps[w%3]
			for i := 0; i < 12; i++ {
				code, c := keyed(p, qk.Key, "POST", "/v1/embeddings", embed)
				switch {
				case code == 200:
					admitted.Add(1)
				case code == 429 && strings.Contains(c, "quota"):
					refused.Add(1)
				default:
					other.Add(1)
					mu.Lock()
					others[fmt.Sprintf("%d %s", code, c)]++
					mu.Unlock()
				}
			}
		}(w)
	}
	wg.Wait()
	t.Logf("daily quota %d over 3 nodes: %d admitted, %d refused 429, %d other %v", quota, admitted.Load(), refused.Load(), other.Load(), others)
	if admitted.Load() != quota || other.Load() != 0 {
		t.Fatalf("admitted %d of a quota of %d (other outcomes %v)", admitted.Load(), quota, others)
	}
	// Usage reaches raft in batches; every node then reports the same
	// totals, and the quota key's row counts exactly the admitted requests.
	eventually(t, 10*time.Second, "usage totals agree", func() error {
		var first string
		for _, p := range ps {
			req, _ := http.NewRequest("GET", p.url("/v1/server/usage?by=key"), nil)
			req.Header.Set("Authorization", "Bearer "+adminKey)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			var u struct {
				Data []struct {
					Group    string `json:"group"`
					Requests int64  `json:"requests"`
				} `json:"data"`
			}
			err = json.NewDecoder(resp.Body).Decode(&u)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 {
				return fmt.Errorf("%s: usage %d %v", p.id, resp.StatusCode, err)
			}
			var got int64 = -1
			for _, r := range u.Data {
				if r.Group == qk.ID {
					got = r.Requests
				}
			}
			if got != quota {
				return fmt.Errorf("%s: quota key has %d requests in usage, want %d (%+v)", p.id, got, quota, u.Data)
			}
			if s := fmt.Sprint(u.Data); first == "" {
				first = s
			} else if s != first {
				return fmt.Errorf("%s reports %s, another node %s", p.id, s, first)
			}
		}
		return nil
	})

	// Again with a node killed mid-run: never more than N.
	qk2 := createKey(t, ps[0], map[string]any{"name": "quota2", "daily_quota": quota})
	// Wait until every node knows the key: an unknown key is a wrong key,
	// and ten of those in a minute block the client.
	for _, p := range ps {
		eventuallyEvery(t, 5*time.Second, 200*time.Millisecond, "quota2 key known", func() error {
			if code, _ := keyed(p, qk2, "GET", "/v1/models", nil); code != 200 {
				return fmt.Errorf("%d", code)
			}
			return nil
		})
	}
	var admitted2, sent atomic.Int64
	var killOnce sync.Once
	wg = sync.WaitGroup{}
	for w := 0; w < 12; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 12; i++ {
				if sent.Add(1) == 30 {
					killOnce.Do(func() { ps[2].cmd.Process.Signal(syscall.SIGKILL) })
				}
				if code, _ := keyed(ps[w%3], qk2, "POST", "/v1/embeddings", embed); code == 200 {
					admitted2.Add(1)
				}
			}
		}(w)
	}
	wg.Wait()
	t.Logf("daily quota %d with a node killed mid-run: %d admitted", quota, admitted2.Load())
	if admitted2.Load() > quota {
		t.Fatalf("over-admitted: %d of %d", admitted2.Load(), quota)
	}

	// Bring the killed node back from its data directory, then SIGKILL the
	// raft leader: existing keys stay accepted on the survivors, and writes
	// succeed again once a new leader is elected.
	<-ps[2].exited
	ps[2] = restartProc(t, ps[2])
	_, port, _ := net.SplitHostPort(ps[2].addr)
	ps[2].addr = net.JoinHostPort("127.0.14.3", port)
	waitMembersKeyed(t, ps)
	var d digestView
	req, _ = http.NewRequest("GET", ps[0].url("/v1/server/state-digest"), nil)
	req.Header.Set("Authorization", "Bearer "+adminKey)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		json.NewDecoder(resp.Body).Decode(&d)
		resp.Body.Close()
	}
	var survivors []*proc
	for _, p := range ps {
		if p.id == d.Leader {
			p.cmd.Process.Signal(syscall.SIGKILL)
		} else {
			survivors = append(survivors, p)
		}
	}
	live := createKeyEventually(t, survivors[0], map[string]any{"name": "after-leader-kill"})
	for _, p := range survivors {
		if code, c := keyed(p, adminKey, "GET", "/v1/models", nil); code != 200 {
			t.Errorf("existing key refused on %s after leader kill: %d %s", p.id, code, c)
		}
		eventually(t, time.Second, "new key on "+p.id, func() error {
			if code, c := keyed(p, live, "GET", "/v1/models", nil); code != 200 {
				return fmt.Errorf("%d %s", code, c)
			}
			return nil
		})
	}
}

// createKey makes a key through the admin API and returns its plaintext.
func createKey(t *testing.T, p *proc, spec map[string]any) string {
	t.Helper()
	body, _ := json.Marshal(spec)
	req, _ := http.NewRequest("POST", p.url("/v1/server/keys"), bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var k keyView
	json.NewDecoder(resp.Body).Decode(&k)
	if resp.StatusCode != 200 || k.Key == "" {
		t.Fatalf("create key on %s: %d", p.id, resp.StatusCode)
	}
	return k.Key
}

// createKeyEventually retries key creation while a new leader is elected.
func createKeyEventually(t *testing.T, p *proc, spec map[string]any) string {
	t.Helper()
	var key string
	eventually(t, 20*time.Second, "write after leader kill", func() error {
		body, _ := json.Marshal(spec)
		req, _ := http.NewRequest("POST", p.url("/v1/server/keys"), bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var k keyView
		json.NewDecoder(resp.Body).Decode(&k)
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		key = k.Key
		return nil
	})
	return key
}

func waitMembersKeyed(t *testing.T, ps []*proc) {
	t.Helper()
	eventually(t, 30*time.Second, "3 ready members", func() error {
		for _, p := range ps {
			req, _ := http.NewRequest("GET", p.url("/v1/server/members"), nil)
			req.Header.Set("Authorization", "Bearer "+adminKey)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			var out struct {
				Data []struct{ State string } `json:"data"`
			}
			json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("%s: members %d", p.id, resp.StatusCode)
			}
			ready := 0
			for _, d := range out.Data {
				if d.State == "ready" {
					ready++
				}
			}
			if ready != 3 {
				return fmt.Errorf("%s sees %d ready", p.id, ready)
			}
		}
		return nil
	})
}

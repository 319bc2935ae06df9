package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"
)

// adminReq sends a request with the admin key and decodes a 200 body
// into out; it returns the status and the error param of a failure.
func adminReq(p *proc, method, path string, body, out any) (int, string, error) {
	var buf bytes.Buffer
	if body != nil {
		json.NewEncoder(&buf).Encode(body)
	}
	req, _ := http.NewRequest(method, p.url(path), &buf)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode == 200 {
		if out != nil {
			return 200, "", json.NewDecoder(resp.Body).Decode(out)
		}
		return 200, "", nil
	}
	var e struct {
		Error struct {
			Param *string `json:"param"`
		} `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&e)
	param := ""
	if e.Error.Param != nil {
		param = *e.Error.Param
	}
	return resp.StatusCode, param, nil
}

// TestAdminWritesVisibleWhenTheyReturn: key create, key revoke and policy
// set sent to a follower are visible on that follower when the call
// returns, and a revoked key is refused by every node at once; a bad
// policy is a 400 naming the field.
func TestAdminWritesVisibleWhenTheyReturn(t *testing.T) {
	t.Setenv("SERVICE_ADMIN_KEY", adminKey)
	ps := startKeyedMesh(t, "127.0.63")
	waitMembersKeyed(t, ps)
	var follower *proc
	eventually(t, 20*time.Second, "a follower that knows the leader", func() error {
		for _, p := range ps {
			var d digestView
			if code, _, err := adminReq(p, "GET", "/v1/server/state-digest", nil, &d); err == nil && code == 200 && !d.IsLeader && d.Leader != "" {
				follower = p
				return nil
			}
		}
		return fmt.Errorf("no follower yet")
	})
	// Every node must know the voters' configuration before the barrier
	// reads mean something; wait until a key created anywhere works
	// everywhere once.
	warm := createKey(t, follower, map[string]any{"name": "warm"})
	eventually(t, 10*time.Second, "warm key everywhere", func() error {
		for _, p := range ps {
			if code, c := keyed(p, warm, "GET", "/v1/models", nil); code != 200 {
				return fmt.Errorf("%s: %d %s", p.id, code, c)
			}
		}
		return nil
	})
	strategies := []string{"least-connections", "round-robin"}
	for i := 0; i < 6; i++ {
		var created keyView
		if code, _, err := adminReq(follower, "POST", "/v1/server/keys", map[string]any{"name": fmt.Sprintf("vis-%d", i)}, &created); err != nil || code != 200 {
			t.Fatalf("create: %d %v", code, err)
		}
		var list struct {
			Data []keyView `json:"data"`
		}
		if _, _, err := adminReq(follower, "GET", "/v1/server/keys", nil, &list); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, k := range list.Data {
			found = found || k.ID == created.ID
		}
		if !found {
			t.Fatalf("round %d: keys list on the follower right after create misses %s", i, created.ID)
		}
		if code, c := keyed(follower, created.Key, "GET", "/v1/models", nil); code != 200 {
			t.Fatalf("round %d: new key on the follower: %d %s", i, code, c)
		}
		if code, _, err := adminReq(follower, "DELETE", "/v1/server/keys/"+created.ID, nil, nil); err != nil || code != 200 {
			t.Fatalf("revoke: %d %v", code, err)
		}
		for _, p := range ps {
			if code, c := keyed(p, created.Key, "GET", "/v1/models", nil); code != 401 {
				t.Fatalf("round %d: revoked key on %s right after revoke returned: %d %s", i, p.id, code, c)
			}
		}
		want := strategies[i%2]
		if code, _, err := adminReq(follower, "PUT", "/v1/server/policy", map[string]any{"strategy": want}, nil); err != nil || code != 200 {
			t.Fatalf("policy set: %d %v", code, err)
		}
		var pol struct {
			Strategy string `json:"strategy"`
		}
		if _, _, err := adminReq(follower, "GET", "/v1/server/policy", nil, &pol); err != nil || pol.Strategy != want {
			t.Fatalf("round %d: policy get right after set: %q (%v), want %q", i, pol.Strategy, err, want)
		}
	}
	// A revoked key is refused by every node as soon as the revoke returns,
	// whichever node answered it: 100 trials.
	accepted := 0
	for i := range 100 {
		var created keyView
		if code, _, err := adminReq(follower, "POST", "/v1/server/keys", map[string]any{"name": fmt.Sprintf("rev-%d", i)}, &created); err != nil || code != 200 {
			t.Fatalf("create: %d %v", code, err)
		}
		if code, c := keyed(follower, created.Key, "GET", "/v1/models", nil); code != 200 {
			t.Fatalf("trial %d: new key on the follower: %d %s", i, code, c)
		}
		if code, _, err := adminReq(ps[i%3], "DELETE", "/v1/server/keys/"+created.ID, nil, nil); err != nil || code != 200 {
			t.Fatalf("revoke on %s: %d %v", ps[i%3].id, code, err)
		}
		// Each trial checks from its own loopback address: three refused
		// keys from one address are strikes toward its wrong-key block.
		from := fmt.Sprintf("127.2.%d.%d", i/200, i%200+1)
		for _, p := range ps {
			if code := keyedFrom(t, from, p, created.Key); code != 401 {
				accepted++
				t.Errorf("trial %d: revoked key got %d on %s right after the revoke on %s returned", i, code, p.id, ps[i%3].id)
			}
		}
	}
	t.Logf("revoked keys accepted after the revoke returned: %d of 300 checks (100 trials x 3 nodes)", accepted)
	for body, param := range map[string]string{
		`{"strategy":"fastest"}`:                                         "strategy",
		`{"workers":{"auth-1":{"canary_percent":150}}}`:                  "workers.auth-1.canary_percent",
		`{"models":{"onnx/tiny-bert/test-128":{"lifecycle":"retired"}}}`: "models.onnx/tiny-bert/test-128.lifecycle",
	} {
		code, got, err := adminReq(follower, "PUT", "/v1/server/policy", json.RawMessage(body), nil)
		if err != nil || code != 400 || got != param {
			t.Errorf("policy %s: %d param %q (%v), want 400 naming %s", body, code, got, err, param)
		}
	}
}

// keyedFrom asks GET /v1/models on p with key from the local address from
// and returns the status.
func keyedFrom(t *testing.T, from string, p *proc, key string) int {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	req, _ := http.NewRequest("GET", p.url("/v1/models"), nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET /v1/models on %s from %s: %v", p.id, from, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

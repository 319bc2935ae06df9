package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The routing policy's per-node settings (seeded from gateway.json, then
// changed through /v1/server/policy) are shown beside each node's own in
// /v1/server/members, the dashboard's data and the per-peer metrics.
// Loopback prefix 127.0.95.x is this file's.

// routingJSON is a routing settings object of the API.
type routingJSON struct {
	Weight        int  `json:"weight"`
	Canary        bool `json:"canary"`
	CanaryPercent int  `json:"canary_percent"`
	Cap           int  `json:"cap"`
}

// memberRouting is one member's own, policy and effective settings.
type memberRouting struct {
	ID        string       `json:"id"`
	Weight    int          `json:"weight"`
	Cap       int          `json:"cap"`
	Canary    bool         `json:"canary"`
	Policy    *routingJSON `json:"policy"`
	Effective routingJSON  `json:"effective"`
}

func routingRows(p *proc, path string) (map[string]memberRouting, error) {
	resp, err := http.Get(p.url(path))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Data    []memberRouting `json:"data"`
		Workers []memberRouting `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("%s: %d: %v", path, resp.StatusCode, err)
	}
	rows := map[string]memberRouting{}
	for _, m := range append(out.Data, out.Workers...) {
		rows[m.ID] = m
	}
	return rows, nil
}

// peerGauges reads the per-peer routing series of p's metrics.
func peerGauges(p *proc) (map[string]string, error) {
	resp, err := http.Get(p.url("/v1/server/metrics"))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "infermesh_peer_routing_") {
			k, v, _ := strings.Cut(line, " ")
			out[k] = v
		}
	}
	return out, sc.Err()
}

func TestPolicyRoutingShownBesideOwn(t *testing.T) {
	data := t.TempDir()
	gw := `{"workers":{"rt-b":{"weight":4,"canary":true,"canary_percent":25,"inflight_cap":2}}}`
	if err := os.WriteFile(filepath.Join(data, "gateway.json"), []byte(gw), 0o644); err != nil {
		t.Fatal(err)
	}
	a := launch(t, "rt-a", []string{"serve", "--data-dir", data, "--node-id", "rt-a", "--listen", "127.0.95.1:0",
		"--gossip-listen", "127.0.95.1:17946", "--rpc-listen", "127.0.95.1:17947", "--cluster-secret", meshSecret,
		"--fast-timers", "--drain-timeout", "60s", "--inflight-cap", "7"})
	b := startMeshNode(t, meshNode{"rt-b", "127.0.95.2", nil}, "127.0.95.1:17946")
	waitMembers(t, []*proc{a, b}, 2)

	want := routingJSON{Weight: 4, Canary: true, CanaryPercent: 25, Cap: 2}
	for _, p := range []*proc{a, b} {
		for _, path := range []string{"/v1/server/members", "/dashboard/data"} {
			eventually(t, 20*time.Second, p.id+" shows gateway.json's settings for rt-b in "+path, func() error {
				rows, err := routingRows(p, path)
				if err != nil {
					return err
				}
				rb, ra := rows["rt-b"], rows["rt-a"]
				if rb.Policy == nil || *rb.Policy != want || rb.Effective != want {
					return fmt.Errorf("rt-b: %+v", rb)
				}
				if rb.Canary || rb.Cap == 2 {
					return fmt.Errorf("rt-b's own settings show the policy's: %+v", rb)
				}
				// rt-a has no entry: its own settings are in force.
				if ra.Policy != nil || ra.Effective.Cap != 7 || ra.Cap != 7 || ra.Effective.Canary {
					return fmt.Errorf("rt-a: %+v", ra)
				}
				return nil
			})
		}
	}
	eventually(t, 10*time.Second, "the per-peer metrics show own, policy and effective", func() error {
		g, err := peerGauges(a)
		if err != nil {
			return err
		}
		for k, v := range map[string]string{
			`infermesh_peer_routing_inflight_cap{peer="rt-b",source="effective"}`:   "2",
			`infermesh_peer_routing_inflight_cap{peer="rt-b",source="policy"}`:      "2",
			`infermesh_peer_routing_weight{peer="rt-b",source="effective"}`:         "4",
			`infermesh_peer_routing_canary_percent{peer="rt-b",source="effective"}`: "25",
			`infermesh_peer_routing_canary_percent{peer="rt-b",source="own"}`:       "-1",
			`infermesh_peer_routing_inflight_cap{peer="rt-a",source="effective"}`:   "7",
			`infermesh_peer_routing_inflight_cap{peer="rt-a",source="own"}`:         "7",
		} {
			if g[k] != v {
				return fmt.Errorf("%s = %q, want %s (all: %v)", k, g[k], v, g)
			}
		}
		if _, ok := g[`infermesh_peer_routing_weight{peer="rt-a",source="policy"}`]; ok {
			return fmt.Errorf("rt-a has a policy series without a policy entry")
		}
		return nil
	})

	// A policy write replaces gateway.json's: rt-a capped at 3, rt-b no
	// longer set (its own settings again).
	if code, _, err := adminReq(a, "PUT", "/v1/server/policy", json.RawMessage(`{"workers":{"rt-a":{"weight":2,"inflight_cap":3}}}`), nil); err != nil || code != 200 {
		t.Fatalf("policy write: %d %v", code, err)
	}
	eventually(t, 20*time.Second, "rt-b shows the new policy", func() error {
		rows, err := routingRows(b, "/v1/server/members")
		if err != nil {
			return err
		}
		ra, rb := rows["rt-a"], rows["rt-b"]
		if ra.Policy == nil || ra.Effective.Cap != 3 || ra.Effective.Weight != 2 || ra.Cap != 7 {
			return fmt.Errorf("rt-a: %+v", ra)
		}
		if rb.Policy != nil || rb.Effective.Canary || rb.Effective.Cap != rb.Cap {
			return fmt.Errorf("rt-b: %+v", rb)
		}
		return nil
	})
}

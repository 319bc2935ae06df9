package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// call sends a JSON request to a node and decodes a 200 answer into out.
func call(p *proc, method, path string, body, out any) (int, error) {
	var buf bytes.Buffer
	if body != nil {
		json.NewEncoder(&buf).Encode(body)
	}
	req, _ := http.NewRequest(method, p.url(path), &buf)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == 200 && out != nil {
		return 200, json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode, nil
}

type keyView struct {
	ID      string `json:"id"`
	Key     string `json:"key"`
	Revoked bool   `json:"revoked"`
}

type digestView struct {
	Digest   string `json:"digest"`
	Index    uint64 `json:"applied_index"`
	Leader   string `json:"leader"`
	IsLeader bool   `json:"is_leader"`
}

// eventually polls check every 20ms until it passes or the bound expires.
func eventually(t *testing.T, bound time.Duration, what string, check func() error) {
	t.Helper()
	eventuallyEvery(t, bound, 20*time.Millisecond, what, check)
}

// eventuallyEvery is eventually with a chosen polling interval.
func eventuallyEvery(t *testing.T, bound, every time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, bound, err)
		}
		time.Sleep(every)
	}
}

func keyOn(p *proc, id string) (keyView, error) {
	var k keyView
	code, err := call(p, "GET", "/v1/server/keys/"+id, nil, &k)
	if err == nil && code != 200 {
		err = fmt.Errorf("status %d", code)
	}
	return k, err
}

func TestReplicatedKeysAcrossProcesses(t *testing.T) {
	nodes := []meshNode{{"gov-a", "127.0.13.1", nil}, {"gov-b", "127.0.13.2", nil}, {"gov-c", "127.0.13.3", nil}}
	ps := []*proc{startMeshNode(t, nodes[0], "")}
	for _, n := range nodes[1:] {
		ps = append(ps, startMeshNode(t, n, "127.0.13.1:17946"))
	}
	waitMembers(t, ps, 3)
	digest := func(p *proc) digestView {
		var d digestView
		call(p, "GET", "/v1/server/state-digest", nil, &d)
		return d
	}
	// Wait for all three to be raft members with one leader.
	eventually(t, 20*time.Second, "one leader seen by all", func() error {
		l := digest(ps[0]).Leader
		for _, p := range ps {
			if d := digest(p); d.Leader == "" || d.Leader != l {
				return fmt.Errorf("leaders %q vs %q", d.Leader, l)
			}
		}
		return nil
	})

	// A key created through one node is on every node within a second.
	var k keyView
	eventually(t, 10*time.Second, "create through a follower", func() error {
		code, err := call(ps[2], "POST", "/v1/server/keys", map[string]any{"name": "svc", "app": "e2e", "allow": []string{"embeddings"}}, &k)
		if err == nil && code != 200 {
			err = fmt.Errorf("status %d", code)
		}
		return err
	})
	if k.ID == "" || len(k.Key) < 20 {
		t.Fatalf("created key %+v", k)
	}
	for _, p := range ps {
		eventually(t, time.Second, "key replicated to "+p.addr, func() error { _, err := keyOn(p, k.ID); return err })
	}
	// Revoke through another node; every node sees it revoked.
	if code, err := call(ps[1], "DELETE", "/v1/server/keys/"+k.ID, nil, nil); err != nil || code != 200 {
		t.Fatalf("revoke: %d %v", code, err)
	}
	for _, p := range ps {
		eventually(t, time.Second, "revoke replicated", func() error {
			kv, err := keyOn(p, k.ID)
			if err == nil && !kv.Revoked {
				err = fmt.Errorf("not revoked yet")
			}
			return err
		})
	}

	// SIGKILL the leader: survivors keep the keys, elect a leader, and
	// accept writes again.
	leader := digest(ps[0]).Leader
	var survivors []*proc
	for i, n := range nodes {
		if n.id == leader {
			ps[i].cmd.Process.Signal(syscall.SIGKILL)
			<-ps[i].exited
		} else {
			survivors = append(survivors, ps[i])
		}
	}
	if len(survivors) != 2 {
		t.Fatalf("leader %q is not one of the nodes", leader)
	}
	for _, p := range survivors {
		if _, err := keyOn(p, k.ID); err != nil {
			t.Fatalf("key gone after leader kill: %v", err)
		}
	}
	var k2 keyView
	eventually(t, 20*time.Second, "write after leader kill", func() error {
		code, err := call(survivors[0], "POST", "/v1/server/keys", map[string]any{"name": "after"}, &k2)
		if err == nil && code != 200 {
			err = fmt.Errorf("status %d", code)
		}
		return err
	})
	eventually(t, 2*time.Second, "survivors converge", func() error {
		a, b := digest(survivors[0]), digest(survivors[1])
		if a.Digest != b.Digest || a.Leader == leader || a.Leader == "" {
			return fmt.Errorf("digests %s/%s leader %q", a.Digest, b.Digest, a.Leader)
		}
		return nil
	})

	// A restarted node comes back from its data directory with the same state.
	p := survivors[1]
	before := digest(p)
	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.exited
	restarted := restartProc(t, p)
	eventually(t, 20*time.Second, "restarted node catches up", func() error {
		d := digest(restarted)
		if d.Digest != before.Digest && d.Index < before.Index {
			return fmt.Errorf("digest %s at %d, want %s", d.Digest, d.Index, before.Digest)
		}
		if _, err := keyOn(restarted, k2.ID); err != nil {
			return err
		}
		return nil
	})
}

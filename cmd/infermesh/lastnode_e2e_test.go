package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLastNodeStopsWithoutWaitingForQuorum: nodes that hold quota leases
// stop one after another; the last one, with no quorum left to return its
// leases to, exits promptly instead of retrying until --drain-timeout.
func TestLastNodeStopsWithoutWaitingForQuorum(t *testing.T) {
	t.Setenv("SERVICE_ADMIN_KEY", adminKey)
	ps := startKeyedMesh(t, "127.0.65")
	waitMembersKeyed(t, ps)
	k := createKey(t, ps[0], map[string]any{"name": "quota", "daily_quota": 1000})
	emb := map[string]any{"model": "tiny-bert:test-128", "input": "x"}
	eventually(t, 10*time.Second, "quota key served by every node", func() error {
		for _, p := range ps {
			if code, c := keyed(p, k, "POST", "/v1/embeddings", emb); code != 200 {
				return fmt.Errorf("%s: %d %s", p.id, code, c)
			}
		}
		return nil
	})
	for _, p := range ps[1:] {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s did not stop", p.id)
		}
	}
	last := ps[0]
	start := time.Now()
	last.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-last.exited:
	case <-time.After(40 * time.Second):
		t.Fatal("the last node did not stop")
	}
	t.Logf("last node stopped in %s; lease lines:\n%s", time.Since(start), grepLines(last.stderr.String(), "lease"))
	if took := time.Since(start); took > 12*time.Second {
		t.Fatalf("the last node took %s to stop (waiting for a quorum that is gone)", took.Round(time.Millisecond))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

package main

import (
	"bytes"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// raftCLI runs `infermesh raft ...` and returns its output.
func raftCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(binPath, append([]string{"raft"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// raftRoles parses `infermesh raft peers` into id → suffrage.
func raftRoles(t *testing.T, p *proc) (map[string]string, string) {
	t.Helper()
	out, err := raftCLI(t, "peers", "--node", "http://"+p.addr)
	if err != nil {
		return nil, out
	}
	roles := map[string]string{}
	for _, line := range strings.Split(out, "\n")[1:] {
		if f := strings.Fields(line); len(f) >= 3 && strings.HasPrefix(f[0], "raft-") {
			roles[f[0]] = f[2]
		}
	}
	return roles, out
}

func waitRoles(t *testing.T, p *proc, want map[string]string) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("raft roles %v on %s", want, p.id), func() error {
		got, out := raftRoles(t, p)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("raft peers:\n%s", out)
		}
		return nil
	})
}

func dataDirOf(p *proc) string {
	i := slices.Index(p.cmd.Args, "--data-dir")
	return p.cmd.Args[i+1]
}

func stopProc(t *testing.T, p *proc, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not exit", p.id)
	}
}

// A two-node mesh has one raft voter: losing the other node leaves it
// writable. When the voter itself is lost for good, the survivor is made
// writable again with `infermesh raft recover`.
func TestEndToEndTwoNodeRaftAvailability(t *testing.T) {
	args := func(ip string) []string {
		return []string{"--listen", ip + ":0", "--gossip-listen", ip + ":17946", "--rpc-listen", ip + ":17947",
			"--cluster-secret", meshSecret, "--fast-timers", "--drain-timeout", "10s"}
	}
	a := startNodeArgs(t, "raft-a", nil, args("127.0.42.1")...)
	b := startNodeArgs(t, "raft-b", nil, append(args("127.0.42.2"), "--join", "127.0.42.1:17946")...)
	waitMembers(t, []*proc{a, b}, 2)
	waitRoles(t, a, map[string]string{"raft-a": "voter", "raft-b": "nonvoter"})
	if code, err := createKeyOn(b, "through-the-non-voter"); err != nil || code != 200 {
		t.Fatalf("write through the non-voter: %d %v", code, err)
	}

	// Losing the non-voter changes nothing for writes; the operator
	// removes it without waiting for the reap.
	stopProc(t, b, syscall.SIGKILL)
	if code, err := createKeyOn(a, "after-losing-b"); err != nil || code != 200 {
		t.Fatalf("write after losing the non-voter: %d %v", code, err)
	}
	// Removal sticks once the mesh has noticed the node is gone (until
	// then it is re-added as a live member).
	eventually(t, 30*time.Second, "the mesh to notice raft-b is gone", func() error {
		m, err := members(a)
		if err == nil && m["raft-b"] == "ready" {
			err = fmt.Errorf("members %v", m)
		}
		return err
	})
	if out, err := raftCLI(t, "remove-peer", "--node", "http://"+a.addr, "raft-b"); err != nil {
		t.Fatalf("remove-peer: %v\n%s", err, out)
	}
	waitRoles(t, a, map[string]string{"raft-a": "voter"})
	if out, err := raftCLI(t, "remove-peer", "--node", "http://"+a.addr, "raft-nobody"); err == nil || !strings.Contains(out, "404") {
		t.Fatalf("remove an unknown peer: %v\n%s", err, out)
	}

	// It comes back and is added again as the non-voter.
	b = restartProc(t, b)
	waitRoles(t, a, map[string]string{"raft-a": "voter", "raft-b": "nonvoter"})

	// The returning non-voter catches up on what was written while it was
	// away (recovery below keeps only what the survivor's log holds).
	eventually(t, 30*time.Second, "raft-b to replicate the key written while it was down", func() error {
		var keys struct {
			Data []struct{ Name string } `json:"data"`
		}
		if _, err := call(b, "GET", "/v1/server/keys", nil, &keys); err != nil {
			return err
		}
		for _, k := range keys.Data {
			if k.Name == "after-losing-b" {
				return nil
			}
		}
		return fmt.Errorf("raft-b has %d keys, not yet after-losing-b", len(keys.Data))
	})

	// Now the voter dies for good: the survivor cannot write…
	stopProc(t, a, syscall.SIGKILL)
	eventually(t, 30*time.Second, "the survivor to refuse writes", func() error {
		code, err := createKeyOn(b, "no-majority")
		if err != nil || code != 503 {
			return fmt.Errorf("status %d, %v; want 503", code, err)
		}
		return nil
	})
	// A forwarded write fails (503) as soon as the leader's port is
	// closed; the survivor's raft forgets the leader only when its
	// heartbeats stop for the election timeout, so wait for that.
	eventually(t, 30*time.Second, "the survivor's raft to know no leader", func() error {
		out, _ := raftCLI(t, "peers", "--node", "http://"+b.addr)
		if !strings.Contains(out, "knows no leader") {
			return fmt.Errorf("raft peers:\n%s", out)
		}
		return nil
	})
	// …until it is stopped, recovered and started again.
	stopProc(t, b, syscall.SIGTERM)
	dir := dataDirOf(b)
	if out, err := raftCLI(t, "recover", "--data-dir", dir, "--node-id", "raft-b"); err == nil || !strings.Contains(out, "--yes") {
		t.Fatalf("recover without --yes: %v\n%s", err, out)
	}
	if out, err := raftCLI(t, "recover", "--data-dir", dir, "--node-id", "raft-x", "--yes"); err == nil || !strings.Contains(out, "not in the raft configuration") {
		t.Fatalf("recover with a wrong id: %v\n%s", err, out)
	}
	if out, err := raftCLI(t, "recover", "--data-dir", dir, "--node-id", "raft-b", "--yes"); err != nil || !strings.Contains(out, "raft-b is now the only voter") {
		t.Fatalf("recover: %v\n%s", err, out)
	}
	b = restartProc(t, b)
	waitRoles(t, b, map[string]string{"raft-b": "voter"})
	eventually(t, 30*time.Second, "writes after recovery", func() error {
		code, err := createKeyOn(b, "after-recovery")
		if err != nil || code != 200 {
			return fmt.Errorf("status %d, %v", code, err)
		}
		return nil
	})
	var keys struct {
		Data []struct{ Name string } `json:"data"`
	}
	if _, err := call(b, "GET", "/v1/server/keys", nil, &keys); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, k := range keys.Data {
		names = append(names, k.Name)
	}
	for _, want := range []string{"through-the-non-voter", "after-losing-b", "after-recovery"} {
		if !slices.Contains(names, want) {
			t.Fatalf("keys after recovery: %v, missing %s", names, want)
		}
	}
}

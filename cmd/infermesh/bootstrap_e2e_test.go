package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// bootstrapArgs are the serve flags of one node of a simultaneous start:
// its own loopback address, fixed ports, --join naming every other node
// and --bootstrap-expect.
func bootstrapArgs(ip string, others []string, expect int) []string {
	args := []string{"--listen", ip + ":0", "--gossip-listen", ip + ":17946", "--rpc-listen", ip + ":17947",
		"--cluster-secret", meshSecret, "--fast-timers", "--drain-timeout", "20s",
		"--bootstrap-expect", fmt.Sprint(expect)}
	var join []string
	for _, o := range others {
		join = append(join, o+":17946")
	}
	return append(args, "--join", strings.Join(join, ","))
}

// leaders counts the nodes whose leader gauge says they lead.
func leaders(ps []*proc) (int, error) {
	n := 0
	for _, p := range ps {
		v, err := metricValue(p, "infermesh_consensus_leader")
		if err != nil {
			return 0, err
		}
		n += int(v)
	}
	return n, nil
}

func waitReady(t *testing.T, ps ...*proc) {
	t.Helper()
	for _, p := range ps {
		eventually(t, 60*time.Second, p.id+" ready", func() error {
			if code, st, reason := readyState(p); code != http.StatusOK {
				return fmt.Errorf("readyz %d %s %s", code, st, reason)
			}
			return nil
		})
	}
}

// Three processes started together, each joining the other two with
// --bootstrap-expect 3, elect exactly one leader with three voters and take
// writes through every node; then a rolling restart (SIGTERM, restart,
// wait ready, one node at a time) under a steady request loop loses no
// request.
func TestBootstrapExpectThreeProcesses(t *testing.T) {
	ips := []string{"127.0.45.1", "127.0.45.2", "127.0.45.3"}
	ids := []string{"raft-x1", "raft-x2", "raft-x3"}
	var ps []*proc
	for i, ip := range ips {
		var others []string
		for _, o := range ips {
			if o != ip {
				others = append(others, o)
			}
		}
		ps = append(ps, startNodeArgs(t, ids[i], []string{"tiny-bert"}, bootstrapArgs(ip, others, 3)...))
	}
	waitMembers(t, ps, 3)
	waitReady(t, ps...)
	waitRoles(t, ps[2], map[string]string{"raft-x1": "voter", "raft-x2": "voter", "raft-x3": "voter"})
	eventually(t, 10*time.Second, "one leader", func() error {
		if n, err := leaders(ps); err != nil || n != 1 {
			return fmt.Errorf("%d leaders (%v)", n, err)
		}
		return nil
	})
	for _, p := range ps {
		if code, err := createKeyOn(p, "through-"+p.id); err != nil || code != http.StatusOK {
			t.Fatalf("create a key through %s: %d %v", p.id, code, err)
		}
		if resp, err := http.Get(p.url("/livez")); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("livez on %s: %v %v", p.id, resp, err)
		} else {
			resp.Body.Close()
		}
	}
	// Exactly one node bootstrapped.
	boots := 0
	for _, p := range ps {
		boots += strings.Count(p.stderr.String(), "bootstrap-expect: bootstrapping raft")
	}
	if boots != 1 {
		t.Fatalf("%d nodes bootstrapped", boots)
	}

	// The request loop sends embeddings and key writes to the nodes that
	// are up; the restarter takes the lock to take a node out of it, so
	// no request is in flight to a node when it gets SIGTERM (a load
	// balancer following /readyz does the same).
	var mu sync.RWMutex
	down := -1
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			mu.RLock()
			k := i % len(ps)
			if k == down {
				k = (k + 1) % len(ps)
			}
			p := ps[k]
			var err error
			if i%4 == 3 {
				var code int
				if code, err = createKeyOn(p, fmt.Sprintf("loop-%d", i)); err == nil && code != http.StatusOK {
					err = fmt.Errorf("key write status %d", code)
				}
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err = embedVia(ctx, p, fmt.Sprintf("rolling restart %d", i))
				cancel()
			}
			mu.RUnlock()
			sent.Add(1)
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, fmt.Sprintf("%s: %v", p.id, err))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	for i := range ps {
		mu.Lock()
		down = i
		mu.Unlock()
		stopProc(t, ps[i], syscall.SIGTERM)
		ps[i] = restartProc(t, ps[i])
		waitReady(t, ps[i])
		waitMembers(t, ps, 3)
		mu.Lock()
		down = -1
		mu.Unlock()
	}
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || sent.Load() == 0 {
		t.Fatalf("rolling restart: %d of %d requests failed; first: %v", failed.Load(), sent.Load(), firstErr.Load())
	}
	t.Logf("rolling restart: %d requests, none failed", sent.Load())
	waitRoles(t, ps[0], map[string]string{"raft-x1": "voter", "raft-x2": "voter", "raft-x3": "voter"})
	if n, err := leaders(ps); err != nil || n != 1 {
		t.Fatalf("after the restarts: %d leaders (%v)", n, err)
	}
	for _, p := range ps {
		if strings.Count(p.stderr.String(), "bootstrap-expect: bootstrapping raft") != 0 {
			t.Fatalf("%s bootstrapped again after its restart", p.id)
		}
	}
	// The build is on the metrics page.
	resp, err := http.Get(ps[0].url("/v1/server/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `infermesh_build_info{goversion="go`) {
		t.Fatalf("no infermesh_build_info on the metrics page")
	}
}

// Two nodes that each join the other elect a leader with
// --bootstrap-expect 2 (without it neither would ever bootstrap).
func TestBootstrapExpectTwoProcesses(t *testing.T) {
	a := startNodeArgs(t, "raft-y1", nil, bootstrapArgs("127.0.45.11", []string{"127.0.45.12"}, 2)...)
	// Alone, it waits: not ready, but live.
	if code, st, _ := readyState(a); code != http.StatusServiceUnavailable {
		t.Fatalf("readyz of a node waiting for its peer: %d %s", code, st)
	}
	if resp, err := http.Get(a.url("/livez")); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("livez of a node waiting for its peer: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	b := startNodeArgs(t, "raft-y2", nil, bootstrapArgs("127.0.45.12", []string{"127.0.45.11"}, 2)...)
	waitMembers(t, []*proc{a, b}, 2)
	waitReady(t, a, b)
	waitRoles(t, b, map[string]string{"raft-y1": "voter", "raft-y2": "nonvoter"})
	for _, p := range []*proc{a, b} {
		if code, err := createKeyOn(p, "two-"+p.id); err != nil || code != http.StatusOK {
			t.Fatalf("create a key through %s: %d %v", p.id, code, err)
		}
	}
}

// --bootstrap-expect parses from the flag and SERVICE_BOOTSTRAP_EXPECT, and
// more than one node without --join is refused.
func TestBootstrapExpectFlag(t *testing.T) {
	cfg, err := parseServe(t, "--bootstrap-expect", "3", "--join", "a:7946,b:7946", "--cluster-secret", "s")
	if err != nil || cfg.BootstrapExpect != 3 {
		t.Fatalf("flag: %d %v", cfg.BootstrapExpect, err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("valid configuration refused: %v", err)
	}
	t.Setenv("SERVICE_BOOTSTRAP_EXPECT", "2")
	cfg, err = parseServe(t)
	if err != nil || cfg.BootstrapExpect != 2 {
		t.Fatalf("variable: %d %v", cfg.BootstrapExpect, err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "bootstrap expect") {
		t.Fatalf("--bootstrap-expect 2 without --join: %v", err)
	}
}

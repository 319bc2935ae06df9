package main

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// Work limits and memory given back, end to end on the real binary with
// the generated diffusion pipeline. Loopback prefix 127.0.93.x is this
// file's.

// residentOf is the resident set size of p's process, in bytes.
func residentOf(t *testing.T, p *proc) int64 {
	t.Helper()
	n, err := residentOfPid(p.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// residentOfPid reads VmRSS from /proc/<pid>/status.
func residentOfPid(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS in /proc/<pid>/status")
}

// TestImageWorkLimitAndMemoryBack: the request (4096x4096, n 4,
// 200 steps) is refused up front with a 400 naming the limit; the
// heaviest pictures the default limits allow (2048x2048, and 4 x
// 1024x1024) are served, and once the node has been idle a moment its
// resident size is back within 2x of its idle figure (plus 32 MB of
// slack), while the jobs had raised it by far more than that. The target,
// 1.5x, and the exact figures for a burst with 60 s idle are measured by
// scripts/imagerss.py and given in docs/models.md ("Model memory").
func TestImageWorkLimitAndMemoryBack(t *testing.T) {
	p := startOpsNode(t, "work-a", "127.0.93.1", []string{onnxtest.AssetDir(t, "tiny-sd", "manifest.json")}, "")
	waitMembers(t, []*proc{p}, 1)
	r := opsPost(t, p, map[string]any{"model": opsSD, "prompt": "x", "size": "4096x4096", "n": 4, "num_inference_steps": 200})
	if r.status != 400 || r.code != "work_limit_exceeded" || r.param != "size" || !strings.Contains(r.msg, "--image-max-pixels") {
		t.Fatalf("the issue's request: %d %s on %s: %s", r.status, r.code, r.param, r.msg)
	}
	r = opsPost(t, p, map[string]any{"model": opsSD, "prompt": "x", "size": "2048x2048", "n": 4, "num_inference_steps": 200})
	if r.status != 400 || r.code != "work_limit_exceeded" || !strings.Contains(r.msg, "--image-max-work") {
		t.Fatalf("2048x2048 x 4 x 200 steps: %d %s: %s", r.status, r.code, r.msg)
	}
	opsPost(t, p, map[string]any{"model": opsSD, "prompt": "warm", "size": "64x64", "num_inference_steps": 1, "seed": 1}).ok(t, "warm-up", 1, 64, 64)
	time.Sleep(3 * time.Second) // the warm-up's own release
	idle := residentOf(t, p)
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				if n, err := residentOfPid(p.cmd.Process.Pid); err == nil {
					peak.Store(max(peak.Load(), n))
				}
			}
		}
	}()
	opsPost(t, p, map[string]any{"model": opsSD, "prompt": "big", "size": "2048x2048", "num_inference_steps": 4, "seed": 2}).ok(t, "2048x2048", 1, 2048, 2048)
	opsPost(t, p, map[string]any{"model": opsSD, "prompt": "four", "size": "1024x1024", "n": 4, "num_inference_steps": 4, "seed": 3}).ok(t, "4 x 1024x1024", 4, 1024, 1024)
	close(stop)
	<-sampled
	const mb = 1 << 20
	// 1.5x is the target (scripts/imagerss.py measured 1.36x after 60 s);
	// the test allows 2x so a busy machine's scheduling of the release
	// cannot fail it, and still catches the 5x held before the release.
	bound := idle*2 + 32*mb
	if grew := peak.Load() - idle; grew < 150*mb {
		t.Fatalf("the jobs raised the resident size by only %d MB (idle %d MB): the check proves nothing", grew/mb, idle/mb)
	}
	var now int64
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if now = residentOf(t, p); now <= bound {
			break
		}
	}
	t.Logf("resident: idle %d MB, peak %d MB, after the jobs %d MB", idle/mb, peak.Load()/mb, now/mb)
	if now > bound {
		t.Fatalf("resident %d MB a minute after the jobs, idle %d MB: want at most %d MB", now/mb, idle/mb, bound/mb)
	}
}

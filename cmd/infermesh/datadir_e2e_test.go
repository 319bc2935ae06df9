package main

import (
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A second process on a data dir a running node holds must exit by itself
// with a message naming the problem, not wait on the raft database lock.
func TestSecondProcessOnDataDirExits(t *testing.T) {
	first := startNode(t, "holder")
	data := ""
	for i, a := range first.cmd.Args {
		if a == "--data-dir" && i+1 < len(first.cmd.Args) {
			data = first.cmd.Args[i+1]
		}
	}
	if data == "" {
		t.Fatal("no --data-dir in the first node's command line")
	}
	// The context is only a hang guard: a process still running after it
	// is killed, and the test then fails on the missing message.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, binPath, "serve", "--data-dir", data, "--node-id", "second",
		"--listen", "127.0.0.1:0", "--gossip-listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0").CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("second process did not exit by itself:\n%s", out)
	}
	if err == nil {
		t.Fatalf("second process on a held data dir exited 0:\n%s", out)
	}
	if !strings.Contains(string(out), "is in use by another infermesh process") {
		t.Fatalf("second process did not say why it stopped:\n%s", out)
	}
	// The first node still serves.
	resp, err := http.Get(first.url("/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

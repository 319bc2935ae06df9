package main

import (
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestRestartedNodeNeverRefusesValidKey: a node restarted from its data dir
// answers a valid key with 200, or with a retryable 503 while its replica
// catches up, never with 401 (which would also count toward the caller's
// wrong-key block). The chaos suite found the 401s.
func TestRestartedNodeNeverRefusesValidKey(t *testing.T) {
	t.Setenv("SERVICE_ADMIN_KEY", adminKey)
	ps := startKeyedMesh(t, "127.0.15")
	eventuallyEvery(t, 30*time.Second, 2*time.Second, "admin key usable everywhere", func() error {
		for _, p := range ps {
			if code, c := keyed(p, adminKey, "GET", "/v1/server/keys", nil); code != 200 {
				return fmt.Errorf("%s: %d %s", p.id, code, c)
			}
		}
		return nil
	})
	k := createKey(t, ps[0], map[string]any{"name": "probe"})
	eventuallyEvery(t, 5*time.Second, 200*time.Millisecond, "key on the third node", func() error {
		if code, _ := keyed(ps[2], k, "GET", "/v1/models", nil); code != 200 {
			return fmt.Errorf("%d", code)
		}
		return nil
	})
	ps[2].cmd.Process.Signal(syscall.SIGKILL)
	<-ps[2].exited
	ps[2] = restartProc(t, ps[2])
	_, port, _ := net.SplitHostPort(ps[2].addr)
	ps[2].addr = net.JoinHostPort("127.0.15.3", port)
	ok := 0
	for i := 0; i < 40 && ok < 5; i++ {
		code, c := keyed(ps[2], k, "GET", "/v1/models", nil)
		switch code {
		case 200:
			ok++
		case 503:
		default:
			t.Fatalf("probe %d after restart: %d %s", i, code, c)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ok < 5 {
		t.Fatal("the restarted node never accepted the key")
	}
}

package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Behind a trusted proxy (loopback here) the client address is the
// right-most X-Forwarded-For entry the proxy appended: an attacker who
// rotates or spoofs the entries it writes itself neither escapes the
// wrong-key throttle nor gets a victim's address blocked.
func TestForwardedForCannotEvadeOrFrameTheThrottle(t *testing.T) {
	p := startNodeArgs(t, "xff", nil, "--listen", "127.0.0.1:0", "--gossip-listen", "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0",
		"--trust-proxy")
	keyFile := filepath.Join(dataDirOf(p), "admin-key")
	var admin string
	eventually(t, 30e9, "the bootstrap admin key file", func() error {
		b, err := os.ReadFile(keyFile)
		admin = strings.TrimSpace(string(b))
		if err == nil && admin == "" {
			err = fmt.Errorf("empty")
		}
		return err
	})
	get := func(key, xff string) int {
		req, _ := http.NewRequest("GET", p.url("/v1/models"), nil)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("X-Forwarded-For", xff)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	eventually(t, 30e9, "the node to be ready and the admin key to work", func() error {
		resp, err := http.Get(p.url("/readyz"))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		if c := get(admin, "198.51.100.7"); c != 200 {
			return fmt.Errorf("status %d", c)
		}
		return nil
	})
	// The attacker (real address 203.0.113.66, appended by the proxy)
	// writes a fresh left-hand entry on every try, and the victim's address.
	codes := map[int]int{}
	for i := 0; i < 30; i++ {
		xff := fmt.Sprintf("10.9.%d.%d, 198.51.100.7, 203.0.113.66", i/250, i%250)
		codes[get("sk-wrong-key-"+fmt.Sprint(i), xff)]++
	}
	t.Logf("30 wrong keys with rotating spoofed entries: %v", codes)
	if codes[http.StatusTooManyRequests] == 0 {
		t.Fatalf("rotating X-Forwarded-For evaded the throttle: %v", codes)
	}
	// The victim, whose address the attacker wrote, is not blocked.
	if c := get(admin, "198.51.100.7"); c != 200 {
		t.Fatalf("the victim's valid key got %d after the attacker spoofed its address", c)
	}
	// The attacker is, whatever it writes.
	if c := get(admin, "198.51.100.7, 203.0.113.66"); c != http.StatusTooManyRequests {
		t.Fatalf("the attacker's address got %d, want 429", c)
	}
}

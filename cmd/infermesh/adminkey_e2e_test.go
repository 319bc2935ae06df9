package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// argAfter returns the value that follows flag in a process's arguments.
func argAfter(p *proc, flag string) string {
	for i, a := range p.cmd.Args {
		if a == flag && i+1 < len(p.cmd.Args) {
			return p.cmd.Args[i+1]
		}
	}
	return ""
}

// TestAdminKeyFileAndEnvKeyOnBootstrappedDataDir: the bootstrap admin key
// goes to <data-dir>/admin-key (0600), never to the log; on that data dir
// SERVICE_ADMIN_KEY is then stored under its own id, and a new value
// replaces the old one.
func TestAdminKeyFileAndEnvKeyOnBootstrappedDataDir(t *testing.T) {
	t.Setenv("SERVICE_ADMIN_KEY", "")
	const ip = "127.0.62.1"
	p := startNodeArgs(t, "adminkey", nil, "--listen", "0.0.0.0:0", "--advertise", ip, "--gossip-listen", ip+":17946",
		"--rpc-listen", ip+":17947", "--cluster-secret", meshSecret, "--fast-timers")
	fix := func(p *proc) *proc {
		_, port, _ := net.SplitHostPort(p.addr)
		p.addr = net.JoinHostPort(ip, port)
		return p
	}
	fix(p)
	file := filepath.Join(argAfter(p, "--data-dir"), "admin-key")
	var boot string
	eventually(t, 30*time.Second, "admin-key file", func() error {
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		boot = strings.TrimSpace(string(b))
		return nil
	})
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("admin-key file mode: %v %v", st.Mode(), err)
	}
	if !strings.HasPrefix(boot, "im-") {
		t.Fatalf("admin-key file holds %q", boot)
	}
	works := func(p *proc, key string, want int) func() error {
		return func() error {
			if code, c := keyed(p, key, "GET", "/v1/server/keys", nil); code != want {
				return fmt.Errorf("%d %s, want %d", code, c, want)
			}
			return nil
		}
	}
	eventually(t, 10*time.Second, "bootstrap key works", works(p, boot, 200))
	if strings.Contains(p.stderr.String(), boot) {
		t.Fatal("the bootstrap admin key appears in the log")
	}
	if !strings.Contains(p.stderr.String(), file) {
		t.Error("the log does not name the admin-key file")
	}

	restart := func(env string) *proc {
		p.cmd.Process.Signal(syscall.SIGTERM)
		<-p.exited
		t.Setenv("SERVICE_ADMIN_KEY", env)
		return fix(restartProc(t, p))
	}
	const first, second = "im-first-env-admin-key-value-0123456789", "im-second-env-admin-key-value-987654321"
	p = restart(first)
	eventually(t, 20*time.Second, "env key works on a bootstrapped data dir", works(p, first, 200))
	eventually(t, 5*time.Second, "bootstrap key still works", works(p, boot, 200))
	p = restart(second)
	eventually(t, 20*time.Second, "new env key works", works(p, second, 200))
	eventually(t, 5*time.Second, "old env key refused", works(p, first, 401))
	if strings.Contains(p.stderr.String(), "could not store") {
		t.Fatalf("admin key warning in the log:\n%s", p.stderr)
	}
}

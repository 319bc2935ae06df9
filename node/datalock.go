package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// dataLock is an exclusive advisory lock on a data dir, held for the
// node's lifetime, so a second process on the same folder fails at once
// with a clear message instead of waiting forever on the raft database.
type dataLock struct {
	f *os.File
}

// lockDataDir creates dir if needed and takes <dir>/LOCK without waiting.
// The lock file holds the owner's pid for the error message; the kernel
// drops the lock when the process dies, so a stale file never blocks.
func lockDataDir(dir string) (*dataLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, "LOCK")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		owner := ""
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
				owner = fmt.Sprintf(" (pid %d)", pid)
			}
		}
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data dir %s is in use by another infermesh process%s; stop it or give this node its own --data-dir", dir, owner)
		}
		return nil, fmt.Errorf("data dir lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dataLock{f: f}, nil
}

// release drops the lock (closing the file releases the flock).
func (l *dataLock) release() {
	if l != nil && l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

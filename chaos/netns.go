package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// EnvNamespace is set (to a NamespaceMode) in a process that Reexec started
// inside a private network namespace. Nodes inherit the namespace.
const EnvNamespace = "INFERMESH_CHAOS_NETNS"

// NamespaceMode says how the private network namespace was made.
type NamespaceMode string

const (
	// ModeRoot is CLONE_NEWNET made by root: iptables works, partitions run.
	ModeRoot NamespaceMode = "root"
	// ModeUser is CLONE_NEWUSER|CLONE_NEWNET made by an ordinary user:
	// processes and signals work, partitions are skipped.
	ModeUser NamespaceMode = "user"
)

// CurrentNamespace reports the mode this process was re-executed with, and
// false when it is not running inside a namespace made by Reexec.
func CurrentNamespace() (NamespaceMode, bool) {
	v := os.Getenv(EnvNamespace)
	switch NamespaceMode(v) {
	case ModeRoot, ModeUser:
		return NamespaceMode(v), true
	}
	return "", false
}

// ReexecResult is what the re-executed child left behind.
type ReexecResult struct {
	// ExitCode is the child's exit status (-1 when killed by a signal).
	ExitCode int
	// Mode is the namespace mode the child ran in.
	Mode NamespaceMode
	// NetnsID is the namespace's identity ("net:[inode]"), used by the
	// hygiene check to prove that nothing is left inside it.
	NetnsID string
}

// Reexec runs this executable again with args inside a new network namespace
// and waits for it. Root gets a plain network namespace; other users get a
// user namespace too (no partitions there). The child is killed if this
// process dies (Pdeathsig) or ctx ends.
func Reexec(ctx context.Context, args []string, stdout, stderr io.Writer) (ReexecResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return ReexecResult{}, fmt.Errorf("find own executable: %w", err)
	}
	mode, attr := namespaceAttr()
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), EnvNamespace+"="+string(mode))
	cmd.Stdout, cmd.Stderr, cmd.Stdin = stdout, stderr, nil
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		return ReexecResult{Mode: mode}, fmt.Errorf("start %s in a new network namespace (%s mode): %w", exe, mode, err)
	}
	res := ReexecResult{Mode: mode}
	res.NetnsID, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		// Ask the child to clean up (stop its nodes, flush its rules); kill
		// the whole group if it does not finish in time.
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			err = <-done
		}
	}
	res.ExitCode = cmd.ProcessState.ExitCode()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return res, err
	}
	return res, nil
}

// namespaceAttr is how Reexec starts its child: a new network namespace,
// plus a user namespace when not root.
func namespaceAttr() (NamespaceMode, *syscall.SysProcAttr) {
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if os.Geteuid() == 0 {
		return ModeRoot, attr
	}
	attr.Cloneflags |= syscall.CLONE_NEWUSER
	attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
	attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
	attr.GidMappingsEnableSetgroups = false
	return ModeUser, attr
}

// Namespace is the private network namespace this process runs in.
type Namespace struct {
	// Mode is how it was made.
	Mode NamespaceMode
	// ID is its identity ("net:[inode]").
	ID string
	// CanPartition is true when iptables works here (root, binary present,
	// raw and nat tables usable).
	CanPartition bool
	// NoPartitionWhy says why CanPartition is false.
	NoPartitionWhy string
}

// SetupNamespace checks that this process runs in a fresh namespace made by
// Reexec (only the loopback interface, no firewall rules), brings lo up and
// finds out whether partitions can be made.
func SetupNamespace(ctx context.Context) (*Namespace, error) {
	mode, ok := CurrentNamespace()
	if !ok {
		return nil, errors.New("not inside a namespace made by the chaos harness (Reexec); refusing to touch the host network")
	}
	ns := &Namespace{Mode: mode}
	ns.ID, _ = os.Readlink("/proc/self/ns/net")
	links, err := runCmd(ctx, "ip", "-o", "link", "show")
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(links), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && strings.TrimSuffix(f[1], ":") != "lo" {
			return nil, fmt.Errorf("namespace is not fresh: it has interface %s", f[1])
		}
	}
	if _, err := runCmd(ctx, "ip", "link", "set", "lo", "up"); err != nil {
		return nil, fmt.Errorf("bring lo up: %w", err)
	}
	switch {
	case mode != ModeRoot:
		ns.NoPartitionWhy = "not root: iptables needs CAP_NET_ADMIN in the initial user namespace"
	default:
		if _, err := exec.LookPath("iptables"); err != nil {
			ns.NoPartitionWhy = "iptables is not installed (Debian package iptables)"
			break
		}
		fw := NewFirewall(nil)
		if rules, err := fw.Rules(ctx); err != nil {
			ns.NoPartitionWhy = "iptables does not work here: " + err.Error()
		} else if len(rules) > 0 {
			return nil, fmt.Errorf("namespace is not fresh: firewall rules present: %v", rules)
		} else {
			ns.CanPartition = true
		}
	}
	return ns, nil
}

// runCmd runs a short helper command (ip, iptables) with a time bound and
// returns its standard output; the error carries standard error.
func runCmd(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

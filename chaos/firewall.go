package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// ruleComment tags every rule the harness adds, so a leftover is easy to
// recognise in `iptables -S`; dropMark marks packets to drop on arrival.
const (
	ruleComment = "infermesh-chaos"
	dropMark    = "0x4ca05"
)

// Firewall makes partitions with iptables inside the harness's namespace.
//
// All nodes share one namespace and talk over 127.0.0.x. A process that does
// not bind its outgoing sockets gets source 127.0.0.1, which says nothing
// about which node sent a packet. So every node runs with its own group id
// and one nat rule per node (Tag) rewrites the source of its outgoing
// connections to the node's address. With sources fixed, "A cannot reach B"
// is two rules matching -s A -d B: one in raw PREROUTING (A's own connections,
// seen after the source rewrite) and one in raw OUTPUT (A's replies on
// connections B opened, seen before conntrack turns their destination back
// into 127.0.0.1). The raw table is used because filter OUTPUT runs after
// that reverse translation and would miss the replies.
type Firewall struct {
	log    *slog.Logger
	mu     sync.Mutex
	tags   [][]string
	blocks map[[2]netip.Addr]bool
}

// NewFirewall returns a firewall that logs to log (nil discards).
func NewFirewall(log *slog.Logger) *Firewall {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Firewall{log: log, blocks: map[[2]netip.Addr]bool{}}
}

func (f *Firewall) iptables(ctx context.Context, args ...string) error {
	_, err := runCmd(ctx, "iptables", append([]string{"-w", "5"}, args...)...)
	return err
}

// markDropSpec drops packets marked by a block on the receiving side.
func markDropSpec() []string {
	return []string{"PREROUTING", "-t", "raw", "-m", "mark", "--mark", dropMark,
		"-m", "comment", "--comment", ruleComment, "-j", "DROP"}
}

// Tag makes the outgoing connections of processes with group gid carry src
// as their source address. The first call also installs the rule that
// drops marked packets.
func (f *Firewall) Tag(ctx context.Context, gid int, src netip.Addr) error {
	f.mu.Lock()
	first := len(f.tags) == 0
	f.mu.Unlock()
	if first {
		if err := f.iptables(ctx, append([]string{"-A"}, markDropSpec()...)...); err != nil {
			return fmt.Errorf("install the marked-packet drop: %w", err)
		}
		f.mu.Lock()
		f.tags = append(f.tags, markDropSpec())
		f.mu.Unlock()
	}
	spec := []string{"POSTROUTING", "-t", "nat", "-o", "lo", "-m", "owner", "--gid-owner", strconv.Itoa(gid),
		"-m", "comment", "--comment", ruleComment, "-j", "SNAT", "--to-source", src.String()}
	if err := f.iptables(ctx, append([]string{"-A"}, spec...)...); err != nil {
		return fmt.Errorf("tag gid %d as %s: %w", gid, src, err)
	}
	f.mu.Lock()
	f.tags = append(f.tags, spec)
	f.mu.Unlock()
	return nil
}

func blockSpecs(from, to netip.Addr) [][]string {
	return [][]string{
		{"PREROUTING", "-t", "raw", "-s", from.String(), "-d", to.String(),
			"-m", "comment", "--comment", ruleComment, "-j", "DROP"},
		{"OUTPUT", "-t", "mangle", "-s", from.String(), "-d", to.String(),
			"-m", "comment", "--comment", ruleComment, "-j", "MARK", "--set-mark", dropMark},
	}
}

// Block drops every packet from one address to another (one direction).
func (f *Firewall) Block(ctx context.Context, from, to netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.blocks[[2]netip.Addr{from, to}] {
		return nil
	}
	for _, spec := range blockSpecs(from, to) {
		if err := f.iptables(ctx, append([]string{"-A"}, spec...)...); err != nil {
			return fmt.Errorf("block %s -> %s: %w", from, to, err)
		}
	}
	f.blocks[[2]netip.Addr{from, to}] = true
	f.log.Debug("firewall block", "from", from, "to", to)
	return nil
}

// Heal removes every block (tags stay).
func (f *Firewall) Heal(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for pair := range f.blocks {
		ok := true
		for _, spec := range blockSpecs(pair[0], pair[1]) {
			if err := f.iptables(ctx, append([]string{"-D"}, spec...)...); err != nil {
				errs = append(errs, err)
				ok = false
			}
		}
		if ok {
			delete(f.blocks, pair)
		}
	}
	return errors.Join(errs...)
}

// Blocked lists the blocked (from, to) pairs, sorted.
func (f *Firewall) Blocked() [][2]netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([][2]netip.Addr, 0, len(f.blocks))
	for p := range f.blocks {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b [2]netip.Addr) int {
		if c := a[0].Compare(b[0]); c != 0 {
			return c
		}
		return a[1].Compare(b[1])
	})
	return out
}

// Reset removes every rule this firewall added and then checks that the
// namespace has no rules at all.
func (f *Firewall) Reset(ctx context.Context) error {
	errs := []error{f.Heal(ctx)}
	f.mu.Lock()
	for _, spec := range f.tags {
		errs = append(errs, f.iptables(ctx, append([]string{"-D"}, spec...)...))
	}
	f.tags = nil
	f.mu.Unlock()
	if rules, err := f.Rules(ctx); err != nil {
		errs = append(errs, err)
	} else if len(rules) > 0 {
		errs = append(errs, fmt.Errorf("firewall rules left after reset: %s", strings.Join(rules, "; ")))
	}
	return errors.Join(errs...)
}

// Rules lists every rule and user chain in the filter, raw, nat and mangle
// tables (default policies are not rules).
func (f *Firewall) Rules(ctx context.Context) ([]string, error) {
	var out []string
	for _, table := range []string{"filter", "raw", "nat", "mangle"} {
		text, err := runCmd(ctx, "iptables", "-w", "5", "-t", table, "-S")
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "-A ") || strings.HasPrefix(line, "-N ") {
				out = append(out, table+": "+line)
			}
		}
	}
	return out, nil
}

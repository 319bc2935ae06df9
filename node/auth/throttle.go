package auth

import (
	"container/list"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// throttle counts wrong keys per client address and blocks an address that
// sent too many within a window. It remembers at most max addresses,
// forgetting the least recently seen first.
type throttle struct {
	maxFailures int
	window      time.Duration
	block       time.Duration
	max         int

	// blockedUntil is the latest end of any block (Unix nanoseconds), zero
	// once it has passed: then nobody is blocked and the hot path neither
	// locks nor reads the clock.
	blockedUntil atomic.Int64

	mu    sync.Mutex
	byKey map[string]*list.Element
	lru   list.List // of *failures, most recent at the front
}

type failures struct {
	key          string
	count        int
	windowStart  time.Time
	blockedUntil time.Time
}

func newThrottle(maxFailures int, window, block time.Duration, max int) *throttle {
	return &throttle{maxFailures: maxFailures, window: window, block: block, max: max, byKey: map[string]*list.Element{}}
}

// clientKey groups an address: IPv6 by its /64 (one host usually owns a
// whole /64), everything else as given.
func clientKey(addr string) string {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return addr
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// blocked returns how long addr stays blocked (zero when it is not). It
// reads the clock only while some block may be in force.
func (t *throttle) blocked(addr string, clock func() time.Time) time.Duration {
	until := t.blockedUntil.Load()
	if until == 0 {
		return 0
	}
	now := clock()
	if now.UnixNano() >= until {
		t.blockedUntil.CompareAndSwap(until, 0)
		return 0
	}
	key := clientKey(addr)
	t.mu.Lock()
	defer t.mu.Unlock()
	el := t.byKey[key]
	if el == nil {
		return 0
	}
	f := el.Value.(*failures)
	if now.Before(f.blockedUntil) {
		return f.blockedUntil.Sub(now)
	}
	return 0
}

// fail records a wrong key from addr and reports whether it is now blocked.
func (t *throttle) fail(addr string, now time.Time) bool {
	key := clientKey(addr)
	t.mu.Lock()
	defer t.mu.Unlock()
	var f *failures
	if el := t.byKey[key]; el != nil {
		t.lru.MoveToFront(el)
		f = el.Value.(*failures)
	} else {
		if t.lru.Len() >= t.max {
			oldest := t.lru.Back()
			t.lru.Remove(oldest)
			delete(t.byKey, oldest.Value.(*failures).key)
		}
		f = &failures{key: key, windowStart: now}
		t.byKey[key] = t.lru.PushFront(f)
	}
	if now.Sub(f.windowStart) >= t.window {
		f.count, f.windowStart = 0, now
	}
	f.count++
	if f.count < t.maxFailures {
		return false
	}
	f.count, f.windowStart = 0, now
	f.blockedUntil = now.Add(t.block)
	until := f.blockedUntil.UnixNano()
	for {
		cur := t.blockedUntil.Load()
		if cur >= until || t.blockedUntil.CompareAndSwap(cur, until) {
			break
		}
	}
	return true
}

// size is the number of addresses remembered.
func (t *throttle) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lru.Len()
}

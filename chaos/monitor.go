package chaos

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Observation is one poll of one node's view of the cluster.
type Observation struct {
	// Round numbers the polls; one round asks every running node once.
	Round int `json:"round"`
	// At is when the poll of this node finished, as an offset from the
	// scenario start.
	At time.Duration `json:"at_ns"`
	// Node is the id of the node polled.
	Node string `json:"node"`
	// Leader, Digest and Index come from the state digest (when served).
	Leader string `json:"leader,omitempty"`
	// Digest is the node's replicated-state digest.
	Digest string `json:"digest,omitempty"`
	// Index is the node's applied raft index.
	Index uint64 `json:"index,omitempty"`
	// Healthy lists the peers the node sees as routable (when members is
	// served); Seen lists every peer it lists.
	Healthy []string `json:"healthy,omitempty"`
	// Seen lists every peer in the node's membership view, healthy or not.
	Seen []string `json:"seen,omitempty"`
	// Err is the poll's first error ("" when every call succeeded).
	Err string `json:"err,omitempty"`
}

// Monitor polls every running node's state digest and membership view.
type Monitor struct {
	cl    *Cluster
	api   *API
	feat  Features
	since func() time.Duration
	every time.Duration

	mu    sync.Mutex
	obs   []Observation
	round int
	// A node that refused the admin key (it has not caught up with the
	// replicated key table yet) is left alone for a while, doubling up to
	// 16 s, so that the harness does not trip the wrong-key throttle.
	backoff map[string]time.Duration
	until   map[string]time.Time
}

// NewMonitor returns a monitor polling every interval.
func NewMonitor(cl *Cluster, api *API, feat Features, since func() time.Duration, every time.Duration) *Monitor {
	return &Monitor{cl: cl, api: api, feat: feat, since: since, every: every,
		backoff: map[string]time.Duration{}, until: map[string]time.Time{}}
}

// Run polls until ctx ends (at most one poll per node per interval, each
// bounded by the interval).
func (m *Monitor) Run(ctx context.Context) {
	if !m.feat.Digest && !m.feat.Members {
		return
	}
	t := time.NewTicker(m.every)
	defer t.Stop()
	for {
		m.Poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Poll asks every up node once, concurrently, and returns what it saw.
func (m *Monitor) Poll(ctx context.Context) []Observation {
	var ids []string
	m.mu.Lock()
	m.round++
	round := m.round
	for _, id := range m.cl.InState(StateUp, StateDraining) {
		if time.Now().After(m.until[id]) {
			ids = append(ids, id)
		}
	}
	m.mu.Unlock()
	out := make([]Observation, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = m.observe(ctx, id)
			out[i].Round = round
		}()
	}
	wg.Wait()
	m.mu.Lock()
	m.obs = append(m.obs, out...)
	m.mu.Unlock()
	return out
}

func (m *Monitor) observe(ctx context.Context, id string) Observation {
	ctx, cancel := context.WithTimeout(ctx, max(m.every, time.Second))
	defer cancel()
	base := m.cl.Node(id).BaseURL()
	o := Observation{Node: id}
	var errs []string
	refused := false
	note := func(err error) {
		errs = append(errs, err.Error())
		var se *StatusError
		if errors.As(err, &se) && se.AuthRefused() {
			refused = true
		}
	}
	if m.feat.Digest {
		if d, err := m.api.StateDigest(ctx, base); err != nil {
			note(err)
		} else {
			o.Leader, o.Digest, o.Index = d.Leader, d.Digest, d.AppliedIndex
		}
	}
	if m.feat.Members {
		if ms, err := m.api.Members(ctx, base); err != nil {
			note(err)
		} else {
			for _, mb := range ms {
				o.Seen = append(o.Seen, mb.ID)
				if mb.Healthy() {
					o.Healthy = append(o.Healthy, mb.ID)
				}
			}
			slices.Sort(o.Seen)
			slices.Sort(o.Healthy)
		}
	}
	if len(errs) > 0 {
		o.Err = errs[0]
	}
	m.mu.Lock()
	if refused {
		m.backoff[id] = min(max(2*m.backoff[id], time.Second), 16*time.Second)
		m.until[id] = time.Now().Add(m.backoff[id])
	} else {
		delete(m.backoff, id)
	}
	m.mu.Unlock()
	o.At = m.since()
	return o
}

// Observations returns everything seen so far, in time order.
func (m *Monitor) Observations() []Observation {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := slices.Clone(m.obs)
	slices.SortStableFunc(out, func(a, b Observation) int { return cmpDur(a.At, b.At) })
	return out
}

func cmpDur(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// leaderOf returns the leader most of the observations name (empty when
// none has a majority of them).
func leaderOf(obs []Observation) string {
	count := map[string]int{}
	n := 0
	for _, o := range obs {
		if o.Err == "" {
			n++
			if o.Leader != "" {
				count[o.Leader]++
			}
		}
	}
	for l, c := range count {
		if 2*c > n {
			return l
		}
	}
	return ""
}

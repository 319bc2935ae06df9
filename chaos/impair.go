package chaos

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// forever ends intervals that never closed.
const forever = time.Duration(math.MaxInt64 / 4)

// segment is a stretch of time in which a node was in one state.
type segment struct {
	from, to time.Duration
	state    NodeState
}

// interval is a stretch of impairment with its reason.
type interval struct {
	from, to time.Duration
	why      string
}

// nodeSegments turns the cluster's transitions into per-node state
// segments, offsets from t0.
func nodeSegments(res *Result) map[string][]segment {
	out := map[string][]segment{}
	open := map[string]*segment{}
	for _, id := range res.NodeIDs {
		out[id] = nil
		open[id] = &segment{from: 0, state: StateDown}
	}
	for _, tr := range res.Transitions {
		at := tr.At.Sub(res.T0)
		cur := open[tr.Node]
		if cur == nil {
			continue
		}
		if cur.state == tr.To {
			continue
		}
		cur.to = at
		out[tr.Node] = append(out[tr.Node], *cur)
		open[tr.Node] = &segment{from: at, state: tr.To}
	}
	for id, cur := range open {
		cur.to = forever
		out[id] = append(out[id], *cur)
	}
	return out
}

// stateDuring returns the states a node was in during [from, to].
func stateDuring(segs []segment, from, to time.Duration) []NodeState {
	var out []NodeState
	for _, s := range segs {
		if s.from <= to && s.to >= from && !slices.Contains(out, s.state) {
			out = append(out, s.state)
		}
	}
	return out
}

// Impairments says when a node could not be expected to see the cluster's
// latest state: while down, starting, draining or paused; on the small
// side of a partition or at either end of a one-way cut; and, for every
// node, while the cluster had no leader after losing one.
type Impairments struct {
	node map[string][]interval
	all  []interval
}

// BuildImpairments derives the impairment intervals of a scenario.
func BuildImpairments(res *Result) *Impairments {
	imp := &Impairments{node: map[string][]interval{}}
	for id, segs := range nodeSegments(res) {
		for _, s := range segs {
			if s.state != StateUp {
				imp.node[id] = append(imp.node[id], interval{s.from, s.to, string(s.state)})
			}
		}
	}
	healAt := func(after time.Duration) time.Duration {
		for _, e := range res.Events {
			if e.Kind == EvHeal && e.At >= after {
				return e.Done
			}
		}
		return forever
	}
	for _, e := range res.Events {
		if !e.Kind.isPartition() || len(e.Groups) != 2 {
			continue
		}
		end := healAt(e.At)
		var sides [][]string
		switch {
		case e.Kind == EvCut:
			sides = e.Groups
		case len(e.Groups[0]) < len(e.Groups[1]):
			sides = e.Groups[:1]
		case len(e.Groups[0]) > len(e.Groups[1]):
			sides = e.Groups[1:]
		default:
			sides = e.Groups
		}
		for _, side := range sides {
			for _, id := range side {
				imp.node[id] = append(imp.node[id], interval{e.At, end, string(e.Kind)})
			}
		}
	}
	imp.all = leaderlessWindows(res)
	return imp
}

// leaderlessWindows finds, for every fault that may have taken the leader
// away, the window until a different leader was seen. Without the state
// digest the leader is unknown, so every fault counts until it ends.
func leaderlessWindows(res *Result) []interval {
	var out []interval
	rounds := roundsOf(res.Observations)
	leaderBefore := func(at time.Duration) string {
		l := ""
		for _, r := range rounds {
			if r.at < at {
				if x := leaderOf(r.obs); x != "" {
					l = x
				}
			}
		}
		return l
	}
	for _, e := range res.Events {
		if !e.Kind.isFault() {
			continue
		}
		old := leaderBefore(e.At)
		if res.Features.Digest && old != "" && !slices.Contains(e.Nodes, old) {
			continue
		}
		end := faultEnd(res.Events, e)
		if res.Features.Digest {
			end = forever
			for _, r := range rounds {
				if r.at > e.At {
					if l := leaderOf(r.obs); l != "" && l != old {
						end = r.at
						break
					}
				}
			}
			// The old leader may simply keep (or win back) leadership once
			// the fault ends.
			end = min(end, faultEnd(res.Events, e))
		}
		out = append(out, interval{e.At, end, fmt.Sprintf("leader %q lost to %s", old, e.Kind)})
	}
	return out
}

type pollRound struct {
	at  time.Duration
	obs []Observation
}

func roundsOf(obs []Observation) []pollRound {
	idx := map[int]int{}
	var out []pollRound
	for _, o := range obs {
		i, ok := idx[o.Round]
		if !ok {
			i = len(out)
			idx[o.Round] = i
			out = append(out, pollRound{at: o.At})
		}
		out[i].obs = append(out[i].obs, o)
		out[i].at = max(out[i].at, o.At)
	}
	slices.SortFunc(out, func(a, b pollRound) int { return cmpDur(a.at, b.at) })
	return out
}

// faultEnd is when the recovery matching fault e finished: the restart of a
// killed or terminated node, the resume of a paused one, the heal of a
// partition; forever when it never came.
func faultEnd(events []Event, e Event) time.Duration {
	for _, x := range events {
		if x.At < e.At || x.Seq == e.Seq {
			continue
		}
		switch {
		case e.Kind.isPartition() && x.Kind == EvHeal:
			return x.Done
		case (e.Kind == EvKill || e.Kind == EvKillLeader || e.Kind == EvTerminate) && x.Kind == EvRestart && overlaps(x.Nodes, e.Nodes):
			return x.Done
		case e.Kind == EvPause && x.Kind == EvResume && overlaps(x.Nodes, e.Nodes):
			return x.Done
		}
	}
	return forever
}

func overlaps(a, b []string) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}

// Horizon returns the earliest moment whose state a read on node at s may
// still show: s - bound for a connected node; for a node impaired within
// bound of s, bound before its impairment began.
func (imp *Impairments) Horizon(node string, s, bound time.Duration) time.Duration {
	h := s - bound
	for _, list := range [][]interval{imp.node[node], imp.all} {
		for _, iv := range list {
			if iv.from <= s && iv.to >= s-bound {
				h = min(h, iv.from-bound)
			}
		}
	}
	return h
}

// Classify sets each record's class: ok, shed (503 with Retry-After),
// limited (429 with Retry-After on the quota key or a probe), entry down or
// paused while the request ran, a response cut after its head because the
// serving node (another than the entry) went down or was paused, or
// unexpected.
func Classify(res *Result) {
	segs := nodeSegments(res)
	for _, r := range res.Records {
		r.Class, r.Why = classify(r, segs)
	}
}

func classify(r *Record, segs map[string][]segment) (Class, string) {
	if r.Err == "" && (r.OK() || (r.Kind == OpKeyProbe && r.Status == 401)) {
		return ClassOK, ""
	}
	states := stateDuring(segs[r.Entry], r.Start, r.End)
	// A forwarded response whose head (2xx) reached the client and whose
	// body then broke, while its serving node was killed or paused: bytes
	// were already out, so no other node could take over (failover is only
	// before the first byte). A break with the backend healthy, or a
	// failure before the head, stays unexpected.
	cut := r.OK() && r.Err != "" && r.Backend != "" && r.Backend != r.Entry
	var backend []NodeState
	if cut {
		backend = stateDuring(segs[r.Backend], r.Start, r.End)
	}
	switch {
	case r.Status == 503 && r.RetryAfter:
		return ClassShed, "503 " + r.Code + " with Retry-After"
	case r.Status == 429 && r.RetryAfter && (r.Kind == OpQuota || r.Kind == OpKeyProbe):
		return ClassLimited, "429 " + r.Code + " with Retry-After"
	case slices.Contains(states, StateDown) || slices.Contains(states, StateStarting):
		return ClassEntryDown, "entry " + r.Entry + " went down during the request"
	case slices.Contains(states, StateStopped):
		return ClassEntryPaused, "entry " + r.Entry + " was paused during the request"
	case r.Status == 0 && slices.Contains(states, StateDraining):
		return ClassEntryDown, "entry " + r.Entry + " was draining and closed the connection"
	case cut && (slices.Contains(backend, StateDown) || slices.Contains(backend, StateStarting)):
		return ClassBackendCut, "backend " + r.Backend + " went down after the response began"
	case cut && slices.Contains(backend, StateStopped):
		return ClassBackendCut, "backend " + r.Backend + " was paused after the response began"
	}
	why := fmt.Sprintf("status %d", r.Status)
	if r.Code != "" {
		why += " " + r.Code
	}
	if r.Status == 503 || r.Status == 429 {
		why += " without Retry-After"
	}
	if r.Msg != "" {
		why += ": " + r.Msg
	}
	if r.Err != "" {
		why = r.Err
		if r.Timeout {
			why = "timeout: " + why
		}
	}
	return ClassUnexpected, why
}

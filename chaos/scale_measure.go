package chaos

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// procSample is one reading of a process's CPU time and memory from /proc.
type procSample struct {
	cpu time.Duration // user + system
	rss int64         // bytes
}

// clockTick is the kernel's USER_HZ, which /proc/<pid>/stat counts in on
// Linux (100 on every architecture Go supports there).
const clockTick = 10 * time.Millisecond

// readProc reads /proc/<pid>/stat and /proc/<pid>/status.
func readProc(pid int) (procSample, error) {
	var s procSample
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// The command name may hold spaces; fields count from after its ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return s, fmt.Errorf("pid %d: bad stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return s, fmt.Errorf("pid %d: short stat", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64) // field 14 of stat
	st, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	s.cpu = time.Duration(ut+st) * clockTick
	st2, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	sc := bufio.NewScanner(bytes.NewReader(st2))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			s.rss = kb << 10
		}
	}
	return s, nil
}

// promSample holds the series of one /v1/server/metrics answer the scale
// harness reads, keyed by name and labels as exposed.
type promSample map[string]float64

// scaleSeries are the series the harness keeps.
func scaleSeries() []string {
	return []string{
		"infermesh_mesh_gossip_bytes_total",
		"infermesh_consensus_raft_bytes_total",
		"infermesh_consensus_leader",
		"infermesh_consensus_apply_seconds_sum",
		"infermesh_consensus_apply_seconds_count",
		"infermesh_mesh_records_received_total",
	}
}

// parseProm keeps the wanted series of a Prometheus text exposition.
func parseProm(body []byte) promSample {
	out := promSample{}
	want := scaleSeries()
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		key := line[:sp]
		name := key
		if i := strings.IndexByte(key, '{'); i >= 0 {
			name = key[:i]
		}
		if !slices.Contains(want, name) {
			continue
		}
		if v, err := strconv.ParseFloat(line[sp+1:], 64); err == nil {
			out[key] = v
		}
	}
	return out
}

// sum adds every series of name whose labels contain all of labels
// (each as `k="v"`).
func (p promSample) sum(name string, labels ...string) float64 {
	var t float64
	for k, v := range p {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(k, l) {
				ok = false
				break
			}
		}
		if ok {
			t += v
		}
	}
	return t
}

// nodeSample is one node's metrics and process reading at one moment.
type nodeSample struct {
	at   time.Time
	prom promSample
	proc procSample
	ok   bool
}

// sampleAll reads metrics and /proc of every node that is up, up to
// conc at a time.
func (s *scaleRun) sampleAll(ctx context.Context, conc int) map[string]nodeSample {
	ids := s.cl.InState(StateUp)
	out := make(map[string]nodeSample, len(ids))
	var mu sync.Mutex
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ns := s.sample(ctx, id)
			mu.Lock()
			out[id] = ns
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func (s *scaleRun) sample(ctx context.Context, id string) nodeSample {
	ns := nodeSample{at: time.Now()}
	n := s.cl.Node(id)
	res, err := s.api.Do(ctx, http.MethodGet, n.BaseURL()+"/v1/server/metrics", "", nil)
	if err != nil || res.Status != http.StatusOK {
		return ns
	}
	ns.prom = parseProm(res.Body)
	if pid := s.cl.PID(id); pid > 0 {
		if p, err := readProc(pid); err == nil {
			ns.proc, ns.ok = p, true
		}
	}
	return ns
}

// Window is what changed over one measured interval.
type Window struct {
	// Name says what ran during the window (idle, traffic).
	Name string `json:"name"`
	// Seconds is the window's length.
	Seconds float64 `json:"seconds"`
	// Nodes is how many nodes were measured at both ends.
	Nodes int `json:"nodes"`
	// GossipInBps and GossipOutBps summarise bytes per second per node.
	GossipInBps Stats `json:"gossip_in_bytes_per_s"`
	// GossipOutBps is the gossip bytes sent per second per node.
	GossipOutBps Stats `json:"gossip_out_bytes_per_s"`
	// RecordsPerSec is the gossip records received per second per node
	// (accepted and stale).
	RecordsPerSec Stats `json:"records_received_per_s"`
	// CPUPercent is each node's CPU (user + system) over the window, in
	// percent of one core.
	CPUPercent Stats `json:"cpu_percent"`
	// Leader is the raft leader at the end of the window.
	Leader string `json:"leader"`
	// LeaderCPUPercent is the leader's CPU over the window.
	LeaderCPUPercent float64 `json:"leader_cpu_percent"`
	// LeaderRaftOutBps and LeaderRaftInBps are the leader's raft transport
	// bytes per second.
	LeaderRaftOutBps float64 `json:"leader_raft_out_bytes_per_s"`
	// LeaderRaftInBps is the raft bytes the leader received per second.
	LeaderRaftInBps float64 `json:"leader_raft_in_bytes_per_s"`
	// FollowerRaftInBps is the raft bytes per second a follower received.
	FollowerRaftInBps Stats `json:"follower_raft_in_bytes_per_s"`
	// LeaderApplies and LeaderApplyMeanMs are the raft applies the leader
	// made itself (its own and followers' forwarded commands: usage
	// batches, leases, keys) and their mean time.
	LeaderApplies float64 `json:"leader_applies"`
	// LeaderApplyMeanMs is the leader's mean apply time.
	LeaderApplyMeanMs float64 `json:"leader_apply_mean_ms"`
	// ForwardedApplies and ForwardedApplyMeanMs are the followers' applies
	// sent to the leader (usage batches and lease commands under traffic).
	ForwardedApplies float64 `json:"forwarded_applies"`
	// ForwardedApplyMeanMs is their mean time, follower to applied result.
	ForwardedApplyMeanMs float64 `json:"forwarded_apply_mean_ms"`
	// RSSMiB is each node's resident memory at the window's end.
	RSSMiB Stats `json:"rss_mib"`
	// RSSMiBModelNodes is RSS of the nodes that hold models.
	RSSMiBModelNodes Stats `json:"rss_mib_model_nodes"`
}

// window turns two samples into a Window.
func (s *scaleRun) window(name string, a, b map[string]nodeSample) Window {
	w := Window{Name: name}
	var gin, gout, recs, cpu, rss, rssModel, fin []float64
	var secs float64
	for id, sb := range b {
		sa, ok := a[id]
		if !ok || !sa.ok || !sb.ok || sa.prom == nil || sb.prom == nil {
			continue
		}
		d := sb.at.Sub(sa.at).Seconds()
		if d <= 0 {
			continue
		}
		secs = max(secs, d)
		w.Nodes++
		rate := func(name string, labels ...string) float64 {
			return (sb.prom.sum(name, labels...) - sa.prom.sum(name, labels...)) / d
		}
		gin = append(gin, rate("infermesh_mesh_gossip_bytes_total", `direction="in"`))
		gout = append(gout, rate("infermesh_mesh_gossip_bytes_total", `direction="out"`))
		recs = append(recs, rate("infermesh_mesh_records_received_total"))
		c := 100 * (sb.proc.cpu - sa.proc.cpu).Seconds() / d
		cpu = append(cpu, c)
		r := float64(sb.proc.rss) / (1 << 20)
		rss = append(rss, r)
		if n := s.cl.Node(id); n != nil && n.Index <= s.cfg.ModelNodes {
			rssModel = append(rssModel, r)
		}
		fc := sb.prom.sum("infermesh_consensus_apply_seconds_count", `path="forwarded"`) - sa.prom.sum("infermesh_consensus_apply_seconds_count", `path="forwarded"`)
		fs := sb.prom.sum("infermesh_consensus_apply_seconds_sum", `path="forwarded"`) - sa.prom.sum("infermesh_consensus_apply_seconds_sum", `path="forwarded"`)
		w.ForwardedApplies += fc
		w.ForwardedApplyMeanMs += fs * 1000 // divided below
		if sb.prom.sum("infermesh_consensus_leader") == 1 {
			w.Leader = id
			w.LeaderCPUPercent = c
			w.LeaderRaftOutBps = rate("infermesh_consensus_raft_bytes_total", `direction="out"`)
			w.LeaderRaftInBps = rate("infermesh_consensus_raft_bytes_total", `direction="in"`)
			lc := sb.prom.sum("infermesh_consensus_apply_seconds_count", `path="leader"`) - sa.prom.sum("infermesh_consensus_apply_seconds_count", `path="leader"`)
			ls := sb.prom.sum("infermesh_consensus_apply_seconds_sum", `path="leader"`) - sa.prom.sum("infermesh_consensus_apply_seconds_sum", `path="leader"`)
			w.LeaderApplies = lc
			if lc > 0 {
				w.LeaderApplyMeanMs = 1000 * ls / lc
			}
		} else {
			fin = append(fin, rate("infermesh_consensus_raft_bytes_total", `direction="in"`))
		}
	}
	if w.ForwardedApplies > 0 {
		w.ForwardedApplyMeanMs /= w.ForwardedApplies
	} else {
		w.ForwardedApplyMeanMs = 0
	}
	w.Seconds = secs
	w.GossipInBps, w.GossipOutBps, w.RecordsPerSec = statsOf(gin), statsOf(gout), statsOf(recs)
	w.CPUPercent, w.RSSMiB, w.RSSMiBModelNodes, w.FollowerRaftInBps = statsOf(cpu), statsOf(rss), statsOf(rssModel), statsOf(fin)
	return w
}

// Stats summarises a set of values.
type Stats struct {
	// N is how many values.
	N int `json:"n"`
	// Mean, P50, P95 and Max describe them.
	Mean float64 `json:"mean"`
	// P50 is the median.
	P50 float64 `json:"p50"`
	// P95 is the 95th percentile (nearest rank).
	P95 float64 `json:"p95"`
	// Max is the largest value.
	Max float64 `json:"max"`
}

func statsOf(v []float64) Stats {
	if len(v) == 0 {
		return Stats{}
	}
	v = slices.Clone(v)
	slices.Sort(v)
	var t float64
	for _, x := range v {
		t += x
	}
	rank := func(q float64) float64 {
		i := int(q*float64(len(v))+0.999999) - 1
		return v[min(max(i, 0), len(v)-1)]
	}
	return Stats{N: len(v), Mean: t / float64(len(v)), P50: rank(0.5), P95: rank(0.95), Max: v[len(v)-1]}
}

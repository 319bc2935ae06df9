package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// ScaleReport is what one run of the scale harness measured.
type ScaleReport struct {
	// Nodes, ModelNodes, Timers and Rate are the run's settings.
	Nodes int `json:"nodes"`
	// ModelNodes is how many nodes held the model.
	ModelNodes int `json:"model_nodes"`
	// Timers is fast or deploy.
	Timers string `json:"timers"`
	// Rate is the traffic's requests per second.
	Rate int `json:"rate_per_s"`
	// Started and Finished bound the run (UTC).
	Started time.Time `json:"started"`
	// Finished is when the last phase ended.
	Finished time.Time `json:"finished"`
	// Convergence is the start-up measurement.
	Convergence ScaleConvergence `json:"convergence"`
	// Windows are the idle and traffic measurements.
	Windows []Window `json:"windows,omitempty"`
	// Traffic is the traffic phase's load.
	Traffic Traffic `json:"traffic"`
	// KeyWriteMs is the time to acknowledge a key creation (a raft write
	// through a random node) during the traffic phase.
	KeyWriteMs Stats `json:"key_write_ms"`
	// Kill is the kill phase, when run.
	Kill *Kill `json:"kill,omitempty"`
	// Quota is the quota phase, when run.
	Quota *Quota `json:"quota,omitempty"`
	// Problems lists anything that went wrong (unexpected exits, leftovers).
	Problems []string `json:"problems,omitempty"`
	// Error is the error that ended the run early, if any.
	Error string `json:"error,omitempty"`
}

// Write stores report.json and report.md in dir.
func (r *ScaleReport) Write(dir string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), b, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(r.Markdown()), 0o644)
}

// Markdown renders the report with each figure beside the target.
func (r *ScaleReport) Markdown() string {
	var b strings.Builder
	f := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	f("# Scale run: %d nodes (%d with models), %s timers\n\n", r.Nodes, r.ModelNodes, r.Timers)
	f("%s to %s\n\n", r.Started.Format(time.RFC3339), r.Finished.Format(time.RFC3339))
	f("| measure | value | target |\n|---|---|---|\n")
	c := r.Convergence
	if c.Converged {
		f("| every node lists every node ready, after the last start | %.1f s (poll round %.2f s) | ≤ 10 s (fast timers) |\n", c.AfterLastStartSeconds, c.PollRoundSeconds)
	} else {
		f("| every node lists every node ready | not reached: %s | ≤ 10 s |\n", c.Why)
	}
	f("| start-up, first process to last /readyz | %.1f s | |\n", c.StartSeconds)
	for _, w := range r.Windows {
		f("| gossip per node, %s, in / out (mean, max) | %s / %s | idle ≤ 2 KB/s |\n", w.Name, kbs(w.GossipInBps), kbs(w.GossipOutBps))
		f("| records received per node per s, %s (mean) | %.1f | |\n", w.Name, w.RecordsPerSec.Mean)
		f("| CPU per node, %s (mean, p95, max) | %.1f %%, %.1f %%, %.1f %% | |\n", w.Name, w.CPUPercent.Mean, w.CPUPercent.P95, w.CPUPercent.Max)
		f("| raft leader (%s), %s: CPU, raft out, raft in | %.1f %%, %.1f KB/s, %.1f KB/s | |\n", w.Leader, w.Name, w.LeaderCPUPercent, w.LeaderRaftOutBps/1000, w.LeaderRaftInBps/1000)
		f("| raft bytes in per follower, %s (mean) | %.2f KB/s | |\n", w.Name, w.FollowerRaftInBps.Mean/1000)
		f("| raft applies, %s: on the leader (mean), forwarded by followers (mean) | %.0f (%.1f ms), %.0f (%.1f ms) | |\n", w.Name, w.LeaderApplies, w.LeaderApplyMeanMs, w.ForwardedApplies, w.ForwardedApplyMeanMs)
		f("| RSS per node, %s (mean, max); model nodes (mean) | %.0f MiB, %.0f MiB; %.0f MiB | |\n", w.Name, w.RSSMiB.Mean, w.RSSMiB.Max, w.RSSMiBModelNodes.Mean)
	}
	if r.Traffic.Sent > 0 {
		t := r.Traffic
		f("| traffic: sent, ok, rate, p50 / p95 latency | %d, %d, %.1f/s, %.0f / %.0f ms | 50/s |\n", t.Sent, t.OK, t.RatePerSec, t.LatencyMs.P50, t.LatencyMs.P95)
		f("| key write acknowledged (p50, p95, max) | %.0f, %.0f, %.0f ms | |\n", r.KeyWriteMs.P50, r.KeyWriteMs.P95, r.KeyWriteMs.Max)
	}
	if k := r.Kill; k != nil {
		f("| SIGKILLed model nodes %v: routing stopped at %d entry nodes (p50, max) | %.0f, %.0f ms (%d pairs never) | ≤ 1 s |\n", k.Victims, len(k.Watchers), k.StopMs.P50, k.StopMs.Max, k.NotStopped)
		f("| client errors entering live nodes, kill to restart (of %d) | %d | 0 |\n", k.Traffic.Sent, k.ClientErrors)
		if k.RestartWhy == "" {
			f("| restarted nodes listed ready everywhere | %.1f s | |\n", k.RestartSeconds)
		} else {
			f("| restarted nodes listed ready everywhere | not reached: %s | |\n", k.RestartWhy)
		}
	}
	if q := r.Quota; q != nil {
		f("| quota %d/day over %d entry nodes: admitted | %d (exact: %v) | exactly %d |\n", q.Limit, q.Entries, q.Admitted, q.Exact, q.Limit)
		f("| last 5 %%: span, ask-to-admit p50 / max (503s retried after 500 ms) | %.2f s, %.0f / %.0f ms | ≤ 2 s |\n", q.LastShareSeconds, q.LastShareLatencyMs.P50, q.LastShareLatencyMs.Max)
		f("| 429 before the last admission; 429 in all; 503 retried; 503 final | %d; %d; %d; %d | 0 premature |\n", q.Premature429, q.Refused429, q.Retried503, q.Unavailable503)
		f("| key listed by every node, after its creation | %.0f ms | |\n", q.KeyEverywhereMs)
	}
	f("\n")
	if r.Traffic.Sent > 0 && len(r.Traffic.Errors) > 0 {
		f("Traffic errors: %s\n\n", countsString(r.Traffic.Errors))
	}
	if r.Kill != nil && len(r.Kill.Traffic.Errors) > 0 {
		f("Kill-phase errors (live entries): %s\n\n", countsString(r.Kill.Traffic.Errors))
	}
	if r.Quota != nil && len(r.Quota.RefusalCodes) > 0 {
		f("Quota-phase refusals: %s\n\n", countsString(r.Quota.RefusalCodes))
	}
	if r.Quota != nil && len(r.Quota.Other) > 0 {
		f("Quota-phase other answers: %s\n\n", countsString(r.Quota.Other))
	}
	for _, p := range r.Problems {
		f("- problem: %s\n", p)
	}
	if r.Error != "" {
		f("- error: %s\n", r.Error)
	}
	return b.String()
}

func kbs(s Stats) string { return fmt.Sprintf("%.2f, %.2f KB/s", s.Mean/1000, s.Max/1000) }

func countsString(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

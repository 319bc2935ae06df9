package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// LatencyStat summarises the successful inference requests of a window.
type LatencyStat struct {
	// From is where the window of request starts begins (inclusive), as an
	// offset from the scenario start.
	From time.Duration `json:"from_ns"`
	// To is where the window ends (exclusive); the whole-run window ends at a
	// very large value.
	To time.Duration `json:"to_ns"`
	// N is the number of ok inference requests the percentiles are taken over.
	N int `json:"n"`
	// P50ms is their median latency in milliseconds (0 when N is 0).
	P50ms float64 `json:"p50_ms"`
	// P99ms is their 99th-percentile latency in milliseconds (0 when N is 0).
	P99ms  float64 `json:"p99_ms"`
	Errors int     `json:"errors"` // requests of any kind that were not ok
}

// FaultStat is what happened around one fault.
type FaultStat struct {
	// Event is the fault.
	Event Event `json:"event"`
	// EndAt is when the matching recovery finished (absent: never).
	EndAt *time.Duration `json:"end_at_ns,omitempty"`
	// Before covers the 10 s before the fault.
	Before LatencyStat `json:"before"`
	// During covers the fault until its recovery, at least 2 s, cut at the end
	// of the load.
	During LatencyStat `json:"during"`
	// After covers the 10 s after the recovery, cut at the end of the load
	// (zero without a recovery).
	After LatencyStat `json:"after"`
	// RoutingChange is the time from the fault to the first membership view
	// of another node that no longer lists a target as healthy.
	RoutingChange *time.Duration `json:"routing_change_ns,omitempty"`
	// NewLeader is the time from the fault to the first poll naming a
	// different leader.
	NewLeader *time.Duration `json:"new_leader_ns,omitempty"`
	// ServedAgain is the time from the recovery to the first request that
	// entered another node and was served by a target.
	ServedAgain *time.Duration `json:"served_again_ns,omitempty"`
}

// ScenarioReport is one scenario in the JSON report.
type ScenarioReport struct {
	// Name is the scenario's command-line name.
	Name string `json:"name"`
	// Title describes the scenario in one line.
	Title string `json:"title"`
	// Nodes is the cluster size.
	Nodes int `json:"nodes"`
	// Needs lists what the scenario needs from the binary and the machine.
	Needs []Need `json:"needs"`
	// Skipped lists the needs that were not met; when set, the scenario did
	// not run.
	Skipped []Need `json:"skipped_for_missing,omitempty"`
	// Seed is the random seed the run used (0 when skipped).
	Seed uint64 `json:"seed"`
	// Dir is the scenario's folder (records, observations, node logs, kept
	// data directories).
	Dir string `json:"dir,omitempty"`
	// Started is the scenario start; record and event offsets count from it.
	Started time.Time `json:"started"`
	// LoadSeconds is when the load ended (requests in flight included), in
	// seconds from Started.
	LoadSeconds float64 `json:"load_seconds"`
	// Rate is the configured load in requests per second.
	Rate float64 `json:"rate"`
	// Requests is the number of requests recorded (final key reads included).
	Requests int `json:"requests"`
	// ByClass counts requests per outcome class.
	ByClass map[Class]int `json:"by_class"`
	// ByOutcome counts requests per HTTP status or transport failure
	// ("timeout", "transport_error", "<status>_broken").
	ByOutcome map[string]int `json:"by_outcome"`
	// ByKind counts requests per request type.
	ByKind map[OpKind]int `json:"by_kind"`
	// ErrorKinds counts requests that were not ok, by class and a short name
	// of the error ("<class>: <error>").
	ErrorKinds map[string]int `json:"error_kinds,omitempty"`
	// Overall is the latency of ok inference requests over the whole run.
	Overall LatencyStat `json:"overall"`
	// Events is every fault and recovery, in order.
	Events []Event `json:"events"`
	// Faults holds the figures around each fault.
	Faults []FaultStat `json:"faults"`
	// Convergence is the outcome of the wait for agreement after the last
	// recovery.
	Convergence Convergence `json:"convergence"`
	// Exits records every node process exit.
	Exits []Exit `json:"exits"`
	// Verdicts are the checkers' answers.
	Verdicts []Verdict `json:"verdicts"`
	// Pass is true when no verdict failed (and for a skipped scenario).
	Pass bool `json:"pass"`
	// RecordsFile is the path of records.jsonl, one line per request.
	RecordsFile string `json:"records_file,omitempty"`
	// Series is the per-second timeline drawn into timeline.png; it is not
	// written to the JSON report.
	Series []TimelinePoint `json:"-"`
}

// Report is the whole run.
type Report struct {
	// Started is when the suite began.
	Started time.Time `json:"started"`
	// Binary is the path of the infermesh binary under test.
	Binary string `json:"binary"`
	// Namespace is how the private network namespace was made (root or user).
	Namespace NamespaceMode `json:"namespace"`
	// Features is what the binary and the machine could do (after
	// SuiteConfig.Disable).
	Features Features `json:"features"`
	// Options records the run's settings: rate, convergence and propagation
	// bounds, output folder.
	Options map[string]any `json:"options"`
	// Scenarios are the scenarios in the order they ran, skipped ones
	// included.
	Scenarios []ScenarioReport `json:"scenarios"`
	// Host is the hygiene verdict of the parent process (after the
	// namespace is gone); filled in by the caller that made it.
	Host *Verdict `json:"host_hygiene,omitempty"`
	// Pass is true when every scenario that ran passed, at least one ran, and
	// host hygiene (once checked) passed.
	Pass bool `json:"pass"`
}

// outcomeOf names a record's outcome for counting: the status, or the
// transport failure.
func outcomeOf(r *Record) string {
	switch {
	case r.Err != "" && r.Timeout:
		return "timeout"
	case r.Err != "" && r.Status == 0:
		return "transport_error"
	case r.Err != "":
		return fmt.Sprintf("%d_broken", r.Status)
	}
	return fmt.Sprintf("%d", r.Status)
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted)-1) + 0.5)
	return sorted[min(i, len(sorted)-1)]
}

// latency computes p50/p99 of ok inference requests started in [from, to).
func latency(recs []*Record, from, to time.Duration) LatencyStat {
	st := LatencyStat{From: from, To: to}
	var lat []float64
	for _, r := range recs {
		if r.Start < from || r.Start >= to {
			continue
		}
		if r.Class != ClassOK {
			st.Errors++
			continue
		}
		if r.Kind.dataPlane() {
			lat = append(lat, float64(r.End-r.Start)/float64(time.Millisecond))
		}
	}
	sort.Float64s(lat)
	st.N, st.P50ms, st.P99ms = len(lat), percentile(lat, 0.5), percentile(lat, 0.99)
	return st
}

func durPtr(d time.Duration) *time.Duration { return &d }

// faultTargets returns the nodes a fault is about: the killed, stopped or
// drained node, or the first group of a partition.
func faultTargets(e Event) []string {
	if e.Kind.isPartition() && len(e.Groups) > 0 {
		return e.Groups[0]
	}
	return e.Nodes
}

// faultStats computes the per-fault figures.
func faultStats(res *Result) []FaultStat {
	var out []FaultStat
	rounds := roundsOf(res.Observations)
	for _, e := range res.Events {
		if !e.Kind.isFault() {
			continue
		}
		fs := FaultStat{Event: e}
		end := faultEnd(res.Events, e)
		if end != forever {
			fs.EndAt = durPtr(end)
		}
		dEnd := min(max(end, e.At+2*time.Second), res.LoadEnd)
		fs.Before = latency(res.Records, max(0, e.At-10*time.Second), e.At)
		fs.During = latency(res.Records, e.At, dEnd)
		if end != forever {
			fs.After = latency(res.Records, end, min(end+10*time.Second, res.LoadEnd))
		}
		targets := faultTargets(e)
		var oldLeader string
		for _, r := range rounds {
			if r.at < e.At {
				if l := leaderOf(r.obs); l != "" {
					oldLeader = l
				}
				continue
			}
			if fs.NewLeader == nil && oldLeader != "" {
				if l := leaderOf(r.obs); l != "" && l != oldLeader {
					fs.NewLeader = durPtr(r.at - e.At)
				}
			}
			if fs.RoutingChange == nil && res.Features.Members {
				for _, o := range r.obs {
					if o.Err != "" || slices.Contains(targets, o.Node) {
						continue
					}
					for _, t := range targets {
						if !slices.Contains(o.Healthy, t) {
							fs.RoutingChange = durPtr(o.At - e.At)
						}
					}
				}
			}
		}
		if end != forever {
			for _, r := range res.Records {
				if r.Start >= end && r.Class == ClassOK && slices.Contains(targets, r.Backend) && !slices.Contains(targets, r.Entry) {
					fs.ServedAgain = durPtr(r.End - end)
					break
				}
			}
		}
		out = append(out, fs)
	}
	return out
}

// BuildScenarioReport summarises a checked result.
func BuildScenarioReport(res *Result, verdicts []Verdict) ScenarioReport {
	sr := ScenarioReport{Name: res.Scenario.Name, Title: res.Scenario.Title, Nodes: res.Scenario.Nodes,
		Needs: res.Scenario.Needs, Skipped: res.Skipped, Seed: res.Seed, Dir: res.Dir, Started: res.T0,
		LoadSeconds: res.LoadEnd.Seconds(), Rate: res.Opt.Rate, Requests: len(res.Records),
		ByClass: map[Class]int{}, ByOutcome: map[string]int{}, ByKind: map[OpKind]int{}, ErrorKinds: map[string]int{},
		Events: res.Events, Convergence: res.Convergence, Exits: res.Exits, Verdicts: verdicts, Pass: true}
	for _, r := range res.Records {
		sr.ByClass[r.Class]++
		sr.ByOutcome[outcomeOf(r)]++
		sr.ByKind[r.Kind]++
		if r.Class != ClassOK {
			sr.ErrorKinds[string(r.Class)+": "+errorKind(r)]++
		}
	}
	sr.Overall = latency(res.Records, 0, forever)
	sr.Faults = faultStats(res)
	sr.Series = Series(res)
	for _, v := range verdicts {
		if v.Status == Fail {
			sr.Pass = false
		}
	}
	return sr
}

// errorKind is a short name for what went wrong with a failed request.
func errorKind(r *Record) string {
	switch {
	case r.Timeout:
		return "timeout"
	case r.Err != "" && r.Status == 0:
		return "transport: " + shortErr(r.Err)
	case r.Code != "":
		return fmt.Sprintf("%d %s", r.Status, r.Code)
	}
	return fmt.Sprintf("%d", r.Status)
}

// shortErr keeps the last part of a wrapped transport error.
func shortErr(s string) string {
	for _, k := range []string{"connection refused", "connection reset", "EOF", "broken pipe", "no route", "i/o timeout"} {
		if strings.Contains(s, k) {
			return k
		}
	}
	if len(s) > 60 {
		return s[len(s)-60:]
	}
	return s
}

// WriteJSONLines writes one JSON value per line (records, observations).
func WriteJSONLines[T any](path string, items []T) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, it := range items {
		if err := enc.Encode(it); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// WriteJSON writes the report, indented.
func (rep *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadReport reads a report written by WriteJSON.
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &rep, nil
}

package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// SuiteConfig configures a run of several scenarios.
type SuiteConfig struct {
	// Bin is the infermesh binary.
	Bin string
	// Out receives report.json, summary.txt, timeline.png and, per
	// scenario, records.jsonl, node logs and data directories.
	Out string
	// Scenarios to run, in order.
	Scenarios []Scenario
	// Models are imported into every node; Model is the embeddings model
	// id the load sends.
	Models []string
	// Model is the embeddings model id the load sends.
	Model string
	// ChatModel is the chat model id ("" sends no chat).
	ChatModel string
	// VisionImage adds background-removal requests (see Options).
	VisionImage []byte
	// Standalone runs mesh scenarios on independent nodes when the binary
	// has no mesh flags (develops the harness; proves nothing about a mesh).
	Standalone bool
	// Disable switches detected features off (e.g. to run without keys).
	Disable []Need
	// Rate, Seed, ConvergenceBound and PropagationBound: see Options.
	Rate float64
	// Seed gives scenario i the seed Seed+i (0: each picks its own).
	Seed uint64
	// ConvergenceBound is Options.ConvergenceBound (0: 30 s).
	ConvergenceBound time.Duration
	// PropagationBound is Options.PropagationBound (0: 2 s).
	PropagationBound time.Duration
	// Secure runs every node with TLS on its client port (certificates from
	// a CA made for the run) and mutual TLS between nodes, besides the
	// cluster secret and keyed clients every run has.
	Secure bool
	// KeepData keeps the nodes' data directories of passing scenarios.
	KeepData bool
	// Summary receives the human-readable summary (nil: none).
	Summary io.Writer
	// Log receives progress lines.
	Log *slog.Logger
}

// DefaultModels returns the test models in the asset cache
// (~/.cache/infermesh/models: tiny-bert, and tiny-llama when present) and
// the chat model id to use ("" without tiny-llama).
func DefaultModels() (folders []string, chatModel string) {
	home, _ := os.UserHomeDir()
	dir := filepath.Join(home, ".cache", "infermesh", "models")
	folders = []string{filepath.Join(dir, "tiny-bert")}
	if _, err := os.Stat(filepath.Join(dir, "tiny-llama", "manifest.json")); err == nil {
		folders, chatModel = append(folders, filepath.Join(dir, "tiny-llama")), "tiny-llama:test"
	}
	return folders, chatModel
}

// Report file names inside Out.
const (
	ReportFile   = "report.json"
	SummaryFile  = "summary.txt"
	TimelineFile = "timeline.png"
)

// RunSuite runs the scenarios. It must run inside the namespace Reexec
// made. It returns the report (also written to Out) and an error only when
// the suite could not run at all.
func RunSuite(ctx context.Context, cfg SuiteConfig) (*Report, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ns, err := SetupNamespace(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, err
	}
	var sec *Security
	if cfg.Secure {
		if sec, err = NewSecurity(filepath.Join(cfg.Out, "pki")); err != nil {
			return nil, fmt.Errorf("secured run: %w", err)
		}
	}
	feat, err := DetectFeatures(ctx, cfg, ns, sec)
	if err != nil {
		return nil, err
	}
	seed := cfg.Seed
	rep := &Report{Started: time.Now(), Binary: cfg.Bin, Namespace: ns.Mode, Features: feat,
		Options: map[string]any{"rate": cfg.Rate, "convergence_bound": cfg.ConvergenceBound.String(),
			"propagation_bound": cfg.PropagationBound.String(), "out": cfg.Out, "secure": cfg.Secure}}
	for i, sc := range cfg.Scenarios {
		if ctx.Err() != nil {
			break
		}
		opt := Options{Bin: cfg.Bin, Dir: cfg.Out, Models: cfg.Models, Model: cfg.Model, ChatModel: cfg.ChatModel, VisionImage: cfg.VisionImage, Features: feat,
			Rate: cfg.Rate, ConvergenceBound: cfg.ConvergenceBound, PropagationBound: cfg.PropagationBound, Security: sec, Log: cfg.Log}
		if seed != 0 {
			opt.Seed = seed + uint64(i)
		}
		if miss := feat.Missing(sc.Needs); len(miss) > 0 {
			cfg.Log.Warn("scenario skipped", "scenario", sc.Name, "needs", needsList(miss))
		} else {
			cfg.Log.Info("scenario", "name", sc.Name, "title", sc.Title)
		}
		res := RunScenario(ctx, sc, opt)
		var sr ScenarioReport
		if len(res.Skipped) > 0 {
			sr = ScenarioReport{Name: sc.Name, Title: sc.Title, Nodes: sc.Nodes, Needs: sc.Needs, Skipped: res.Skipped, Pass: true}
		} else {
			sr = BuildScenarioReport(res, Check(res))
			sr.RecordsFile = filepath.Join(res.Dir, "records.jsonl")
			err := errors.Join(WriteJSONLines(sr.RecordsFile, res.Records),
				WriteJSONLines(filepath.Join(res.Dir, "observations.jsonl"), res.Observations))
			if err != nil {
				cfg.Log.Error("write records", "err", err)
			}
			if sr.Pass && !cfg.KeepData {
				for _, id := range res.NodeIDs {
					os.RemoveAll(filepath.Join(res.Dir, id, "data"))
				}
			}
		}
		rep.Scenarios = append(rep.Scenarios, sr)
		cfg.Log.Info("scenario done", "name", sc.Name, "pass", sr.Pass, "skipped", len(sr.Skipped) > 0)
	}
	rep.Pass = suitePassed(rep)
	return rep, rep.Write(cfg.Out, cfg.Summary)
}

// suitePassed: every scenario that ran passed, and at least one ran.
func suitePassed(rep *Report) bool {
	ran := 0
	for _, sr := range rep.Scenarios {
		if len(sr.Skipped) == 0 {
			ran++
			if !sr.Pass {
				return false
			}
		}
	}
	return ran > 0 && (rep.Host == nil || rep.Host.Status != Fail)
}

// Write writes report.json, summary.txt and timeline.png into out, and the
// summary to w as well when w is not nil.
func (rep *Report) Write(out string, w io.Writer) error {
	errs := []error{rep.WriteJSON(filepath.Join(out, ReportFile)),
		WriteTimeline(filepath.Join(out, TimelineFile), rep.Scenarios)}
	f, err := os.Create(filepath.Join(out, SummaryFile))
	if err == nil {
		rep.WriteSummary(f)
		errs = append(errs, f.Close())
	}
	errs = append(errs, err)
	if w != nil {
		rep.WriteSummary(w)
		fmt.Fprintf(w, "report: %s\nsummary: %s\ntimeline: %s\n", filepath.Join(out, ReportFile),
			filepath.Join(out, SummaryFile), filepath.Join(out, TimelineFile))
	}
	return errors.Join(errs...)
}

// DetectFeatures finds out what the binary and the namespace can do (with
// sec: what a secured node can do).
func DetectFeatures(ctx context.Context, cfg SuiteConfig, ns *Namespace, sec *Security) (Features, error) {
	var f Features
	missing, err := DetectFlags(ctx, cfg.Bin)
	if err != nil {
		return f, err
	}
	f.Mesh, f.MissingFlags = len(missing) == 0, missing
	f.Standalone = cfg.Standalone && !f.Mesh
	f.Partitions, f.NoPartitionWhy = ns.CanPartition, ns.NoPartitionWhy
	if err := ProbeHTTP(ctx, &f, cfg.Bin, filepath.Join(cfg.Out, "probe"), cfg.Models, "sk-chaos-probe-"+randomSecret(), sec); err != nil {
		return f, fmt.Errorf("feature probe: %w", err)
	}
	os.RemoveAll(filepath.Join(cfg.Out, "probe"))
	for _, n := range cfg.Disable {
		switch n {
		case NeedMesh:
			f.Mesh = false
		case NeedPartitions:
			f.Partitions, f.NoPartitionWhy = false, "disabled on the command line"
		case NeedDigest:
			f.Digest = false
		case NeedMembers:
			f.Members = false
		case NeedKeys:
			f.Keys = false
		}
	}
	cfg.Log.Info("features", "mesh", f.Mesh, "missing_flags", f.MissingFlags, "partitions", f.Partitions,
		"state_digest", f.Digest, "members", f.Members, "keys", f.Keys, "standalone", f.Standalone)
	return f, nil
}

// HostSnapshot is what the parent process checks before and after the
// namespace lived: the host's firewall rules and named namespaces.
type HostSnapshot struct {
	// Rules are the host's iptables rules of the filter, raw, nat and mangle
	// tables (when HasIPT).
	Rules []string
	// Netns is the output of `ip netns list`: the host's named namespaces.
	Netns string
	// HasIPT is true when Rules could be read (root and a working iptables).
	HasIPT bool
}

// TakeHostSnapshot reads the host's firewall rules (when iptables exists
// and works) and `ip netns list`.
func TakeHostSnapshot(ctx context.Context) HostSnapshot {
	var s HostSnapshot
	if os.Geteuid() == 0 {
		if rules, err := NewFirewall(nil).Rules(ctx); err == nil {
			s.Rules, s.HasIPT = rules, true
		}
	}
	s.Netns, _ = runCmd(ctx, "ip", "netns", "list")
	return s
}

// CheckHost compares the host before and after, and proves the namespace
// is gone: no process is left in it and none mentions the work folder.
func CheckHost(before, after HostSnapshot, netnsID, workDir string) Verdict {
	v := newVerdict("host_hygiene")
	if before.HasIPT && !slices.Equal(before.Rules, after.Rules) {
		v.violate("host firewall rules changed: before %v, after %v", before.Rules, after.Rules)
	}
	if before.Netns != after.Netns {
		v.violate("named network namespaces changed: before %q, after %q", before.Netns, after.Netns)
	}
	if netnsID != "" {
		if pids := pidsInNetns(netnsID); len(pids) > 0 {
			v.violate("processes still in the chaos namespace %s: %v", netnsID, pids)
		}
	} else {
		v.violate("the chaos namespace's identity was not recorded")
	}
	if pids := processesUnder(workDir); len(pids) > 0 {
		v.violate("processes still using %s: %v", workDir, pids)
	}
	return v
}

// pidsInNetns lists processes whose network namespace is id.
func pidsInNetns(id string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "net")); err == nil && l == id {
			out = append(out, pid)
		}
	}
	return out
}

// Outside runs args of this executable inside a fresh namespace, then
// checks the host and folds that verdict into the report in out. It
// returns the exit code to use.
func Outside(ctx context.Context, args []string, out string, stdout, stderr io.Writer) int {
	before := TakeHostSnapshot(ctx)
	res, err := Reexec(ctx, args, stdout, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return 2
	}
	time.Sleep(200 * time.Millisecond) // let the kernel finish tearing the namespace down
	after := TakeHostSnapshot(context.WithoutCancel(ctx))
	v := CheckHost(before, after, res.NetnsID, out)
	code := res.ExitCode
	if rep, err := ReadReport(filepath.Join(out, ReportFile)); err == nil {
		rep.Host = &v
		rep.Pass = rep.Pass && v.Status == Pass
		if err := rep.WriteJSON(filepath.Join(out, ReportFile)); err != nil {
			fmt.Fprintln(stderr, "chaos: rewrite report:", err)
		}
	} else if code == 0 {
		fmt.Fprintln(stderr, "chaos: no report:", err)
		code = 2
	}
	fmt.Fprintf(stdout, "host hygiene: %s\n", v.Status)
	for _, x := range v.Violations {
		fmt.Fprintf(stdout, "  ✗ %s\n", x)
	}
	if v.Status != Pass && code == 0 {
		code = 1
	}
	return code
}

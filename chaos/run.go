package chaos

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Options apply to every scenario of a run.
type Options struct {
	// Bin is the infermesh binary.
	Bin string
	// Dir is the run's folder: one subfolder per scenario.
	Dir string
	// Models are imported into every node (the first must be an
	// embeddings model: Model names it).
	Models []string
	// Model is the embeddings model id the load uses; ChatModel the chat
	// model id ("" sends no chat).
	Model, ChatModel string
	// VisionImage, when set, adds background-removal requests with this
	// PNG (weight 1: about 2.5 s of CPU each here).
	VisionImage []byte
	// Features is what the binary and machine can do.
	Features Features
	// Seed makes random choices repeatable (0 picks one and reports it).
	Seed uint64
	// Rate is the load in requests per second (default 20).
	Rate float64
	// ConvergenceBound is how long the cluster may take to agree after the
	// last recovery (default 30 s).
	ConvergenceBound time.Duration
	// PropagationBound is how long an acknowledged key write may take to
	// reach a connected node (default 2 s).
	PropagationBound time.Duration
	// Security, when set, secures every node: TLS on the client port,
	// mutual TLS between nodes (see Security).
	Security *Security
	// Log receives progress lines.
	Log *slog.Logger
}

func (o *Options) defaults() {
	if o.Rate <= 0 {
		o.Rate = 20
	}
	if o.ConvergenceBound <= 0 {
		o.ConvergenceBound = 30 * time.Second
	}
	if o.PropagationBound <= 0 {
		o.PropagationBound = 2 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Seed == 0 {
		o.Seed = mrand.Uint64()
	}
}

// Run is one scenario while it runs; fault scripts drive it.
type Run struct {
	sc   Scenario
	opt  Options
	log  *slog.Logger
	cl   *Cluster
	fw   *Firewall
	api  *API
	rec  *Recorder
	load *Load
	mon  *Monitor

	mu     sync.Mutex
	rng    *mrand.Rand
	events []*Event
}

// Result is everything a scenario produced, for the checkers and the report.
type Result struct {
	// Scenario is the scenario that ran.
	Scenario Scenario
	// Seed is the random seed used (Options.Seed, or the one picked for it).
	Seed uint64
	// Dir is the scenario's folder ("" when skipped).
	Dir string
	// Features is what the binary and the machine could do.
	Features Features
	// Skipped lists the needs that were not met; when set, nothing ran.
	Skipped []Need
	// Records is every request, sorted by start.
	Records []*Record
	// Events is the fault and recovery log.
	Events []Event
	// Transitions is every node state change, in order.
	Transitions []Transition
	// Exits is every node process exit.
	Exits []Exit
	// Observations is every monitor poll, in time order.
	Observations []Observation
	// Keys is the load's key book: every key it tried to create.
	Keys []KeyEntry
	// QuotaLimit is the quota key's daily quota: half the quota requests the
	// mix is expected to send, at least 5 (0 without keys).
	QuotaLimit int64
	// DroppedTicks counts requests not sent because the load's in-flight cap
	// was reached.
	DroppedTicks int64
	// NoNodeTicks counts requests not sent because no node was live.
	NoNodeTicks int64
	// LostRecords counts records dropped over the recorder's cap.
	LostRecords int
	// Convergence is the outcome of the wait for agreement after the last
	// recovery.
	Convergence Convergence
	// ScriptErr is why the fault script or the final recovery failed ("" when
	// both succeeded).
	ScriptErr string
	// SetupErr is why the cluster could not be made, tagged, started or
	// formed, or the load's keys created ("" when setup succeeded).
	SetupErr string
	Cleanup  []string // hygiene problems found at teardown
	// NodeIDs are the cluster's node ids, n1 first.
	NodeIDs []string
	// T0 is the scenario start; every offset in the result counts from it.
	T0 time.Time
	// LoadEnd is when the load ended (requests in flight included), as an
	// offset from T0.
	LoadEnd time.Duration
	// Opt is the options the scenario ran with, defaults filled in.
	Opt Options
}

func randomSecret() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// RunScenario runs one scenario from a fresh cluster to teardown. It returns
// a result even when something failed on the way (SetupErr, ScriptErr,
// Cleanup say what).
func RunScenario(ctx context.Context, sc Scenario, opt Options) *Result {
	opt.defaults()
	res := &Result{Scenario: sc, Seed: opt.Seed, Features: opt.Features, Opt: opt}
	if miss := opt.Features.Missing(sc.Needs); len(miss) > 0 {
		res.Skipped = miss
		return res
	}
	res.Dir = filepath.Join(opt.Dir, sc.Name)
	log := opt.Log.With("scenario", sc.Name)
	r := &Run{sc: sc, opt: opt, log: log, rng: mrand.New(mrand.NewPCG(opt.Seed, 1))}
	admin := "sk-chaos-admin-" + randomSecret()
	r.api = NewAPI(NewControlClient(5*time.Second, opt.Security.ClientTLS()), admin)
	if opt.Features.Partitions {
		r.fw = NewFirewall(log)
	}
	cfg := ClusterConfig{Bin: opt.Bin, Nodes: sc.Nodes, Dir: res.Dir, Models: opt.Models,
		Mesh: opt.Features.Mesh && !opt.Features.Standalone, RequireKeys: opt.Features.Keys, AdminKey: admin,
		ClusterSecret: randomSecret(), TagSources: r.fw != nil, Security: opt.Security, Log: log}
	var err error
	if r.cl, err = NewCluster(ctx, cfg); err != nil {
		res.SetupErr = err.Error()
		return res
	}
	defer r.teardown(ctx, res)
	for _, n := range r.cl.Nodes() {
		res.NodeIDs = append(res.NodeIDs, n.ID)
		if r.fw != nil {
			if err := r.fw.Tag(ctx, n.GID, n.IP); err != nil {
				res.SetupErr = err.Error()
				return res
			}
		}
	}
	r.rec = NewRecorder(time.Now(), 500000)
	res.T0 = r.rec.T0()
	r.mon = NewMonitor(r.cl, r.api, opt.Features, r.rec.Since, 500*time.Millisecond)
	log.Info("starting cluster", "nodes", sc.Nodes, "dir", res.Dir)
	if err := r.cl.Start(ctx); err != nil {
		res.SetupErr = err.Error()
		return res
	}
	if err := r.waitFormed(ctx, 60*time.Second); err != nil {
		res.SetupErr = err.Error()
		return res
	}
	if opt.Security != nil {
		if err := opt.Security.checkSecured(ctx, r.cl.Nodes()[0]); err != nil {
			res.SetupErr = "secured run: " + err.Error()
			return res
		}
	}
	lc, err := r.loadConfig(ctx, res)
	if err != nil {
		res.SetupErr = err.Error()
		return res
	}
	r.load = NewLoad(lc, r.cl, r.rec)

	monCtx, stopMon := context.WithCancel(ctx)
	monDone := make(chan struct{})
	go func() { r.mon.Run(monCtx); close(monDone) }()
	loadDone := make(chan struct{})
	go func() { r.load.Run(ctx); close(loadDone) }()

	log.Info("load and faults running", "load", lc.Duration, "rate", lc.Rate)
	sctx, cancel := context.WithTimeout(ctx, lc.Duration+90*time.Second)
	if err := sc.Script(sctx, r); err != nil {
		res.ScriptErr = err.Error()
	}
	cancel()
	<-loadDone
	res.LoadEnd = r.rec.Since()
	if err := r.Recover(ctx); err != nil && res.ScriptErr == "" {
		res.ScriptErr = "recover: " + err.Error()
	}
	res.Convergence = r.converge(ctx)
	if opt.Features.Keys {
		r.load.FinalReads(ctx)
	}
	stopMon()
	<-monDone
	return res
}

// teardown stops every node, removes the firewall rules, collects what the
// checkers need and notes every hygiene problem.
func (r *Run) teardown(ctx context.Context, res *Result) {
	if err := r.cl.Close(); err != nil {
		res.Cleanup = append(res.Cleanup, err.Error())
	}
	if r.fw != nil {
		if err := r.fw.Reset(context.WithoutCancel(ctx)); err != nil {
			res.Cleanup = append(res.Cleanup, err.Error())
		}
	}
	if pids := r.cl.Running(); len(pids) > 0 {
		res.Cleanup = append(res.Cleanup, fmt.Sprintf("node processes still running: %v", pids))
	}
	if left := processesUnder(res.Dir); len(left) > 0 {
		res.Cleanup = append(res.Cleanup, fmt.Sprintf("processes still using %s: %v", res.Dir, left))
	}
	res.Transitions, res.Exits = r.cl.Transitions(), r.cl.Exits()
	if r.rec != nil {
		res.Records, res.LostRecords = r.rec.Records(), r.rec.Lost()
		res.Events = r.Events()
		res.Observations = r.mon.Observations()
	}
	if r.load != nil {
		res.Keys = r.load.Keys()
		res.DroppedTicks, res.NoNodeTicks = r.load.Dropped()
	}
}

// waitFormed waits until the cluster is one: every node sees every other
// healthy (members) and the up nodes agree on a leader (state digest).
// Without either endpoint there is nothing to wait for.
func (r *Run) waitFormed(ctx context.Context, bound time.Duration) error {
	if r.opt.Features.Standalone || (!r.opt.Features.Members && !r.opt.Features.Digest) {
		return nil
	}
	deadline := time.Now().Add(bound)
	var last string
	for time.Now().Before(deadline) {
		obs := r.mon.Poll(ctx)
		last = formedWhy(obs, r.cl.Nodes(), r.opt.Features)
		if last == "" {
			r.log.Info("cluster formed", "after", r.rec.Since().Round(time.Millisecond))
			return nil
		}
		if err := r.Sleep(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("cluster did not form within %s: %s", bound, last)
}

// formedWhy returns "" when the observations show one formed cluster, or
// what is still missing.
func formedWhy(obs []Observation, nodes []*Node, f Features) string {
	if len(obs) != len(nodes) {
		return fmt.Sprintf("%d of %d nodes answered", len(obs), len(nodes))
	}
	for _, o := range obs {
		if o.Err != "" {
			return o.Node + ": " + o.Err
		}
		if f.Members && len(o.Healthy) != len(nodes) {
			return fmt.Sprintf("%s sees %d healthy peers %v, want %d", o.Node, len(o.Healthy), o.Healthy, len(nodes))
		}
	}
	if f.Digest && leaderOf(obs) == "" {
		return "no leader agreed"
	}
	return ""
}

// loadConfig sets the load up: the keys it uses (created through the admin
// API when it exists) and the mix and rate.
func (r *Run) loadConfig(ctx context.Context, res *Result) (LoadConfig, error) {
	mix := maps.Clone(r.sc.Mix)
	if mix == nil {
		mix = DefaultMix()
	}
	if r.opt.VisionImage != nil && mix[OpVision] == 0 {
		mix[OpVision] = 1
	}
	lc := LoadConfig{Rate: r.opt.Rate, Duration: r.sc.Load, Mix: mix,
		Model: r.opt.Model, ChatModel: r.opt.ChatModel, Image: r.opt.VisionImage, AdminKey: r.api.admin, DataKey: r.api.admin, Keys: r.opt.Features.Keys,
		ProbeKeys: r.opt.Features.Keys, KeyPrefix: "ck-" + r.sc.Name + "-", Seed: r.opt.Seed,
		TLS: r.opt.Security.ClientTLS()}
	if !r.opt.Features.Keys {
		return lc, nil
	}
	total := 0
	for _, w := range mix {
		total += w
	}
	expected := lc.Rate * lc.Duration.Seconds() * float64(mix[OpQuota]) / float64(max(total, 1))
	res.QuotaLimit = max(int64(expected/2), 5)
	base := r.cl.Nodes()[0].BaseURL()
	create := func(spec KeySpec) (string, error) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			k, resp, err := r.api.CreateKey(ctx, base, spec)
			if err == nil && resp.Status/100 == 2 {
				return k.Key, nil
			}
			if time.Now().After(deadline) {
				return "", fmt.Errorf("create key %s: status %d %s %v", spec.Name, resp.Status, resp.Code, err)
			}
			if err := r.Sleep(ctx, 500*time.Millisecond); err != nil {
				return "", err
			}
		}
	}
	var err error
	if lc.DataKey, err = create(KeySpec{Name: "chaos-load", App: "chaos"}); err != nil {
		return lc, err
	}
	lc.QuotaKey, err = create(KeySpec{Name: "chaos-quota", App: "chaos", Allow: []string{"embeddings"}, DailyQuota: res.QuotaLimit})
	return lc, err
}

// processesUnder lists node processes (command line with --data-dir
// below dir) that are still alive.
func processesUnder(dir string) []int {
	if dir == "" {
		return nil
	}
	ents, _ := os.ReadDir("/proc")
	var out []int
	self := os.Getpid()
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if bytes.Contains(b, []byte("--data-dir\x00"+dir)) {
			out = append(out, pid)
		}
	}
	return out
}

package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// ScaleConfig says how to run the scale harness: N real nodes on
// loopback, models on a subset, traffic through random entry nodes.
type ScaleConfig struct {
	// Bin is the infermesh binary.
	Bin string
	// Dir receives the nodes' folders and the report.
	Dir string
	// Nodes is how many processes (default 100).
	Nodes int
	// ModelNodes is how many of them hold Models (default 5).
	ModelNodes int
	// Models are the model folders imported into the model nodes; Model is
	// the embeddings model id the traffic asks for.
	Models []string
	// Model is the embeddings model id.
	Model string
	// Timers is "fast" (--fast-timers) or "deploy" (the defaults a
	// deployment on loopback gets).
	Timers string
	// Phases lists what to run, in order, out of "converge", "idle",
	// "traffic", "kill", "quota" (default all).
	Phases []string
	// Window is the length of the idle and traffic measurements (default 30 s).
	Window time.Duration
	// Rate is the traffic's requests per second (default 50).
	Rate int
	// Kills is how many model nodes the kill phase SIGKILLs (default 2).
	Kills int
	// QuotaLimit is the daily quota spent in the quota phase (default 1000).
	QuotaLimit int
	// Seed seeds every random choice.
	Seed uint64
	// Log receives progress lines.
	Log *slog.Logger
}

func (c *ScaleConfig) defaults() {
	def := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	def(&c.Nodes, 100)
	def(&c.ModelNodes, 5)
	def(&c.Rate, 50)
	def(&c.Kills, 2)
	def(&c.QuotaLimit, 1000)
	if c.Window <= 0 {
		c.Window = 30 * time.Second
	}
	if c.Timers == "" {
		c.Timers = "fast"
	}
	if len(c.Phases) == 0 {
		c.Phases = []string{"converge", "idle", "traffic", "kill", "quota"}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	c.ModelNodes = min(c.ModelNodes, c.Nodes)
}

// scaleRun is one run of the scale harness.
type scaleRun struct {
	cfg  ScaleConfig
	cl   *Cluster
	api  *API // control calls (admin key, short timeout)
	data *API // traffic (admin key, 10 s timeout, many connections)
	log  *slog.Logger
}

// RunScale starts the cluster, runs the phases and returns the report;
// every process it started is killed before it returns, whatever happened.
func RunScale(ctx context.Context, cfg ScaleConfig) (*ScaleReport, error) {
	cfg.defaults()
	admin := "sk-scale-admin-" + randomSecret()
	ccfg := ClusterConfig{Bin: cfg.Bin, Nodes: cfg.Nodes, Dir: cfg.Dir, Models: cfg.Models, ModelNodes: cfg.ModelNodes,
		Mesh: true, AdminKey: admin, ClusterSecret: randomSecret(), JoinSeeds: 3,
		StartTimeout: 5 * time.Minute, DrainTimeout: 5 * time.Second, Log: cfg.Log}
	if cfg.Timers == "fast" {
		ccfg.ExtraArgs = append(ccfg.ExtraArgs, "--fast-timers")
	}
	cl, err := NewCluster(ctx, ccfg)
	if err != nil {
		return nil, err
	}
	dataHC := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 2, MaxIdleConns: 4 * cfg.Nodes,
		IdleConnTimeout: 30 * time.Second,
		DialContext:     (&net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 202)}}).DialContext}}
	s := &scaleRun{cfg: cfg, cl: cl, log: cfg.Log,
		api: NewAPI(NewControlClient(5*time.Second, nil), admin), data: NewAPI(dataHC, admin)}
	rep := &ScaleReport{Nodes: cfg.Nodes, ModelNodes: cfg.ModelNodes, Timers: cfg.Timers, Rate: cfg.Rate, Started: time.Now().UTC()}
	defer func() {
		if err := cl.Close(); err != nil {
			rep.Problems = append(rep.Problems, err.Error())
		}
		if left := cl.Running(); len(left) > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("processes still running after teardown: %v", left))
		}
		for _, e := range cl.Exits() {
			if e.Expected == "" {
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s exited unexpectedly (code %d %s) %v", e.Node, e.Code, e.Signal, e.Crash))
			}
		}
	}()
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5ca1e))
	err = s.run(ctx, rep, rng)
	rep.Finished = time.Now().UTC()
	return rep, err
}

func (s *scaleRun) run(ctx context.Context, rep *ScaleReport, rng *rand.Rand) error {
	conv, err := s.startAndConverge(ctx)
	rep.Convergence = conv
	if err != nil {
		return err
	}
	for _, ph := range s.cfg.Phases {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Info("phase", "name", ph)
		switch ph {
		case "converge":
		case "idle":
			a := s.sampleAll(ctx, 8)
			select {
			case <-time.After(s.cfg.Window):
			case <-ctx.Done():
				return ctx.Err()
			}
			w := s.window("idle", a, s.sampleAll(ctx, 8))
			rep.Windows = append(rep.Windows, w)
		case "traffic":
			var keyLat []float64
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { // key writes through random followers during the traffic
				defer wg.Done()
				keyLat = s.keyWrites(ctx, 20, s.cfg.Window, rand.New(rand.NewPCG(rng.Uint64(), 2)))
			}()
			a := s.sampleAll(ctx, 8)
			reqs, skipped := s.traffic(ctx, s.cfg.Rate, s.cfg.Window, 64, rng)
			w := s.window("traffic", a, s.sampleAll(ctx, 8))
			wg.Wait()
			rep.Windows = append(rep.Windows, w)
			rep.Traffic = summarise(reqs, skipped)
			rep.KeyWriteMs = statsOf(keyLat)
		case "kill":
			k, err := s.killPhase(ctx, rng)
			rep.Kill = k
			if err != nil {
				return err
			}
		case "quota":
			q, err := s.quota(ctx, s.cfg.QuotaLimit, 16, 3*time.Minute, rng)
			rep.Quota = &q
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("unknown phase %q", ph)
		}
	}
	return nil
}

// Convergence is how long the mesh took to list every node ready.
type ScaleConvergence struct {
	// StartSeconds is from the first process start to the last node's
	// /readyz answering 200.
	StartSeconds float64 `json:"start_s"`
	// AfterLastStartSeconds is from the last process start to the first
	// poll round in which every node listed every node ready (the poll's
	// resolution is PollRoundSeconds).
	AfterLastStartSeconds float64 `json:"after_last_start_s"`
	// PollRoundSeconds is how long one round over every node took.
	PollRoundSeconds float64 `json:"poll_round_s"`
	// Converged says whether it happened within the bound.
	Converged bool `json:"converged"`
	// Why says what was missing at the bound.
	Why string `json:"why,omitempty"`
}

// startAndConverge starts every node and polls every node's members until
// all list all ready.
func (s *scaleRun) startAndConverge(ctx context.Context) (ScaleConvergence, error) {
	var c ScaleConvergence
	t0 := time.Now()
	if err := s.cl.Start(ctx); err != nil {
		return c, err
	}
	c.StartSeconds = time.Since(t0).Seconds()
	lastStart := t0
	s.cl.mu.Lock()
	for _, p := range s.cl.procs {
		if p.started.After(lastStart) {
			lastStart = p.started
		}
	}
	s.cl.mu.Unlock()
	at, round, why := s.waitAllReady(ctx, s.cl.InState(StateUp), 3*time.Minute)
	c.PollRoundSeconds = round.Seconds()
	if why != "" {
		c.Why = why
		return c, nil
	}
	c.Converged = true
	c.AfterLastStartSeconds = max(at.Sub(lastStart).Seconds(), 0)
	s.log.Info("converged", "after_last_start", at.Sub(lastStart).Round(time.Millisecond), "start", c.StartSeconds)
	return c, nil
}

// waitAllReady polls the members of every node in ids until one round
// finds each listing exactly want... every id ready; it returns when that
// round started, the mean round length, or why not by the bound.
func (s *scaleRun) waitAllReady(ctx context.Context, ids []string, bound time.Duration) (time.Time, time.Duration, string) {
	deadline := time.Now().Add(bound)
	var rounds int
	var spent time.Duration
	for {
		start := time.Now()
		why := s.allReadyRound(ctx, ids)
		rounds++
		spent += time.Since(start)
		if why == "" {
			return start, spent / time.Duration(rounds), ""
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Time{}, spent / time.Duration(rounds), why
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// allReadyRound asks every node in ids for its members once; "" when all
// list every id ready and not ejected.
func (s *scaleRun) allReadyRound(ctx context.Context, ids []string) string {
	var mu sync.Mutex
	var whys []string
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			why := s.listsReady(ctx, id, ids)
			if why != "" {
				mu.Lock()
				whys = append(whys, why)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(whys) == 0 {
		return ""
	}
	slices.Sort(whys)
	return fmt.Sprintf("%d nodes not there yet, e.g. %s", len(whys), whys[0])
}

// listsReady says what node id's member list lacks of ids ready.
func (s *scaleRun) listsReady(ctx context.Context, id string, ids []string) string {
	ms, err := s.api.Members(ctx, s.cl.Node(id).BaseURL())
	if err != nil {
		return id + ": " + err.Error()
	}
	ready := map[string]bool{}
	for _, m := range ms {
		if !m.Ejected && (m.State == "ready" || m.State == "saturated") {
			ready[m.ID] = true
		}
	}
	for _, want := range ids {
		if !ready[want] {
			return fmt.Sprintf("%s does not list %s ready (%d of %d)", id, want, len(ready), len(ids))
		}
	}
	return ""
}

// keyWrites creates n keys through random nodes spread over d and returns
// each write's time to acknowledgement (ms): a raft apply forwarded by a
// follower in almost every case.
func (s *scaleRun) keyWrites(ctx context.Context, n int, d time.Duration, rng *rand.Rand) []float64 {
	var out []float64
	gap := d / time.Duration(n+1)
	for i := range n {
		select {
		case <-ctx.Done():
			return out
		case <-time.After(gap):
		}
		up := s.cl.InState(StateUp)
		node := s.cl.Node(up[rng.IntN(len(up))])
		t := time.Now()
		_, res, err := s.api.CreateKey(ctx, node.BaseURL(), KeySpec{Name: fmt.Sprintf("scale-write-%d-%d", t.UnixNano(), i), App: "scale"})
		if err == nil && res.Status/100 == 2 {
			out = append(out, float64(time.Since(t).Microseconds())/1000)
		}
	}
	return out
}

var errNoModelNode = errors.New("kill phase: no model node that is not a raft voter is up")

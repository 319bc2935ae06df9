package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Kill is the outcome of SIGKILLing model nodes under traffic and
// restarting them.
type Kill struct {
	// Victims are the nodes killed (model holders that are not raft
	// voters).
	Victims []string `json:"victims"`
	// Watchers are the entry nodes whose member lists were polled.
	Watchers []string `json:"watchers"`
	// StopMs summarises, per watcher and victim, the time from the SIGKILL
	// to the first poll in which the watcher no longer lists the victim as
	// routable (ejected after a refused connection, suspected, gone). The
	// polls are 100 ms apart per watcher.
	StopMs Stats `json:"stop_ms"`
	// NotStopped counts watcher–victim pairs still routable at the bound.
	NotStopped int `json:"not_stopped"`
	// Traffic is the load through live entry nodes from the kill to the
	// end of the restart.
	Traffic Traffic `json:"traffic"`
	// ClientErrors counts non-2xx answers (or none) to requests that
	// entered a node that was up the whole time.
	ClientErrors int `json:"client_errors"`
	// RestartSeconds is from restarting the victims to every node listing
	// every node ready again.
	RestartSeconds float64 `json:"restart_converged_s"`
	// RestartWhy says what was missing if that did not happen.
	RestartWhy string `json:"restart_why,omitempty"`
}

// killPhase runs traffic, kills cfg.Kills model nodes that are not voters,
// watches sampled entry nodes drop them, restarts them and waits for the
// mesh to list everyone ready again.
func (s *scaleRun) killPhase(ctx context.Context, rng *rand.Rand) (*Kill, error) {
	k := &Kill{}
	voters := s.voters(ctx)
	var victims []string
	for i := s.cfg.ModelNodes; i >= 1 && len(victims) < s.cfg.Kills; i-- {
		id := "n" + strconv.Itoa(i)
		// Not a raft voter (killing two of three would take the quorum,
		// which is another scenario), nor the leader.
		if s.cl.State(id) != StateUp || voters[id] {
			continue
		}
		victims = append(victims, id)
	}
	if len(victims) == 0 {
		return k, errNoModelNode
	}
	k.Victims = victims
	var watchers []string
	for _, id := range s.cl.InState(StateUp) {
		if !slices.Contains(victims, id) {
			watchers = append(watchers, id)
		}
	}
	rng.Shuffle(len(watchers), func(i, j int) { watchers[i], watchers[j] = watchers[j], watchers[i] })
	k.Watchers = watchers[:min(10, len(watchers))]

	tctx, stopTraffic := context.WithCancel(ctx)
	defer stopTraffic()
	var reqs []scaleReq
	var skipped int
	var twg sync.WaitGroup
	twg.Add(1)
	go func() {
		defer twg.Done()
		reqs, skipped = s.traffic(tctx, s.cfg.Rate, 5*time.Minute, 64, rand.New(rand.NewPCG(rng.Uint64(), 3)))
	}()
	time.Sleep(5 * time.Second) // traffic reaches the victims first

	killedAt := time.Now()
	for _, v := range victims {
		if err := s.cl.Kill(v); err != nil {
			return k, fmt.Errorf("kill %s: %w", v, err)
		}
	}
	s.log.Info("killed", "victims", victims)
	stops, missing := s.watchStops(ctx, k.Watchers, victims, killedAt, 15*time.Second)
	k.StopMs, k.NotStopped = statsOf(stops), missing

	restartAt := time.Now()
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, v := range victims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.cl.StartNode(ctx, v); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		stopTraffic()
		twg.Wait()
		return k, fmt.Errorf("restart: %v", errs)
	}
	at, _, why := s.waitAllReady(ctx, s.cl.InState(StateUp), 2*time.Minute)
	if why != "" {
		k.RestartWhy = why
	} else {
		k.RestartSeconds = at.Sub(restartAt).Seconds()
	}
	time.Sleep(3 * time.Second)
	stopTraffic()
	twg.Wait()
	var live []scaleReq
	for _, r := range reqs {
		if slices.Contains(victims, r.entry) || r.start.Before(killedAt) {
			continue
		}
		live = append(live, r)
		if r.status/100 != 2 {
			k.ClientErrors++
		}
	}
	k.Traffic = summarise(live, skipped)
	return k, nil
}

// voters returns the raft voters as the first node up lists them.
func (s *scaleRun) voters(ctx context.Context) map[string]bool {
	out := map[string]bool{}
	up := s.cl.InState(StateUp)
	if len(up) == 0 {
		return out
	}
	res, err := s.api.Do(ctx, http.MethodGet, s.cl.Node(up[0]).BaseURL()+"/v1/server/raft/peers", "", nil)
	if err != nil || res.Status != http.StatusOK {
		return out
	}
	var st struct {
		Data []struct {
			ID       string `json:"id"`
			Suffrage string `json:"suffrage"`
		} `json:"data"`
	}
	if json.Unmarshal(res.Body, &st) == nil {
		for _, p := range st.Data {
			if p.Suffrage == "voter" {
				out[p.ID] = true
			}
		}
	}
	return out
}

// watchStops polls each watcher's members every 100 ms until it no longer
// lists any victim as routable, and returns the stop times (ms after
// killedAt) and how many pairs never stopped within bound.
func (s *scaleRun) watchStops(ctx context.Context, watchers, victims []string, killedAt time.Time, bound time.Duration) ([]float64, int) {
	var mu sync.Mutex
	var stops []float64
	missing := 0
	var wg sync.WaitGroup
	for _, w := range watchers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pending := slices.Clone(victims)
			for len(pending) > 0 && time.Since(killedAt) < bound && ctx.Err() == nil {
				ms, err := s.api.Members(ctx, s.cl.Node(w).BaseURL())
				now := time.Now()
				if err == nil {
					routable := map[string]bool{}
					for _, m := range ms {
						if !m.Ejected && (m.State == "ready" || m.State == "saturated") {
							routable[m.ID] = true
						}
					}
					pending = slices.DeleteFunc(pending, func(v string) bool {
						if routable[v] {
							return false
						}
						mu.Lock()
						stops = append(stops, float64(now.Sub(killedAt).Microseconds())/1000)
						mu.Unlock()
						return true
					})
				}
				time.Sleep(100 * time.Millisecond)
			}
			mu.Lock()
			missing += len(pending)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return stops, missing
}

package chaos

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// Convergence is the outcome of waiting, after the last recovery, for the
// cluster to agree again.
type Convergence struct {
	// Converged is true when every condition held within Bound.
	Converged bool `json:"converged"`
	// From is the last recovery (or the end of the load), After the time
	// from there to agreement.
	From time.Duration `json:"from_ns"`
	// After is the time from From to agreement: when the monitor first saw it,
	// else when the final check passed (0 when never reached).
	After time.Duration `json:"after_ns"`
	// Bound is the convergence bound the wait used (Options.ConvergenceBound,
	// default 30 s); 0 when no wait ran.
	Bound time.Duration `json:"bound_ns"`
	// Why is the condition that still failed at the bound.
	Why string `json:"why,omitempty"`
	// Unchecked lists conditions the binary cannot be asked about yet.
	Unchecked []string `json:"unchecked,omitempty"`
	// Leader and Digest are what all nodes agreed on.
	Leader string `json:"leader,omitempty"`
	// Digest is the state digest they all reported (empty without the
	// state-digest endpoint).
	Digest string `json:"digest,omitempty"`
	// Routable says, per node, which entry node's request it served.
	Routable map[string]string `json:"routable,omitempty"`
}

// converge waits up to the convergence bound for: every node up and ready;
// the same healthy membership everywhere (members); one leader and one
// digest at one applied index everywhere (state digest); every node
// serving requests that entered through another node (or itself, without a
// mesh).
func (r *Run) converge(ctx context.Context) Convergence {
	c := Convergence{Bound: r.opt.ConvergenceBound, From: r.load.cfg.Duration}
	for _, e := range r.Events() {
		if !e.Kind.isFault() && e.Done > c.From {
			c.From = e.Done
		}
	}
	f := r.opt.Features
	if !f.Members {
		c.Unchecked = append(c.Unchecked, "membership (GET /v1/server/members not served)")
	}
	if !f.Digest {
		c.Unchecked = append(c.Unchecked, "leader and state digest (GET /v1/server/state-digest not served)")
	}
	// The final check must pass by From+Bound; when that moment is already
	// behind us (the last recovery was mid-run) it gets a short grace, and
	// the monitor's record says when agreement was first reached.
	deadline := r.rec.T0().Add(max(c.From+c.Bound, r.rec.Since()+5*time.Second))
	for {
		why := r.convergedWhy(ctx, &c)
		if why == "" {
			c.Converged = true
			c.After = r.rec.Since() - c.From
			if at, ok := agreedAt(r.mon.Observations(), r.cl.Nodes(), f, c.From); ok {
				c.After = at - c.From
			}
			if c.After > c.Bound {
				c.Converged = false
				c.Why = fmt.Sprintf("agreement took %s, over the %s bound", c.After.Round(time.Millisecond), c.Bound)
			}
			r.log.Info("converged", "after", c.After.Round(time.Millisecond))
			return c
		}
		c.Why = why
		if time.Now().After(deadline) {
			r.log.Error("not converged", "bound", c.Bound, "why", why)
			return c
		}
		if r.Sleep(ctx, 250*time.Millisecond) != nil {
			c.Why = "interrupted: " + why
			return c
		}
	}
}

// agreedAt returns the time of the first monitor round at or after from in
// which every node answered and all agreed (membership, leader, digest).
func agreedAt(obs []Observation, nodes []*Node, f Features, from time.Duration) (time.Duration, bool) {
	if !f.Members && !f.Digest {
		return 0, false
	}
	rounds := map[int][]Observation{}
	var order []int
	for _, o := range obs {
		if o.At < from {
			continue
		}
		if _, ok := rounds[o.Round]; !ok {
			order = append(order, o.Round)
		}
		rounds[o.Round] = append(rounds[o.Round], o)
	}
	slices.Sort(order)
	for _, k := range order {
		round := rounds[k]
		if formedWhy(round, nodes, f) != "" || !sameView(round, f) {
			continue
		}
		at := time.Duration(0)
		for _, o := range round {
			at = max(at, o.At)
		}
		return at, true
	}
	return 0, false
}

// sameView reports whether every observation shows the same membership,
// leader, digest and index.
func sameView(obs []Observation, f Features) bool {
	for _, o := range obs {
		if f.Members && !slices.Equal(o.Healthy, obs[0].Healthy) {
			return false
		}
		if f.Digest && (o.Leader != obs[0].Leader || o.Digest != obs[0].Digest || o.Index != obs[0].Index || o.Leader == "") {
			return false
		}
	}
	return true
}

func (r *Run) convergedWhy(ctx context.Context, c *Convergence) string {
	nodes := r.cl.Nodes()
	for _, n := range nodes {
		if s := r.cl.State(n.ID); s != StateUp {
			return n.ID + " is " + string(s)
		}
		if !r.cl.ready(ctx, n) {
			return n.ID + " /readyz is not 200"
		}
	}
	f := r.opt.Features
	if f.Members || f.Digest {
		obs := r.mon.Poll(ctx)
		if why := formedWhy(obs, nodes, f); why != "" {
			return why
		}
		if f.Members {
			for _, o := range obs {
				if !slices.Equal(o.Healthy, obs[0].Healthy) {
					return fmt.Sprintf("membership differs: %s sees %v, %s sees %v", obs[0].Node, obs[0].Healthy, o.Node, o.Healthy)
				}
			}
		}
		if f.Digest {
			leaders := map[string]bool{}
			for _, o := range obs {
				leaders[o.Leader] = true
				if o.Digest != obs[0].Digest || o.Index != obs[0].Index {
					return fmt.Sprintf("state differs: %s at %d %.12s, %s at %d %.12s", obs[0].Node, obs[0].Index, obs[0].Digest, o.Node, o.Index, o.Digest)
				}
			}
			if len(leaders) != 1 || obs[0].Leader == "" {
				return fmt.Sprintf("leaders differ: %v", leaders)
			}
			if r.cl.Node(obs[0].Leader) == nil {
				return "leader " + obs[0].Leader + " is not a node of this cluster"
			}
			c.Leader, c.Digest = obs[0].Leader, obs[0].Digest
		}
	}
	c.Routable = map[string]string{}
	for _, n := range nodes {
		via, err := r.routableVia(ctx, n.ID)
		if err != nil {
			return err.Error()
		}
		c.Routable[n.ID] = via
	}
	return ""
}

// routableVia sends embeddings requests into another node (round-robin
// routing reaches every candidate within a few) until one is served by
// target. Without a mesh the request goes to target itself.
func (r *Run) routableVia(ctx context.Context, target string) (string, error) {
	entries := []string{target}
	if r.opt.Features.Mesh && !r.opt.Features.Standalone {
		entries = r.Others([]string{target})
	}
	body := map[string]any{"model": r.opt.Model, "input": []string{"routable?"}}
	tries := 3 * len(r.cl.Nodes())
	var last string
	for i := range tries {
		entry := entries[i%len(entries)]
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := r.api.Do(rctx, http.MethodPost, r.cl.Node(entry).BaseURL()+"/v1/embeddings", "", body)
		cancel()
		switch {
		case err != nil:
			last = fmt.Sprintf("request into %s: %v", entry, err)
		case res.Status != http.StatusOK:
			last = fmt.Sprintf("request into %s: status %d %s", entry, res.Status, res.Code)
		case res.Backend == target:
			return entry, nil
		case res.Backend == "" && entry == target && r.opt.Features.Standalone:
			return entry + " (no X-Service-Backend header)", nil
		default:
			last = fmt.Sprintf("served by %s", res.Backend)
		}
	}
	return "", fmt.Errorf("%s served none of %d requests sent through %v (last: %s)", target, tries, entries, last)
}

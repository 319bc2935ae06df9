package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Scenario is a cluster size, a load and a fault script.
type Scenario struct {
	// Name is the command-line name; Title one line for people.
	Name, Title string
	// Nodes is the cluster size.
	Nodes int
	// Load is how long traffic runs; the script runs alongside.
	Load time.Duration
	// Needs must all be met or the scenario is skipped (and says why).
	Needs []Need
	// Mix overrides the default mix (nil keeps it).
	Mix Mix
	// Short marks the versions meant for `make test`.
	Short bool
	// Script injects the faults. It returns before or at the end of the
	// load; what it leaves broken is healed and restarted afterwards.
	Script func(ctx context.Context, r *Run) error
}

// Catalog returns every scenario: the six of issue 5 (about 60 s of load
// each), a one-direction cut, and short versions of 1 and 4 for `make test`.
func Catalog() []Scenario {
	return []Scenario{
		{
			Name: "random-kill", Title: "SIGKILL a random node every 10 s; restart it 4 s later",
			Nodes: 5, Load: 60 * time.Second, Needs: []Need{NeedMesh},
			Script: randomKills(5*time.Second, 10*time.Second, 4*time.Second, 5),
		},
		{
			Name: "leader-kill", Title: "SIGKILL the raft leader, 5 times; restart it once a new leader is seen",
			Nodes: 5, Load: 60 * time.Second, Needs: []Need{NeedMesh, NeedDigest},
			Script: leaderKills(5*time.Second, 11*time.Second, 5),
		},
		{
			Name: "rolling-restart", Title: "SIGTERM rolling restart of every node in turn",
			Nodes: 5, Load: 60 * time.Second, Needs: []Need{NeedMesh},
			Script: func(ctx context.Context, r *Run) error {
				if err := r.SleepUntil(ctx, 5*time.Second); err != nil {
					return err
				}
				return r.RollingRestart(ctx, 2*time.Second)
			},
		},
		{
			Name: "minority-partition", Title: "cut a minority (with the leader when known) from the rest for 25 s, then heal",
			Nodes: 5, Load: 60 * time.Second, Needs: []Need{NeedMesh, NeedPartitions},
			Script: minorityPartition(10*time.Second, 25*time.Second),
		},
		{
			Name: "split-writes", Title: "split 2 | 3 for 30 s while keys are written through both sides, then heal",
			Nodes: 5, Load: 60 * time.Second, Needs: []Need{NeedMesh, NeedPartitions, NeedKeys}, Mix: KeyHeavyMix(),
			Script: func(ctx context.Context, r *Run) error {
				if err := r.SleepUntil(ctx, 10*time.Second); err != nil {
					return err
				}
				ids := r.Others(nil)
				if err := r.Split(ctx, ids[:2], ids[2:]); err != nil {
					return err
				}
				if err := r.SleepUntil(ctx, 40*time.Second); err != nil {
					return err
				}
				return r.Heal(ctx)
			},
		},
		{
			Name: "pause", Title: "SIGSTOP one node for 15 s (gray failure), then SIGCONT",
			Nodes: 5, Load: 60 * time.Second, Needs: []Need{NeedMesh},
			Script: func(ctx context.Context, r *Run) error {
				if err := r.SleepUntil(ctx, 10*time.Second); err != nil {
					return err
				}
				id := r.Pick(r.Up())
				if err := r.Pause(ctx, id); err != nil {
					return err
				}
				if err := r.Sleep(ctx, 15*time.Second); err != nil {
					return err
				}
				return r.Resume(ctx, id)
			},
		},
		{
			Name: "one-way-cut", Title: "the leader (or a node) cannot send to one follower for 15 s, then heal",
			Nodes: 5, Load: 40 * time.Second, Needs: []Need{NeedMesh, NeedPartitions},
			Script: func(ctx context.Context, r *Run) error {
				if err := r.SleepUntil(ctx, 8*time.Second); err != nil {
					return err
				}
				from := r.leaderOrAny(ctx)
				to := r.Pick(r.Others([]string{from}))
				if err := r.Cut(ctx, []string{from}, []string{to}); err != nil {
					return err
				}
				if err := r.Sleep(ctx, 15*time.Second); err != nil {
					return err
				}
				return r.Heal(ctx)
			},
		},
		{
			Name: "short-random-kill", Title: "short: SIGKILL a random node twice, restart each 3 s later",
			Nodes: 3, Load: 24 * time.Second, Needs: []Need{NeedMesh}, Short: true,
			Script: randomKills(4*time.Second, 9*time.Second, 3*time.Second, 2),
		},
		{
			Name: "short-minority-partition", Title: "short: isolate one node (the leader when known) for 10 s, then heal",
			Nodes: 3, Load: 24 * time.Second, Needs: []Need{NeedMesh, NeedPartitions}, Short: true,
			Script: minorityPartition(5*time.Second, 10*time.Second),
		},
	}
}

// Select picks scenarios by a comma-separated list of names, or "all"
// (every full-length scenario) or "short".
func Select(spec string) ([]Scenario, error) {
	all := Catalog()
	var out []Scenario
	for _, name := range strings.Split(spec, ",") {
		name = strings.TrimSpace(name)
		switch name {
		case "":
		case "all":
			for _, s := range all {
				if !s.Short {
					out = append(out, s)
				}
			}
		case "short":
			for _, s := range all {
				if s.Short {
					out = append(out, s)
				}
			}
		default:
			i := slices.IndexFunc(all, func(s Scenario) bool { return s.Name == name })
			if i < 0 {
				names := make([]string, len(all))
				for j, s := range all {
					names[j] = s.Name
				}
				return nil, fmt.Errorf("unknown scenario %q; known: all, short, %s", name, strings.Join(names, ", "))
			}
			out = append(out, all[i])
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no scenario selected by %q", spec)
	}
	return out, nil
}

// randomKills kills a random up node at first, first+every, … (count
// times) and restarts it after down.
func randomKills(first, every, down time.Duration, count int) func(context.Context, *Run) error {
	return func(ctx context.Context, r *Run) error {
		for i := range count {
			if err := r.SleepUntil(ctx, first+time.Duration(i)*every); err != nil {
				return err
			}
			id, err := r.KillRandom(ctx)
			if err != nil {
				return err
			}
			if err := r.Sleep(ctx, down); err != nil {
				return err
			}
			if err := r.Restart(ctx, id); err != nil {
				return err
			}
		}
		return nil
	}
}

// leaderKills kills the leader count times, every apart, restarting it once
// a new leader is seen.
func leaderKills(first, every time.Duration, count int) func(context.Context, *Run) error {
	return func(ctx context.Context, r *Run) error {
		for i := range count {
			if err := r.SleepUntil(ctx, first+time.Duration(i)*every); err != nil {
				return err
			}
			old, err := r.KillLeader(ctx)
			if old != "" && r.cl.State(old) == StateDown {
				if rerr := r.Restart(ctx, old); err == nil {
					err = rerr
				}
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
}

// minorityPartition isolates floor((n-1)/2) nodes, the leader among them when
// the leader can be found, from the rest at `at` for `hold`, then heals.
func minorityPartition(at, hold time.Duration) func(context.Context, *Run) error {
	return func(ctx context.Context, r *Run) error {
		if err := r.SleepUntil(ctx, at); err != nil {
			return err
		}
		size := (len(r.cl.Nodes()) - 1) / 2
		group := []string{r.leaderOrAny(ctx)}
		for len(group) < size {
			group = append(group, r.Pick(r.Others(group)))
		}
		slices.Sort(group)
		if err := r.Isolate(ctx, group); err != nil {
			return err
		}
		if err := r.Sleep(ctx, hold); err != nil {
			return err
		}
		return r.Heal(ctx)
	}
}

// leaderOrAny returns the leader when the state digest can tell, else a
// random up node.
func (r *Run) leaderOrAny(ctx context.Context) string {
	if r.opt.Features.Digest {
		if l, err := r.Leader(ctx); err == nil {
			return l
		}
	}
	return r.Pick(r.Up())
}

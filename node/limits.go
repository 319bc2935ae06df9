package node

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/auth"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/limits"
	"github.com/infermesh/infermesh/node/memtrim"
)

// LimitsConfig is the node's share of the spec's limits: server-wide rates,
// the busy gate that orders work by priority, and the plan a new mesh is
// seeded with.
type LimitsConfig struct {
	// KeyRPM limits each API key that sets no rpm of its own (requests
	// per minute); 0 means none.
	KeyRPM int64
	// ClientRPM limits each client address (IPv6 by /64); 0 means none.
	// The local operator is exempt.
	ClientRPM int64
	// BusyCapacity is how many engine requests run at once before the
	// busy gate queues by priority (0: InflightCap).
	BusyCapacity int
	// BusyQueue is how many requests may wait for a slot (0: four times
	// the capacity); when full, lower-priority waiters are shed first.
	BusyQueue int
	// BusyReserve is how many slots only interactive work may take (0: a
	// quarter of the capacity; -1: none).
	BusyReserve int
	// BusyWait is the longest a request waits for a slot (0: 30s).
	BusyWait time.Duration
	// Plan (free or pro) and FirstPartyApps seed the replicated policy
	// when it has no plan yet; later changes go through the policy.
	Plan string
	// FirstPartyApps are applications whose keys are first-party.
	FirstPartyApps []string
	// ThirdPartyTools are User-Agent products that class keyless callers
	// as third-party on Free (empty: limits.DefaultThirdPartyTools).
	ThirdPartyTools []string
}

func (c LimitsConfig) validate() []error {
	var errs []error
	if c.KeyRPM < 0 || c.ClientRPM < 0 {
		errs = append(errs, fmt.Errorf("rpm %d / client rpm %d: must not be negative", c.KeyRPM, c.ClientRPM))
	}
	if c.BusyCapacity < 0 || c.BusyCapacity > 100000 {
		errs = append(errs, fmt.Errorf("busy capacity %d: want 0 (the in-flight cap) or 1..100000", c.BusyCapacity))
	}
	if c.BusyQueue < 0 || c.BusyQueue > 1000000 {
		errs = append(errs, fmt.Errorf("busy queue %d: want 0..1000000", c.BusyQueue))
	}
	if c.BusyReserve < -1 {
		errs = append(errs, fmt.Errorf("busy reserve %d: want -1 (none), 0 (a quarter) or more", c.BusyReserve))
	}
	if c.BusyWait < 0 || c.BusyWait > time.Hour {
		errs = append(errs, fmt.Errorf("busy wait %s: want 0..1h", c.BusyWait))
	}
	if _, ok := limits.ParsePlan(c.Plan); !ok {
		errs = append(errs, fmt.Errorf("plan %q: want free or pro", c.Plan))
	}
	return errs
}

// backgroundEmbedder runs a batch job's chunks as background work: each
// chunk waits for a busy-gate slot behind interactive requests (never shed:
// the job was accepted), so batch jobs never delay people.
type backgroundEmbedder struct {
	engine.Embedder
	gate *limits.Gate
}

// Embed waits for a background slot, then embeds.
func (b backgroundEmbedder) Embed(ctx context.Context, req engine.EmbedRequest) (engine.EmbedResult, error) {
	release, err := b.gate.Wait(ctx, limits.Background)
	if err != nil {
		return engine.EmbedResult{}, err
	}
	defer release()
	return b.Embedder.Embed(ctx, req)
}

// batchEmbedder is the batch manager's embedder source: the model's
// embedder behind the busy gate once admission is running.
func (n *Node) batchEmbedder(ctx context.Context, model string) (engine.Embedder, error) {
	e, err := n.backend.Embedder(ctx, model)
	if err != nil || n.admission.gate == nil {
		return e, err
	}
	return backgroundEmbedder{Embedder: e, gate: n.admission.gate}, nil
}

// seedPlan writes --plan and --first-party-apps into the replicated policy
// when it has no plan yet (an operator's later policy set wins).
func (n *Node) seedPlan(ctx context.Context) {
	lc := n.cfg.Limits
	if lc.Plan == "" && len(lc.FirstPartyApps) == 0 {
		return
	}
	plan, _ := limits.ParsePlan(lc.Plan)
	p, apps := string(plan), lc.FirstPartyApps
	cmd, err := consensus.UpdatePolicy(consensus.PolicyChange{Plan: &p, FirstPartyApps: &apps, PlanOnlyIfUnset: true})
	if err == nil {
		_, err = n.cluster.raft.Apply(ctx, cmd)
	}
	if err != nil {
		n.log.Warn("could not seed the plan into the replicated policy", "err", err)
	}
}

// newImageGate builds the image gate; each change of its depth goes into
// the node's gossip record (queue depth), which routes image work to the
// least-queued holder.
//
// Once the gate has been empty for imageIdleRelease, the memory the jobs
// freed goes back to the operating system (memtrim): a diffusion job's
// arenas shrink when it ends, but glibc and the Go heap would keep what
// they freed.
func (n *Node) newImageGate() *api.ImageGate {
	g := api.NewImageGate(n.cfg.ImageConcurrency, n.cfg.ImageQueue)
	idle := memtrim.NewIdle(imageIdleRelease)
	g.OnChange(func(depth int) {
		if c := n.cluster; c.mesh != nil {
			c.mesh.SetQueueDepth(depth)
		}
		idle.Busy(depth)
	})
	return g
}

// imageIdleRelease is how long the image gate stays empty before the
// memory freed by image jobs is returned to the operating system.
const imageIdleRelease = 2 * time.Second

// gateLocal passes the model work this node runs itself — its own
// requests and those peers forward to it — through the busy gate, by the
// request's X-Service-Priority. A refusal is 503 with Retry-After, which
// dispatch treats like any busy node: the request moves on to the next
// holder while nothing has reached the client. A live session holds no
// slot (it would hold it for minutes): sessions are capped apart, in the
// API's session limits.
func (n *admission) gateLocal(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.gate == nil || !limits.Gated(auth.Classify(r.Method, r.URL.Path)) || auth.LiveSession(r.Method, r.URL.Path) {
			h.ServeHTTP(w, r)
			return
		}
		release, d := n.gate.Acquire(r.Context(), limits.ParsePriority(r.Header.Get(limits.PriorityHeader)))
		if d != nil {
			apierr.Write(w, denialError(d))
			return
		}
		defer release()
		h.ServeHTTP(w, r)
	})
}

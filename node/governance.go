package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/auth"
)

// governanceDeps are what the api.Governance needs: the raft group (and,
// for the write barrier, the mesh and forward client) once Start built it.
type governanceDeps struct {
	nodeID  string
	cluster *cluster
	log     *slog.Logger
}

// governance is the api.Governance (and api.RaftAdmin) over the raft
// group: writes go through consensus.Apply (forwarded to the leader),
// reads are local; an admin write returns once it is visible (barrier.go).
type governance struct{ governanceDeps }

func newGovernance(d governanceDeps) *governance { return &governance{d} }

var (
	_ api.Governance = (*governance)(nil)
	_ api.RaftAdmin  = (*governance)(nil)
)

const microsPerUnit = 1_000_000

func keyInfo(k consensus.Key) api.KeyInfo {
	info := api.KeyInfo{ID: k.ID, Object: "api_key", Name: k.Name, App: k.App, Admin: k.Admin, Allow: k.Endpoints,
		RPM: k.Limits.RPM, DailyQuota: k.Limits.DailyQuota, MonthlyBudget: float64(k.Limits.MonthlyBudgetMicros) / microsPerUnit,
		CreatedAt: k.CreatedAt.Unix(), Revoked: k.Revoked}
	if info.Allow == nil {
		info.Allow = []string{}
	}
	if !k.ExpiresAt.IsZero() {
		e := k.ExpiresAt.Unix()
		info.ExpiresAt = &e
	}
	return info
}

// applyErr maps consensus errors onto the API's governance errors.
func applyErr(err error) error {
	switch {
	case errors.Is(err, consensus.ErrNoLeader):
		return fmt.Errorf("%w (%v)", api.ErrNoLeader, err)
	case errors.Is(err, consensus.ErrNotFound):
		return fmt.Errorf("%v: %w", err, api.ErrNotFound)
	case errors.Is(err, consensus.ErrInvalid), errors.Is(err, consensus.ErrInvalidCommand):
		return fmt.Errorf("%v: %w", err, api.ErrInvalid)
	}
	return err
}

// CreateKey generates a key, stores its hash through raft and returns the
// plaintext once.
func (n *governance) CreateKey(ctx context.Context, req api.KeyRequest) (api.KeyInfo, string, error) {
	for _, a := range req.Allow {
		if _, ok := auth.ParseClass(a); !ok {
			return api.KeyInfo{}, "", fmt.Errorf("allowlist entry %q is not one of %v: %w", a, auth.AllowlistNames(), api.ErrInvalid)
		}
	}
	plain, hash := auth.NewKey()
	spec := consensus.KeySpec{Hash: consensus.KeyHash(hash), Name: req.Name, App: req.App, Admin: req.Admin, Endpoints: req.Allow,
		Limits: consensus.Limits{RPM: req.RPM, DailyQuota: req.DailyQuota, MonthlyBudgetMicros: int64(req.MonthlyBudget * microsPerUnit)}}
	if req.ExpiresAt != nil {
		spec.ExpiresAt = time.Unix(*req.ExpiresAt, 0)
	}
	cmd, err := consensus.CreateKey(spec)
	if err != nil {
		return api.KeyInfo{}, "", fmt.Errorf("%v: %w", err, api.ErrInvalid)
	}
	res, err := n.cluster.raft.Apply(ctx, cmd)
	if err != nil {
		return api.KeyInfo{}, "", applyErr(err)
	}
	n.writeVisible(ctx, res.Index, false)
	return keyInfo(*res.Key), plain, nil
}

// Keys lists the stored keys (never their plaintext).
func (n *governance) Keys() []api.KeyInfo {
	ks := n.cluster.raft.State().Keys()
	out := make([]api.KeyInfo, 0, len(ks))
	for _, k := range ks {
		out = append(out, keyInfo(k))
	}
	return out
}

// Key returns one stored key.
func (n *governance) Key(id string) (api.KeyInfo, bool) {
	k, ok := n.cluster.raft.State().Key(id)
	if !ok {
		return api.KeyInfo{}, false
	}
	return keyInfo(k), true
}

// RevokeKey revokes a key for good, through raft.
func (n *governance) RevokeKey(ctx context.Context, id string) (api.KeyInfo, error) {
	cmd, err := consensus.RevokeKey(id)
	if err != nil {
		return api.KeyInfo{}, fmt.Errorf("%v: %w", err, api.ErrInvalid)
	}
	res, err := n.cluster.raft.Apply(ctx, cmd)
	if err != nil {
		return api.KeyInfo{}, applyErr(err)
	}
	// Every node that can be reached refuses the key when this returns
	// (see writeVisible).
	n.writeVisible(ctx, res.Index, true)
	return keyInfo(*res.Key), nil
}

// Usage groups the replicated usage totals by app, model, key or worker.
func (n *governance) Usage(by string, since, until time.Time) ([]api.UsageRow, error) {
	dim, err := consensus.ParseUsageDimension(by)
	if err != nil {
		return nil, err
	}
	var r consensus.DayRange
	if !since.IsZero() {
		r.From = consensus.DayOf(since)
	}
	if !until.IsZero() {
		r.To = consensus.DayOf(until)
	}
	rows := n.cluster.raft.State().UsageIn(dim, r)
	out := make([]api.UsageRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, api.UsageRow{Group: r.Group, Requests: r.Requests, PromptTokens: r.InputTokens, CompletionTokens: r.OutputTokens,
			EstimatedCost: float64(r.CostMicros) / microsPerUnit, Errors: r.Errors})
	}
	return out, nil
}

// StateDigest identifies this node's replicated state, for convergence checks.
func (n *governance) StateDigest() api.StateDigest {
	digest, index := n.cluster.raft.State().DigestAt()
	return api.StateDigest{NodeID: n.nodeID, Digest: digest, AppliedIndex: index,
		Leader: n.cluster.raft.Leader(), IsLeader: n.cluster.raft.IsLeader()}
}

package limits

import (
	"context"
	"errors"

	"github.com/infermesh/infermesh/consensus"
)

// Leaser is the limiter's way to the replicated lease and usage tables.
// ConsensusLeaser implements it over a consensus node; every call is a
// raft write except Holdings, a local read.
type Leaser interface {
	// Acquire applies consensus.AcquireLease for this node (the request's
	// NodeID is filled in) and returns the node's holding afterwards.
	Acquire(ctx context.Context, r consensus.LeaseRequest) (consensus.LeaseGrant, error)
	// Settle applies consensus.SettleLeases for this node and returns the
	// holdings afterwards, in request order.
	Settle(ctx context.Context, s []consensus.Settlement) ([]consensus.LeaseGrant, error)
	// Holdings lists this node's holdings in the local replica.
	Holdings() []consensus.LeaseGrant
	// RecordUsage applies consensus.RecordUsage for this node. A batch
	// already applied comes back as consensus.ErrDuplicate.
	RecordUsage(ctx context.Context, seq uint64, entries []consensus.UsageEntry) error
}

// LedgerReader is what a Leaser may also offer: a look at a ledger in the
// local replica (it may lag the leader). With it, a node that many nodes
// share a key with sizes its slices by its own demand, and a node refused
// while the rest of a limit is held by others answers 503 rather than a
// final 429.
type LedgerReader interface {
	// LedgerShare returns the ledger's Used and how many other nodes hold
	// a part of it.
	LedgerShare(keyID string, kind consensus.LeaseKind, period string) (used int64, otherHolders int, ok bool)
}

// ConsensusLeaser is the Leaser of a consensus node.
type ConsensusLeaser struct {
	node *consensus.Node
}

// NewConsensusLeaser returns the Leaser of n.
func NewConsensusLeaser(n *consensus.Node) *ConsensusLeaser { return &ConsensusLeaser{node: n} }

var errNoResult = errors.New("limits: lease command applied without a lease result")

// Acquire implements Leaser.
func (c *ConsensusLeaser) Acquire(ctx context.Context, r consensus.LeaseRequest) (consensus.LeaseGrant, error) {
	r.NodeID = c.node.ID()
	cmd, err := consensus.AcquireLease(r)
	if err != nil {
		return consensus.LeaseGrant{}, err
	}
	res, err := c.node.Apply(ctx, cmd)
	if err != nil {
		return consensus.LeaseGrant{}, err
	}
	if res.Lease == nil {
		return consensus.LeaseGrant{}, errNoResult
	}
	return *res.Lease, nil
}

// Settle implements Leaser.
func (c *ConsensusLeaser) Settle(ctx context.Context, s []consensus.Settlement) ([]consensus.LeaseGrant, error) {
	cmd, err := consensus.SettleLeases(c.node.ID(), s)
	if err != nil {
		return nil, err
	}
	res, err := c.node.Apply(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if len(res.Settled) != len(s) {
		return nil, errNoResult
	}
	return res.Settled, nil
}

// LedgerShare implements LedgerReader from the local replica.
func (c *ConsensusLeaser) LedgerShare(keyID string, kind consensus.LeaseKind, period string) (used int64, otherHolders int, ok bool) {
	lg, ok := c.node.State().Ledger(keyID, kind, period)
	if !ok {
		return 0, 0, false
	}
	for _, h := range lg.Holds {
		if h.NodeID != c.node.ID() && h.Amount > 0 {
			otherHolders++
		}
	}
	return lg.Used, otherHolders, true
}

// Holdings implements Leaser.
func (c *ConsensusLeaser) Holdings() []consensus.LeaseGrant {
	return c.node.State().Holdings(c.node.ID())
}

// RecordUsage implements Leaser.
func (c *ConsensusLeaser) RecordUsage(ctx context.Context, seq uint64, entries []consensus.UsageEntry) error {
	cmd, err := consensus.RecordUsage(c.node.ID(), seq, entries)
	if err != nil {
		return err
	}
	_, err = c.node.Apply(ctx, cmd)
	return err
}

// ConsensusPrices reads model prices from a consensus node's replicated
// policy.
type ConsensusPrices struct {
	node *consensus.Node
}

// NewConsensusPrices returns the price table of n's policy.
func NewConsensusPrices(n *consensus.Node) *ConsensusPrices { return &ConsensusPrices{node: n} }

// Price implements Prices.
func (p *ConsensusPrices) Price(model string) (consensus.Price, bool) {
	mp, ok := p.node.State().ModelPolicy(model)
	if !ok || mp.Price == (consensus.Price{}) {
		return consensus.Price{}, false
	}
	return mp.Price, true
}

// ConsensusPlan is the PlanSource of a consensus node: the replicated
// policy's plan and first-party applications.
type ConsensusPlan struct{ node *consensus.Node }

// NewConsensusPlan returns the PlanSource of n.
func NewConsensusPlan(n *consensus.Node) *ConsensusPlan { return &ConsensusPlan{node: n} }

// PlanSettings implements PlanSource.
func (p *ConsensusPlan) PlanSettings() PlanSettings {
	pl, apps := p.node.State().Plan()
	plan, _ := ParsePlan(pl)
	return PlanSettings{Plan: plan, FirstPartyApps: apps}
}

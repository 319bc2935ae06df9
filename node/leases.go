package node

import (
	"context"
	"errors"
	"time"
)

// leaseReturnBound caps how long a draining node tries to return its quota
// leases and send its last usage; beyond it the leader's TTL reclaims the
// leases anyway.
const leaseReturnBound = 10 * time.Second

// errNoLeaderToReturn ends the lease return of a node that has no raft
// leader to return leases to (the last node of a stopping mesh, or one cut
// off from the majority): retrying could only wait for the drain timeout.
var errNoLeaderToReturn = errors.New("no raft leader is reachable; quota leases are left to expire at the leader")

// drainLimiter returns the node's quota leases and its last usage, bounded
// by ctx, by leaseReturnBound, and by the raft leader: when no leader has
// been known for noLeaderGrace the attempt stops at once.
func (n *Node) drainLimiter(ctx context.Context) error {
	if n.admission.limiter == nil {
		return nil
	}
	ctx, cancel := context.WithTimeoutCause(ctx, leaseReturnBound, errors.New("lease return took longer than its bound"))
	defer cancel()
	if c := n.cluster; c.raft != nil {
		ctx, cancelCause := context.WithCancelCause(ctx)
		defer cancelCause(nil)
		go func() {
			const noLeaderGrace = 1500 * time.Millisecond // longer than an election
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			var since time.Time
			for {
				if c.raft.Leader() == "" {
					if since.IsZero() {
						since = time.Now()
					}
					if time.Since(since) >= noLeaderGrace {
						cancelCause(errNoLeaderToReturn)
						return
					}
				} else {
					since = time.Time{}
				}
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
		err := n.admission.limiter.Drain(ctx)
		if err != nil && context.Cause(ctx) != nil {
			return context.Cause(ctx)
		}
		return err
	}
	return n.admission.limiter.Drain(ctx)
}

package consensus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// errNotApplied marks a failure that certainly left the log untouched, so
// Apply may try again (possibly on another leader).
var errNotApplied = errors.New("consensus: not applied")

// Apply commits cmd through raft and returns the state machine's result. It
// works on any node: the leader appends to its log; a follower forwards the
// command to the leader over ConsensusService and returns the leader's
// applied result. While no leader is reachable it retries for
// Config.LeaderWait (or until ctx ends), then returns an error matching
// ErrNoLeader. A command the state machine refused comes back as a
// *RejectedError. Apply never changes cmd.
func (n *Node) Apply(ctx context.Context, cmd *Command) (Result, error) {
	start := time.Now()
	if err := checkCommand(cmd); err != nil {
		n.metrics.applyErrors.WithLabelValues("invalid").Inc()
		return Result{}, err
	}
	deadline := start.Add(n.cfg.LeaderWait)
	backoff := 5 * time.Millisecond
	var lastErr error
	for {
		if err := ctx.Err(); err != nil {
			return Result{}, fmt.Errorf("%w: %w", ErrNoLeader, err)
		}
		var (
			res  *pb.ApplyResult
			err  error
			path string
		)
		if n.raft.State() == raft.Leader {
			path = "leader"
			res, err = n.applyLocal(ctx, cmd)
		} else if leader := n.Leader(); leader != "" && leader != n.cfg.NodeID {
			path = "forwarded"
			res, err = n.forward(ctx, leader, cmd)
		} else {
			err = fmt.Errorf("%w: no leader known", errNotApplied)
		}
		if err == nil {
			n.metrics.applySeconds.WithLabelValues(path).Observe(time.Since(start).Seconds())
			return resultFromProto(res)
		}
		if !errors.Is(err, errNotApplied) {
			n.metrics.applyErrors.WithLabelValues(errorReason(err)).Inc()
			return Result{}, err
		}
		lastErr = err
		if time.Now().Add(backoff).After(deadline) {
			n.metrics.applyErrors.WithLabelValues("no_leader").Inc()
			return Result{}, fmt.Errorf("%w: %v", ErrNoLeader, lastErr)
		}
		if !sleepCtx(ctx, backoff) {
			n.metrics.applyErrors.WithLabelValues("no_leader").Inc()
			return Result{}, fmt.Errorf("%w: %w (last: %v)", ErrNoLeader, ctx.Err(), lastErr)
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

func errorReason(err error) string {
	switch {
	case errors.Is(err, ErrOutcomeUnknown):
		return "outcome_unknown"
	case errors.Is(err, ErrNoLeader):
		return "no_leader"
	case errors.Is(err, ErrHalted):
		return "halted"
	case errors.Is(err, ErrInvalidCommand):
		return "invalid"
	}
	return "other"
}

// checkCommand refuses what must never reach the log: a missing command, a
// known type whose payload does not decode, and an unknown type that is
// not ignorable (this node's state machine would halt on it).
func checkCommand(cmd *Command) error {
	if cmd == nil {
		return fmt.Errorf("%w: nil command", ErrInvalidCommand)
	}
	msg := payloadFor(cmd.GetType())
	if msg == nil {
		if cmd.GetIgnorable() {
			return nil
		}
		return fmt.Errorf("%w: command type %d is unknown to this version and not ignorable", ErrInvalidCommand, int32(cmd.GetType()))
	}
	if err := proto.Unmarshal(cmd.GetPayload(), msg); err != nil {
		return fmt.Errorf("%w: %s payload: %v", ErrInvalidCommand, cmd.GetType(), err)
	}
	return nil
}

// applyLocal appends cmd on this node, which believes it is the leader. The
// command's time is stamped from the leader's clock when unset. When ctx
// ends first the outcome is unknown: the entry may still commit.
func (n *Node) applyLocal(ctx context.Context, cmd *Command) (*pb.ApplyResult, error) {
	c := &pb.Command{Type: cmd.GetType(), Ignorable: cmd.GetIgnorable(), TimeUnixNano: cmd.GetTimeUnixNano(), Payload: cmd.GetPayload()}
	if c.TimeUnixNano == 0 {
		c.TimeUnixNano = n.cfg.Clock.Now().UnixNano()
	}
	data, err := proto.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidCommand, err)
	}
	f := n.raft.Apply(data, n.cfg.ApplyTimeout)
	done := make(chan struct{})
	go func() {
		_ = f.Error()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, outcomeUnknown(ctx.Err())
	}
	if err := f.Error(); err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress),
			errors.Is(err, raft.ErrEnqueueTimeout):
			// Refused before the entry was dispatched.
			return nil, fmt.Errorf("%w: %w", errNotApplied, err)
		}
		return nil, outcomeUnknown(err)
	}
	out, ok := f.Response().(applyOutcome)
	if !ok {
		return nil, fmt.Errorf("consensus: unexpected state machine response %T", f.Response())
	}
	if out.err != nil {
		return nil, out.err
	}
	return out.res, nil
}

func sortServers(s []Server) {
	slices.SortFunc(s, func(a, b Server) int { return cmp.Compare(a.ID, b.ID) })
}

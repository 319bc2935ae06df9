package consensus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/infermesh/infermesh/consensus/rpcmux"
	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
	"github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1/consensusv1connect"
)

// maxMessageBytes bounds ConsensusService messages.
const maxMessageBytes = 8 << 20

// forwarder keeps one Connect client per leader address.
type forwarder struct {
	httpClient *http.Client
	ownsClient bool
	opts       []connect.ClientOption
	timeout    time.Duration

	mu      sync.Mutex
	clients map[string]consensusv1connect.ConsensusServiceClient
}

func newForwarder(cfg Config) *forwarder {
	f := &forwarder{
		httpClient: cfg.HTTPClient,
		opts:       []connect.ClientOption{connect.WithReadMaxBytes(maxMessageBytes), connect.WithSendMaxBytes(maxMessageBytes)},
		timeout:    cfg.ApplyTimeout + 2*time.Second,
		clients:    map[string]consensusv1connect.ConsensusServiceClient{},
	}
	if f.httpClient == nil {
		f.httpClient, f.ownsClient = rpcmux.NewClient(2*time.Second), true
	}
	if cfg.PeerAuth.Client != nil {
		f.opts = append(f.opts, connect.WithInterceptors(cfg.PeerAuth.Client))
	}
	return f
}

func (f *forwarder) client(addr string) consensusv1connect.ConsensusServiceClient {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.clients[addr]
	if c == nil {
		c = consensusv1connect.NewConsensusServiceClient(f.httpClient, "http://"+addr, f.opts...)
		f.clients[addr] = c
	}
	return c
}

func (f *forwarder) close() {
	if f.ownsClient {
		f.httpClient.CloseIdleConnections()
	}
}

// forward sends cmd to the leader, found by id in the member table (its
// advertised RPC address) or else by its raft address.
func (n *Node) forward(ctx context.Context, leaderID string, cmd *Command) (*pb.ApplyResult, error) {
	addr := ""
	if e, ok := n.members.get(leaderID); ok {
		addr = e.addr
	}
	if addr == "" {
		raftAddr, id := n.raft.LeaderWithID()
		if string(id) != leaderID || raftAddr == "" {
			return nil, fmt.Errorf("%w: no address for leader %s", errNotApplied, leaderID)
		}
		addr = string(raftAddr)
	}
	ctx, cancel := context.WithTimeout(ctx, n.fwd.timeout)
	defer cancel()
	ctx, stopWatch := n.whileLeader(ctx, leaderID)
	defer stopWatch()
	req := connect.NewRequest(&pb.ApplyRequest{Command: cmd, OriginNodeId: n.cfg.NodeID})
	resp, err := n.fwd.client(addr).Apply(ctx, req)
	if err == nil {
		return resp.Msg.GetResult(), nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, errLeaderChanged) {
		// The leader this attempt went to lost its place (a partition or a
		// crash): stop waiting for an answer that may never come. The call
		// may have reached it, so the outcome is unknown.
		return nil, outcomeUnknown(fmt.Errorf("forward to %s: %w", leaderID, cause))
	}
	var op *net.OpError
	switch code := connect.CodeOf(err); {
	case code == connect.CodeFailedPrecondition:
		// The callee is not (or no longer) the leader; nothing was appended.
		return nil, fmt.Errorf("%w: %s: %w", errNotApplied, leaderID, err)
	case errors.As(err, &op) && op.Op == "dial":
		return nil, fmt.Errorf("%w: %s: %w", errNotApplied, leaderID, err)
	case code == connect.CodeUnauthenticated:
		return nil, fmt.Errorf("%w: leader %s refused this node's authentication (another cluster secret?): %w", ErrNoLeader, leaderID, err)
	case code == connect.CodeInvalidArgument:
		return nil, fmt.Errorf("%w: leader %s: %w", ErrInvalidCommand, leaderID, err)
	case code == connect.CodeAborted:
		return nil, fmt.Errorf("%w: leader %s: %w", ErrHalted, leaderID, err)
	}
	return nil, outcomeUnknown(fmt.Errorf("forward to %s: %w", leaderID, err))
}

// errLeaderChanged ends a forwarded attempt whose leader this node no
// longer follows.
var errLeaderChanged = errors.New("consensus: leader changed while the call was in flight")

// leaderPoll is how often an in-flight forward checks that its leader is
// still the one this node follows. Raft notices a lost leader after its
// heartbeat timeout; this adds at most one poll to that.
const leaderPoll = 20 * time.Millisecond

// leaderGrace is how long a call whose leader changed may still answer
// (a leader handing over on shutdown answers what it holds) before the
// caller gives up on it.
const leaderGrace = 250 * time.Millisecond

// whileLeader returns a context that ends, with cause errLeaderChanged,
// leaderGrace after this node stops naming leaderID as the leader
// (another leader was elected, or this node's heartbeat timeout fired and
// it no longer knows one). Without it a call to a leader cut off by a partition would wait
// out its whole timeout, although raft has already given up on it. stop
// releases the watch.
func (n *Node) whileLeader(parent context.Context, leaderID string) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(leaderPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if n.Leader() != leaderID {
					// A leader that hands over on shutdown still answers
					// the calls it holds: give the answer a moment.
					g := time.NewTimer(leaderGrace)
					defer g.Stop()
					select {
					case <-done:
					case <-ctx.Done():
					case <-g.C:
						cancel(errLeaderChanged)
					}
					return
				}
			}
		}
	}()
	return ctx, func() {
		close(done)
		cancel(nil)
	}
}

// Handler returns the ConsensusService path and handler, to be mounted on
// the HTTP side of the internal RPC port (node/cluster.go). Calls go
// through Config.PeerAuth.Handler, which refuses unauthenticated ones with
// UNAUTHENTICATED; without one, every call is refused.
func (n *Node) Handler() (string, http.Handler) {
	auth := n.cfg.PeerAuth.Handler
	if auth == nil {
		auth = connect.UnaryInterceptorFunc(refuseAll)
	}
	return consensusv1connect.NewConsensusServiceHandler(&service{n: n},
		connect.WithInterceptors(auth),
		connect.WithReadMaxBytes(maxMessageBytes), connect.WithSendMaxBytes(maxMessageBytes))
}

// refuseAll is the handler interceptor of a node configured without peer
// authentication: nobody may call it.
func refuseAll(connect.UnaryFunc) connect.UnaryFunc {
	return func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("consensus: no peer authentication configured; refusing every call"))
	}
}

type service struct {
	n *Node
}

// Apply serves forwarded commands on the leader.
func (s *service) Apply(ctx context.Context, req *connect.Request[pb.ApplyRequest]) (*connect.Response[pb.ApplyResponse], error) {
	cmd := req.Msg.GetCommand()
	if err := checkCommand(cmd); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if !s.n.serving.enter() {
		// Shutting down: nothing appended, so the caller retries on the
		// next leader instead of losing the call when this port closes.
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("shutting down"))
	}
	defer s.n.serving.leave()
	if !s.n.IsLeader() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("not the leader"))
	}
	start := time.Now()
	res, err := s.n.applyLocal(ctx, cmd)
	switch {
	case err == nil:
		s.n.metrics.applySeconds.WithLabelValues("served").Observe(time.Since(start).Seconds())
		return connect.NewResponse(&pb.ApplyResponse{Result: res}), nil
	case errors.Is(err, errNotApplied):
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.Is(err, ErrHalted):
		return nil, connect.NewError(connect.CodeAborted, err)
	case errors.Is(err, ErrInvalidCommand):
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return nil, connect.NewError(connect.CodeUnavailable, err)
}

// applyGate counts the forwarded commands this node is serving, so a
// shutdown refuses new ones and lets those under way answer before the
// RPC port closes (a cut connection leaves the caller not knowing
// whether its write happened).
type applyGate struct {
	mu       sync.Mutex
	stopping bool
	active   sync.WaitGroup
}

// enter admits one call; false once the node is shutting down.
func (g *applyGate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopping {
		return false
	}
	g.active.Add(1)
	return true
}

// leave ends a call enter admitted.
func (g *applyGate) leave() { g.active.Done() }

// refuse turns every later call away.
func (g *applyGate) refuse() {
	g.mu.Lock()
	g.stopping = true
	g.mu.Unlock()
}

// wait waits for the calls under way, or until ctx ends.
func (g *applyGate) wait(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		g.active.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

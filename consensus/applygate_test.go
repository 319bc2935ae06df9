package consensus

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
)

// TestApplyGateDrainsCallsUnderWay: once a shutdown begins, new forwarded
// commands are refused with FailedPrecondition (the caller's "nothing was
// appended, try the next leader"), and the wait ends only when the calls
// already under way have answered.
func TestApplyGateDrainsCallsUnderWay(t *testing.T) {
	var g applyGate
	if !g.enter() {
		t.Fatal("a running node must admit a call")
	}
	g.refuse()
	if g.enter() {
		t.Fatal("a call admitted after the shutdown began")
	}
	waited := make(chan struct{})
	go func() {
		g.wait(context.Background())
		close(waited)
	}()
	select {
	case <-waited:
		t.Fatal("wait returned with a call still under way")
	default:
	}
	g.leave()
	<-waited

	// A wait bounded by its context ends even if a call never answers.
	var stuck applyGate
	stuck.enter()
	stuck.refuse()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	stuck.wait(ctx)

	// The service answers a refused call the way forward() retries.
	s := &service{n: &Node{}}
	s.n.serving.refuse()
	cmd := &pb.Command{Type: pb.CommandType_COMMAND_TYPE_KEY_CREATE}
	_, err := s.Apply(context.Background(), connect.NewRequest(&pb.ApplyRequest{Command: cmd}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("refused call: %v, want FailedPrecondition", err)
	}
}

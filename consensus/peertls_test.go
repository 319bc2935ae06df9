package consensus_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
	"github.com/infermesh/infermesh/consensus/rpcmux"
	"github.com/infermesh/infermesh/consensus/rpcmux/tlstest"
	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
	"github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1/consensusv1connect"
)

// A three-node cluster under mutual TLS forms, replicates and forwards;
// nodes with a certificate from another CA or an expired one never take
// part; rotating every node's certificate (and then the CA) without a
// restart keeps it working.
func TestClusterUnderPeerTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "mesh-ca")
	other := tlstest.NewCA(t, "other-ca")
	var mu sync.Mutex
	peers := map[string]*rpcmux.PeerTLS{}
	get := func(id string) *rpcmux.PeerTLS {
		mu.Lock()
		defer mu.Unlock()
		if p := peers[id]; p != nil {
			return p
		}
		var p *rpcmux.PeerTLS
		var err error
		switch id {
		case "intruder": // trusts our CA, but its certificate is another CA's
			p, err = rpcmux.NewPeerTLS(other.Valid(t, id).TLS, ca.Pool())
		case "stale":
			p, err = rpcmux.NewPeerTLS(ca.Expired(t, id).TLS, ca.Pool())
		default:
			p, err = rpcmux.NewPeerTLS(ca.Valid(t, id).TLS, ca.Pool())
		}
		if err != nil {
			t.Fatal(err)
		}
		peers[id] = p
		return p
	}
	c := startThree(t, consensustest.Options{PeerTLS: get, Configure: func(cfg *consensus.Config) { cfg.LeaderWait = 500 * time.Millisecond }})
	for _, p := range c.Running() {
		c.Apply(p, createKey("sk-mtls-"+p.ID, 0))
	}
	c.Converged()

	// Outsiders: the leader adds them as non-voters (the mesh says they
	// are alive) but can never reach them, and they cannot reach it.
	for _, id := range []string{"intruder", "stale"} {
		p := c.StartPeer(id, true)
		c.WaitFor(id+"'s handshakes to be refused", func() bool { return p.TLSRefused() > 0 })
		_, err := p.Node.Apply(context.Background(), createKey("sk-from-"+id, 0))
		if !errors.Is(err, consensus.ErrNoLeader) {
			t.Fatalf("write through %s: %v, want ErrNoLeader", id, err)
		}
		if n := len(p.Node.State().Keys()); n != 0 || p.Node.Leader() != "" {
			t.Fatalf("%s learned %d keys and leader %q", id, n, p.Node.Leader())
		}
		c.Kill(id)
	}
	// And the outsiders' own dials to a member (raft and Connect, with
	// the right cluster secret and signatures) are refused by TLS.
	member := c.Leader()
	auth, err := consensustest.PeerAuth("test-cluster-secret")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"intruder", "stale"} {
		before := member.TLSRefused()
		if _, err := rpcmux.DialRaftTLS(member.Addr, "test-cluster-secret", get(id), 5*time.Second); err == nil {
			t.Fatalf("%s dialled raft on %s", id, member.ID)
		}
		client := consensusv1connect.NewConsensusServiceClient(rpcmux.NewPeerClient(5*time.Second, get(id)), "http://"+member.Addr, connect.WithInterceptors(auth.Client))
		if _, err := client.Apply(context.Background(), connect.NewRequest(&pb.ApplyRequest{Command: createKey("sk-"+id, 0), OriginNodeId: id})); err == nil {
			t.Fatalf("%s called ConsensusService on %s", id, member.ID)
		}
		c.WaitFor(member.ID+" to count both refusals", func() bool { return member.TLSRefused() >= before+2 })
	}
	if n := len(member.Node.State().Keys()); n != 3 {
		t.Fatalf("%d keys on %s, want 3", n, member.ID)
	}

	// Rotation: every member gets a new certificate, then the leader is
	// restarted so that every connection to and from it is new.
	for _, p := range c.Running() {
		if err := get(p.ID).Update(ca.Valid(t, p.ID).TLS, ca.Pool()); err != nil {
			t.Fatal(err)
		}
	}
	old := c.Leader().ID
	c.Kill(old)
	c.StartPeer(old, true)
	c.WaitServers([]string{"n1", "n2", "n3"}, nil)
	for _, p := range c.Running() {
		c.Apply(p, createKey("sk-rotated-"+p.ID, 0))
	}
	c.Converged()
	if n := len(c.Leader().Node.State().Keys()); n != 6 {
		t.Fatalf("%d keys, want 6", n)
	}
}

package consensus_test

import (
	"net"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
	"github.com/infermesh/infermesh/consensus/rpcmux"
)

// rawRaft is a raft speaker outside the cluster: hashicorp/raft's own
// NetworkTransport (msgpack RPCs) over connections that dial decides how
// to open, as an attacker on the RPC port would use it.
type rawRaft struct {
	net.Listener
	dial func(addr string, timeout time.Duration) (net.Conn, error)
}

// Dial opens a connection to a node's RPC port.
func (r rawRaft) Dial(a raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return r.dial(string(a), timeout)
}

func newRawRaft(t *testing.T, dial func(addr string, timeout time.Duration) (net.Conn, error)) *raft.NetworkTransport {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: rawRaft{Listener: ln, dial: dial}, MaxPool: 1, Timeout: 5 * time.Second, Logger: hclog.NewNullLogger(),
	})
	t.Cleanup(func() { tr.Close() })
	return tr
}

// muxByteOnly opens a connection the way raft's side of the port did before
// the handshake existed: the mux byte, then raft's bytes.
func muxByteOnly(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte{rpcmux.RaftByte}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// forgedAppend is an AppendEntries from a self-declared leader of a much
// higher term whose one entry creates an admin key, committed at once.
func forgedAppend(t *testing.T, plaintext string, prevIndex, prevTerm uint64) *raft.AppendEntriesRequest {
	t.Helper()
	cmd, err := consensus.CreateKey(consensus.KeySpec{Hash: keyHash(plaintext), Name: "backdoor", App: "attacker", Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	data, err := proto.Marshal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	const term = 1000
	return &raft.AppendEntriesRequest{
		RPCHeader:         raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("attacker"), Addr: []byte("127.0.0.1:1")},
		Term:              term,
		PrevLogEntry:      prevIndex,
		PrevLogTerm:       prevTerm,
		Entries:           []*raft.Log{{Index: prevIndex + 1, Term: term, Type: raft.LogCommand, Data: data}},
		LeaderCommitIndex: prevIndex + 1,
	}
}

func hasKey(n *consensus.Node, plaintext string) bool {
	_, ok := n.State().KeyByHash(keyHash(plaintext))
	return ok
}

// TestRaftRefusesConnectionsWithoutTheSecret replays the attack on the raft
// port: a process without the cluster secret writes the mux byte and then a
// forged AppendEntries. Every node refuses the connection before raft reads
// it, and nothing is appended. The same forged RPC from a speaker that
// holds the secret passes the handshake and is applied, which shows that
// the handshake, not the payload, is what stops the attack.
func TestRaftRefusesConnectionsWithoutTheSecret(t *testing.T) {
	c := startThree(t, consensustest.Options{Secret: "raft-secret"})
	c.Apply(c.Peer("n1"), createKey("sk-before", 0))
	digest := c.Converged()

	attacker := newRawRaft(t, muxByteOnly)
	for _, p := range c.Running() {
		_, index := p.Node.State().DigestAt()
		var resp raft.AppendEntriesResponse
		err := attacker.AppendEntries("n1", raft.ServerAddress(p.Addr), forgedAppend(t, "sk-backdoor", index, 1), &resp)
		if err == nil {
			t.Fatalf("%s answered a raft RPC from a client without the secret: %+v", p.ID, resp)
		}
		c.WaitFor(p.ID+" to count the refused handshake", func() bool { return p.RaftRefused() > 0 })
	}
	// Wrong secret, with the handshake played properly: refused as well.
	wrong := newRawRaft(t, func(addr string, timeout time.Duration) (net.Conn, error) {
		return rpcmux.DialRaft(addr, "guessed-secret", timeout)
	})
	for _, p := range c.Running() {
		var resp raft.AppendEntriesResponse
		if err := wrong.AppendEntries("n1", raft.ServerAddress(p.Addr), forgedAppend(t, "sk-backdoor", 1, 1), &resp); err == nil {
			t.Fatalf("%s answered a raft RPC from a client with a wrong secret", p.ID)
		}
	}
	// The refused connections changed nothing: a write after them is the
	// only new entry everywhere.
	c.Apply(c.Peer("n2"), createKey("sk-after", 0))
	if after := c.Converged(); after == digest {
		t.Fatal("the write after the attack did not apply")
	}
	for _, p := range c.Running() {
		if hasKey(p.Node, "sk-backdoor") || !hasKey(p.Node, "sk-after") || len(p.Node.State().Keys()) != 2 {
			t.Fatalf("%s holds %d keys (backdoor %v)", p.ID, len(p.Node.State().Keys()), hasKey(p.Node, "sk-backdoor"))
		}
	}

	// With the secret the handshake passes and raft takes the RPC: a
	// joining node with an empty log accepts the forged leader's entry.
	fresh := consensustest.New(t, consensustest.Options{Secret: "raft-secret", Logger: testLogger()})
	victim := fresh.StartPeer("victim", true)
	insider := newRawRaft(t, func(addr string, timeout time.Duration) (net.Conn, error) {
		return rpcmux.DialRaft(addr, "raft-secret", timeout)
	})
	var resp raft.AppendEntriesResponse
	if err := insider.AppendEntries("victim", raft.ServerAddress(victim.Addr), forgedAppend(t, "sk-insider", 0, 0), &resp); err != nil {
		t.Fatalf("raft RPC with the secret: %v", err)
	}
	if !resp.Success {
		t.Fatalf("raft refused the entry: %+v", resp)
	}
	fresh.WaitFor("the entry to apply", func() bool { return hasKey(victim.Node, "sk-insider") })
	if victim.RaftRefused() != 0 {
		t.Fatalf("a handshake with the secret was refused %d times", victim.RaftRefused())
	}
}

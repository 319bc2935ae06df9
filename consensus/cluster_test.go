package consensus_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
	"github.com/infermesh/infermesh/consensus/routing"
	"github.com/infermesh/infermesh/consensus/rpcmux"
	pb "github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1"
	"github.com/infermesh/infermesh/proto/gen/infermesh/consensus/v1/consensusv1connect"
)

func testLogger() *slog.Logger {
	if os.Getenv("INFERMESH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// keyHash is the SHA-256 of a plaintext key, as node/auth.HashKey.
func keyHash(plaintext string) consensus.KeyHash { return sha256.Sum256([]byte(plaintext)) }

func createKey(plaintext string, daily int64) *consensus.Command {
	return must(consensus.CreateKey(consensus.KeySpec{
		Hash: keyHash(plaintext), Name: "test key", App: "app",
		Endpoints: []string{"chat"}, Limits: consensus.Limits{DailyQuota: daily},
	}))
}

func startThree(t *testing.T, opts consensustest.Options) *consensustest.Cluster {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger()
	}
	c := consensustest.New(t, opts)
	c.Start(3)
	c.WaitServers([]string{"n1", "n2", "n3"}, nil)
	return c
}

func TestClusterBootstrapJoinAndReplicate(t *testing.T) {
	c := startThree(t, consensustest.Options{})
	f := c.Followers()[0]
	res, err := f.Node.Apply(context.Background(), createKey("sk-through-follower", 0))
	if err != nil {
		t.Fatalf("apply through follower %s: %v", f.ID, err)
	}
	if res.Key == nil || res.Key.Hash != keyHash("sk-through-follower") || res.Index == 0 {
		t.Fatalf("result %+v", res)
	}
	c.Converged()
	for _, p := range c.Running() {
		k, ok := p.Node.State().KeyByHash(keyHash("sk-through-follower"))
		if !ok || k.ID != res.Key.ID {
			t.Fatalf("%s does not have the key", p.ID)
		}
		if p.Node.State().AppliedIndex() < res.Index {
			t.Fatalf("%s applied index below the write's", p.ID)
		}
	}
	if got := f.Metric("infermesh_consensus_leader"); got != 0 {
		t.Fatalf("follower leader gauge %v", got)
	}
	if got := c.Leader().Metric("infermesh_consensus_leader"); got != 1 {
		t.Fatalf("leader gauge %v", got)
	}
	// A refusal travels back from the leader as a typed error.
	_, err = f.Node.Apply(context.Background(), must(consensus.RevokeKey("no-such-key")))
	var rej *consensus.RejectedError
	if !errors.As(err, &rej) || !errors.Is(err, consensus.ErrNotFound) || rej.Index == 0 {
		t.Fatalf("revoke of a missing key through a follower: %v", err)
	}
}

func TestClusterLeaderFailover(t *testing.T) {
	c := startThree(t, consensustest.Options{})
	old := c.Leader()
	c.Apply(c.Followers()[0], createKey("sk-before", 0))
	c.Converged()
	c.Kill(old.ID)

	leader := c.Leader()
	if leader.ID == old.ID {
		t.Fatal("the killed node still leads")
	}
	for _, p := range c.Running() {
		if _, ok := p.Node.State().KeyByHash(keyHash("sk-before")); !ok {
			t.Fatalf("%s lost the key written before the failover", p.ID)
		}
	}
	for _, p := range c.Running() {
		c.Apply(p, createKey("sk-after-"+p.ID, 0))
	}
	c.Converged()
	for _, p := range c.Running() {
		if n := len(p.Node.State().Keys()); n != 3 {
			t.Fatalf("%s has %d keys, want 3", p.ID, n)
		}
	}
}

func TestLeaderLeavesGracefully(t *testing.T) {
	c := startThree(t, consensustest.Options{})
	c.Apply(c.Leader(), createKey("sk-1", 0))
	old := c.Leader().ID
	c.Leave(old)
	// Two servers remain: one voter (the new leader) and one non-voter,
	// never two voters.
	voters, _ := c.WaitCounts(1, 1)
	if voters[0] != c.Leader().ID || voters[0] == old {
		t.Fatal("the departed node still leads")
	}
	for _, p := range c.Running() {
		c.Apply(p, createKey("sk-via-"+p.ID, 0))
	}
	c.Converged()
	// It may come back; the leader adds it again.
	c.StartPeer(old, true)
	c.WaitServers([]string{"n1", "n2", "n3"}, nil)
	c.Converged()
	if n := len(c.Peer(old).Node.State().Keys()); n != 3 {
		t.Fatalf("returning node has %d keys, want 3", n)
	}
}

func TestClusterRestartRecoversStateAndRejoins(t *testing.T) {
	c := startThree(t, consensustest.Options{})
	for i := range 5 {
		c.Apply(c.Leader(), createKey(fmt.Sprintf("sk-%d", i), 10))
	}
	victim := c.Followers()[0]
	if err := victim.Node.Snapshot(); err != nil {
		t.Fatal(err)
	}
	c.Apply(c.Leader(), createKey("sk-after-snapshot", 10))
	digest := c.Converged()
	c.Kill(victim.ID)

	c.Apply(c.Leader(), createKey("sk-while-down", 0))
	back := c.StartPeer(victim.ID, true)
	if back.Addr == victim.Addr {
		t.Fatal("restarted on the same port; the test needs an address change")
	}
	after := c.Converged()
	if after == digest {
		t.Fatal("the write made while the node was down is missing")
	}
	if _, ok := back.Node.State().KeyByHash(keyHash("sk-while-down")); !ok {
		t.Fatal("restarted node did not catch up")
	}
	// It rejoined as the same voter, found by id at its new address.
	c.WaitServers([]string{"n1", "n2", "n3"}, nil)
	c.WaitFor("the leader to dial the new address", func() bool {
		servers, err := c.Leader().Node.Servers()
		if err != nil {
			return false
		}
		for _, s := range servers {
			if s.ID == back.ID {
				return s.Address == back.Addr
			}
		}
		return false
	})
	c.Apply(back, createKey("sk-through-restarted", 0))
	c.Converged()
}

func TestSingleNodeRestartRecoversFromDisk(t *testing.T) {
	c := consensustest.New(t, consensustest.Options{Logger: testLogger()})
	c.Start(1)
	p := c.Peer("n1")
	c.Apply(p, createKey("sk-1", 5))
	c.Apply(p, must(consensus.SetPolicy(consensus.Policy{Nodes: []consensus.NodePolicy{{NodeID: "n1", Node: routing.Node{Weight: 3}}}}, false)))
	if err := p.Node.Snapshot(); err != nil {
		t.Fatal(err)
	}
	c.Apply(p, must(consensus.AcquireLease(consensus.LeaseRequest{NodeID: "n1", KeyID: must(p.Node.Apply(context.Background(), createKey("sk-2", 9))).Key.ID, Kind: consensus.LeaseDailyRequests, Want: 4, TTL: time.Hour})))
	c.Apply(p, must(consensus.RecordUsage("n1", 1, []consensus.UsageEntry{{App: "app", Model: "m", Requests: 3}})))
	digest, index := p.Node.State().DigestAt()
	c.Kill("n1")

	// Without peers, the node's state comes back from its snapshot and log.
	back := c.StartPeer("n1", false)
	c.WaitFor("the restarted node to apply its log", func() bool {
		return back.Node.State().AppliedIndex() >= index
	})
	if got, _ := back.Node.State().DigestAt(); got != digest {
		t.Fatalf("digest after restart %s, want %s", got, digest)
	}
	c.Apply(back, createKey("sk-3", 0))
}

func TestNonVoterJoinsAndIsPromoted(t *testing.T) {
	c := startThree(t, consensustest.Options{Voters: 3})
	c.StartPeer("n4", true)
	c.WaitServers([]string{"n1", "n2", "n3"}, []string{"n4"})
	res := c.Apply(c.Peer("n4"), createKey("sk-from-nonvoter", 0))
	if res.Key == nil {
		t.Fatal("no key in the result of a write through a non-voter")
	}
	gone := c.Followers()[0].ID
	c.Leave(gone)
	var want []string
	for _, id := range []string{"n1", "n2", "n3", "n4"} {
		if id != gone {
			want = append(want, id)
		}
	}
	c.WaitServers(want, nil)
	c.Converged()
}

func TestFailedServerIsReapedOnlyAfterTimeout(t *testing.T) {
	clock := consensustest.NewManualClock(time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC))
	c := startThree(t, consensustest.Options{Voters: 3, ReapTimeout: time.Hour, Clock: clock})
	c.StartPeer("n4", true)
	c.WaitServers([]string{"n1", "n2", "n3"}, []string{"n4"})
	leader := c.Leader()
	victim := c.Followers()[0].ID
	if victim == "n4" {
		victim = c.Followers()[1].ID
	}
	c.Kill(victim)

	// Let the leader finish several full passes with the clock standing
	// still: the failed voter must stay.
	passes := leader.Metric("infermesh_consensus_reconcile_passes_total")
	c.WaitFor("three reconcile passes", func() bool {
		return leader.Metric("infermesh_consensus_reconcile_passes_total") >= passes+3
	})
	c.WaitServers([]string{"n1", "n2", "n3"}, []string{"n4"})

	clock.Advance(time.Hour)
	var want []string
	for _, id := range []string{"n1", "n2", "n3", "n4"} {
		if id != victim {
			want = append(want, id)
		}
	}
	c.WaitServers(want, nil)
	// The configuration becomes visible before changeConfig counts the
	// change, so wait for the counter rather than reading it once.
	c.WaitFor("2 add_voter, 1 add_nonvoter, 1 remove and 1 promote to be counted", func() bool {
		return leader.Metric("infermesh_consensus_membership_changes_total") >= 5
	})
}

func TestLeaderNeverRemovesItself(t *testing.T) {
	c := startThree(t, consensustest.Options{})
	leader := c.Leader()
	for _, p := range c.Running() {
		p.Node.MemberLeft(leader.ID)
	}
	passes := leader.Metric("infermesh_consensus_reconcile_passes_total")
	c.WaitFor("two reconcile passes", func() bool {
		return leader.Metric("infermesh_consensus_reconcile_passes_total") >= passes+2
	})
	c.WaitServers([]string{"n1", "n2", "n3"}, nil)
}

func TestFollowerWithoutLeaderReturnsErrNoLeader(t *testing.T) {
	c := startThree(t, consensustest.Options{Configure: func(cfg *consensus.Config) { cfg.LeaderWait = 300 * time.Millisecond }})
	survivor := c.Followers()[0]
	for _, p := range c.Running() {
		if p != survivor {
			c.Kill(p.ID)
		}
	}
	c.WaitFor("the survivor to lose its leader", func() bool { return !survivor.Node.IsLeader() && survivor.Node.Leader() == "" })
	_, err := survivor.Node.Apply(context.Background(), createKey("sk-no-quorum", 0))
	if !errors.Is(err, consensus.ErrNoLeader) {
		t.Fatalf("apply without quorum: %v, want ErrNoLeader", err)
	}
	// Reads keep working from local state.
	if len(survivor.Node.State().Keys()) != 0 {
		t.Fatal("unexpected keys")
	}
	if survivor.Metric("infermesh_consensus_apply_errors_total") == 0 {
		t.Fatal("the failure was not counted")
	}
}

func TestJoiningNodeNeverBootstraps(t *testing.T) {
	c := consensustest.New(t, consensustest.Options{Logger: testLogger(), Configure: func(cfg *consensus.Config) { cfg.LeaderWait = 300 * time.Millisecond }})
	p := c.StartPeer("lonely", true)
	_, err := p.Node.Apply(context.Background(), createKey("sk", 0))
	if !errors.Is(err, consensus.ErrNoLeader) {
		t.Fatalf("apply on a joining node with no cluster: %v", err)
	}
	if servers, err := p.Node.Servers(); err != nil || len(servers) != 0 {
		t.Fatalf("joining node has configuration %v (%v)", servers, err)
	}
}

func TestForwardedCallsNeedTheClusterSecret(t *testing.T) {
	c := startThree(t, consensustest.Options{Secret: "s3cret"})
	// secret "" sends no signature; oldHeader sends the secret itself in
	// the header older versions used, which is no longer accepted.
	call := func(p *consensustest.Peer, secret string, oldHeader bool) error {
		var opts []connect.ClientOption
		if secret != "" && !oldHeader {
			auth, err := consensustest.PeerAuth(secret)
			if err != nil {
				t.Fatal(err)
			}
			opts = append(opts, connect.WithInterceptors(auth.Client))
		}
		client := consensusv1connect.NewConsensusServiceClient(rpcmux.NewClient(time.Second), "http://"+p.Addr, opts...)
		req := connect.NewRequest(&pb.ApplyRequest{Command: createKey("sk-direct-"+secret, 0), OriginNodeId: "test"})
		if oldHeader {
			req.Header().Set("X-Infermesh-Cluster-Secret", secret)
		}
		_, err := client.Apply(context.Background(), req)
		return err
	}
	for _, p := range c.Running() {
		for _, secret := range []string{"", "wrong", "s3cre", "S3CRET"} {
			if err := call(p, secret, false); connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Fatalf("%s, secret %q: %v, want unauthenticated", p.ID, secret, err)
			}
		}
		if err := call(p, "s3cret", true); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Fatalf("%s, the secret in a header: %v, want unauthenticated", p.ID, err)
		}
	}
	for _, p := range c.Running() {
		if len(p.Node.State().Keys()) != 0 {
			t.Fatal("a refused call reached the log")
		}
	}
	// Signed with the secret, the leader applies and a follower refuses
	// without touching its log (it is not the leader). Leadership may move
	// on a loaded machine, so each outcome is checked against who leads
	// then.
	var applied, refused bool
	c.WaitFor("a leader to apply and a follower to refuse", func() bool {
		for _, p := range c.Running() {
			err := call(p, "s3cret", false)
			switch {
			case err == nil && p.Node.IsLeader():
				applied = true
			case connect.CodeOf(err) == connect.CodeFailedPrecondition && !p.Node.IsLeader():
				refused = true
			case err != nil && connect.CodeOf(err) != connect.CodeFailedPrecondition:
				t.Fatalf("%s with the secret: %v", p.ID, err)
			}
		}
		return applied && refused
	})
}

// A node started with another cluster secret is reported to the cluster
// (consensustest plays a mesh that would not admit it; see mesh's gossip
// key) and even added to the raft configuration, yet it never receives a
// raft byte: every raft connection between it and the others fails the
// handshake, in both directions, and its forwarded writes are refused.
func TestMismatchedSecretsCannotForward(t *testing.T) {
	secrets := map[string]string{"n1": "one", "n2": "one", "n3": "other"}
	c := consensustest.New(t, consensustest.Options{Logger: testLogger(), Configure: func(cfg *consensus.Config) {
		cfg.ClusterSecret = secrets[cfg.NodeID]
		cfg.LeaderWait = 500 * time.Millisecond
	}})
	c.Start(3)
	n1, n2, n3 := c.Peer("n1"), c.Peer("n2"), c.Peer("n3")
	c.WaitFor("n3's raft connections to be refused", func() bool { return n3.RaftRefused() > 0 })
	c.Apply(n2, createKey("sk", 0)) // n1 and n2 are a majority of any configuration here
	c.WaitFor("n1 and n2 to apply", func() bool {
		return len(n1.Node.State().Keys()) == 1 && len(n2.Node.State().Keys()) == 1
	})
	if n3.Node.Leader() != "" || len(n3.Node.State().Keys()) != 0 {
		t.Fatalf("n3 (another secret) knows leader %q and %d keys", n3.Node.Leader(), len(n3.Node.State().Keys()))
	}
	_, err := n3.Node.Apply(context.Background(), createKey("sk-from-n3", 0))
	if !errors.Is(err, consensus.ErrNoLeader) {
		t.Fatalf("apply through a node with another secret: %v", err)
	}
}

func TestUnknownCommands(t *testing.T) {
	c := startThree(t, consensustest.Options{})
	f := c.Followers()[0]
	_, err := f.Node.Apply(context.Background(), &consensus.Command{Type: pb.CommandType(4242), Payload: []byte("x")})
	if !errors.Is(err, consensus.ErrInvalidCommand) {
		t.Fatalf("unknown non-ignorable command: %v, want ErrInvalidCommand before the log", err)
	}
	res := c.Apply(f, &consensus.Command{Type: pb.CommandType(4243), Ignorable: true, Payload: []byte("x")})
	if !res.Skipped {
		t.Fatalf("unknown ignorable command: %+v", res)
	}
	c.Apply(f, createKey("sk-after-unknown", 0))
	c.Converged()
}

// TestPlaintextKeysNeverReachDisk writes keys, leases and usage, snapshots
// every node and scans every file under every data directory: the SHA-256
// of each key must be there (so the scan reads the state), the plaintext
// never.
func TestPlaintextKeysNeverReachDisk(t *testing.T) {
	c := startThree(t, consensustest.Options{})
	plain := []string{"imk-4f1c0d2a9b8e7f6a5d4c3b2a1f0e9d8c", "imk-plaintext-marker-0123456789abcdef", "imk-zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"}
	for i, p := range plain {
		res := c.Apply(c.Running()[i%3], createKey(p, 100))
		c.Apply(c.Running()[(i+1)%3], must(consensus.AcquireLease(consensus.LeaseRequest{NodeID: "n1", KeyID: res.Key.ID, Kind: consensus.LeaseDailyRequests, Want: 10, TTL: time.Hour})))
		c.Apply(c.Running()[(i+2)%3], must(consensus.RecordUsage("n2", uint64(i+1), []consensus.UsageEntry{{App: "app", Model: "m", KeyID: res.Key.ID, Requests: 1}})))
	}
	c.Converged()
	for _, p := range c.Running() {
		if err := p.Node.Snapshot(); err != nil {
			t.Fatalf("snapshot %s: %v", p.ID, err)
		}
	}
	snapshots := 0
	for _, p := range c.Running() {
		var files []string
		err := filepath.WalkDir(p.Dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			files = append(files, path)
			if d.Name() == "state.bin" {
				snapshots++
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range plain {
			hash := keyHash(key)
			hashSeen := false
			for _, path := range files {
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if bytes.Contains(b, []byte(key)) || bytes.Contains(b, []byte(key[4:])) {
					t.Fatalf("plaintext key found in %s", path)
				}
				hashSeen = hashSeen || bytes.Contains(b, hash[:])
			}
			if !hashSeen {
				t.Fatalf("%s: the hash of a key is nowhere on disk; the scan proves nothing", p.ID)
			}
		}
	}
	if snapshots < 3 {
		t.Fatalf("%d snapshot files found, want one per node", snapshots)
	}
}

// blackhole is a transport whose calls are sent and never answered, like a
// leader behind a partition that drops every packet: each call blocks
// until its context ends. Every call is announced on sent.
type blackhole struct{ sent chan struct{} }

func (b blackhole) RoundTrip(req *http.Request) (*http.Response, error) {
	select {
	case b.sent <- struct{}{}:
	default:
	}
	<-req.Context().Done()
	return nil, req.Context().Err()
}

// A forwarded write whose leader goes silent ends when the follower stops
// following that leader, with an unknown outcome (503 upstream), instead of
// waiting for the forward timeout: the regression test for chaos scenario
// short-minority-partition, where a key revoke forwarded to a just-isolated
// leader outlived the client's timeout. The forward timeout here is an hour,
// so without the leader-change watch the call would never return in time
// for the test to finish.
func TestForwardToASilentLeaderEndsWhenTheLeaderChanges(t *testing.T) {
	hole := blackhole{sent: make(chan struct{}, 1)}
	c := startThree(t, consensustest.Options{Configure: func(cfg *consensus.Config) {
		cfg.HTTPClient = &http.Client{Transport: hole}
		cfg.ApplyTimeout = time.Hour
	}})
	old := c.Leader()
	follower := c.Followers()[0]
	done := make(chan error, 1)
	go func() {
		_, err := follower.Node.Apply(context.Background(), createKey("sk-silent-leader", 0))
		done <- err
	}()
	<-hole.sent
	c.Kill(old.ID)
	err := <-done
	if !errors.Is(err, consensus.ErrNoLeader) || !errors.Is(err, consensus.ErrOutcomeUnknown) {
		t.Fatalf("forward to a leader that went away: %v, want ErrNoLeader with ErrOutcomeUnknown", err)
	}
}

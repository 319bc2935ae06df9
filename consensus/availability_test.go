package consensus_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
)

func TestVoterTargetIsOdd(t *testing.T) {
	for _, c := range []struct{ max, eligible, want int }{
		{3, 0, 1}, {3, 1, 1}, {3, 2, 1}, {3, 3, 3}, {3, 4, 3}, {3, 9, 3},
		{5, 2, 1}, {5, 3, 3}, {5, 4, 3}, {5, 5, 5}, {5, 6, 5},
	} {
		if got := consensus.VoterTarget(c.max, c.eligible); got != c.want {
			t.Errorf("VoterTarget(%d, %d) = %d, want %d", c.max, c.eligible, got, c.want)
		}
	}
}

// Two servers are one voter and one non-voter: losing the non-voter leaves
// the cluster writable. A third server makes both others voters at once.
func TestTwoServersHaveOneVoter(t *testing.T) {
	c := consensustest.New(t, consensustest.Options{Voters: 3, Logger: testLogger()})
	c.Start(2)
	c.WaitServers([]string{"n1"}, []string{"n2"})
	c.Apply(c.Peer("n2"), createKey("sk-through-the-non-voter", 0))
	c.Converged()

	c.Kill("n2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Peer("n1").Node.Apply(ctx, createKey("sk-after-losing-the-non-voter", 0)); err != nil {
		t.Fatalf("write after losing the non-voter: %v", err)
	}
	// The non-voter is reaped (ReapTimeout 1s) and the voter keeps going.
	c.WaitServers([]string{"n1"}, nil)

	c.StartPeer("n2", true)
	c.WaitServers([]string{"n1"}, []string{"n2"})
	c.StartPeer("n3", true)
	c.WaitServers([]string{"n1", "n2", "n3"}, nil)
	c.Converged()
	for _, p := range c.Running() {
		if n := len(p.Node.State().Keys()); n != 2 {
			t.Fatalf("%s has %d keys, want 2", p.ID, n)
		}
	}
}

func TestFiveVotersGrowInOddSteps(t *testing.T) {
	c := consensustest.New(t, consensustest.Options{Voters: 5, Logger: testLogger()})
	c.Start(1)
	steps := []struct{ voters, nonvoters int }{{1, 0}, {1, 1}, {3, 0}, {3, 1}, {5, 0}, {5, 1}}
	for i, s := range steps {
		if i > 0 {
			c.StartPeer(fmt.Sprintf("n%d", i+1), true)
		}
		c.WaitCounts(s.voters, s.nonvoters)
	}
	c.Converged()
}

// A voter reaped from a three-voter cluster leaves two voters; the leader
// demotes one rather than keep an even count, so losing another server
// afterwards still leaves the cluster writable when it is the non-voter.
func TestReapedVoterLeavesOneVoterNotTwo(t *testing.T) {
	c := startThree(t, consensustest.Options{Voters: 3})
	victim := c.Followers()[0].ID
	c.Kill(victim)
	voters, nonvoters := c.WaitCounts(1, 1)
	if voters[0] != c.Leader().ID {
		t.Fatalf("voter %s is not the leader %s", voters[0], c.Leader().ID)
	}
	c.Kill(nonvoters[0])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Peer(voters[0]).Node.Apply(ctx, createKey("sk-last-one-standing", 0)); err != nil {
		t.Fatalf("write on the last voter: %v", err)
	}
}

// The operator removes a dead voter by hand through a follower (the call
// goes to the leader) instead of waiting for the reap; the waiting
// non-voter is promoted in its place.
func TestRemovePeerThroughAFollower(t *testing.T) {
	clock := consensustest.NewManualClock(time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC))
	c := startThree(t, consensustest.Options{Voters: 3, ReapTimeout: time.Hour, Clock: clock})
	c.StartPeer("n4", true)
	c.WaitServers([]string{"n1", "n2", "n3"}, []string{"n4"})
	leader := c.Leader()
	var victim, via string
	for _, p := range c.Followers() {
		switch {
		case p.ID == "n4":
		case victim == "":
			victim = p.ID
		default:
			via = p.ID
		}
	}
	c.Kill(victim)
	ctx := context.Background()
	if err := c.Peer(via).Node.RemovePeer(ctx, victim); err != nil {
		t.Fatalf("remove %s through %s: %v", victim, via, err)
	}
	c.WaitServers([]string{leader.ID, via, "n4"}, nil)

	if err := c.Peer(via).Node.RemovePeer(ctx, "nobody"); !errors.Is(err, consensus.ErrNoSuchServer) {
		t.Fatalf("remove an unknown id: %v, want ErrNoSuchServer", err)
	}
	if err := c.Peer(via).Node.RemovePeer(ctx, leader.ID); !errors.Is(err, consensus.ErrRemoveLeader) {
		t.Fatalf("remove the leader: %v, want ErrRemoveLeader", err)
	}
	if err := leader.Node.RemovePeer(ctx, leader.ID); !errors.Is(err, consensus.ErrRemoveLeader) {
		t.Fatalf("the leader removing itself: %v, want ErrRemoveLeader", err)
	}
	c.Apply(c.Peer("n4"), createKey("sk-after-removal", 0))
	c.Converged()
}

// A three-voter cluster that loses two voters for good has no majority;
// `Recover` on the survivor's data directory makes it the single voter of
// a cluster that accepts writes again, with everything it had.
func TestRecoverAfterLosingTheMajority(t *testing.T) {
	c := startThree(t, consensustest.Options{Voters: 3, Configure: func(cfg *consensus.Config) { cfg.LeaderWait = 300 * time.Millisecond }})
	for i := range 3 {
		c.Apply(c.Leader(), createKey(fmt.Sprintf("sk-before-%d", i), 0))
	}
	c.Converged()
	survivor := c.Followers()[0]
	for _, p := range c.Running() {
		if p != survivor {
			c.Kill(p.ID)
		}
	}
	c.WaitFor("the survivor to lose its leader", func() bool { return survivor.Node.Leader() == "" })
	if _, err := survivor.Node.Apply(context.Background(), createKey("sk-stuck", 0)); !errors.Is(err, consensus.ErrNoLeader) {
		t.Fatalf("write without a majority: %v, want ErrNoLeader", err)
	}
	id, dir := survivor.ID, survivor.Dir
	c.Kill(id)

	if _, err := consensus.Recover(dir, "not-"+id, nil); err == nil {
		t.Fatal("recovered under a node id that is not in the configuration")
	}
	res, err := consensus.Recover(dir, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Before) != 3 || res.AppliedIndex == 0 {
		t.Fatalf("recover saw %+v", res)
	}

	p := c.StartPeer(id, true)
	c.WaitFor(id+" to lead alone", func() bool { return p.Node.IsLeader() })
	servers, err := p.Node.Servers()
	if err != nil || len(servers) != 1 || servers[0].ID != id || !servers[0].Voter {
		t.Fatalf("configuration after recovery: %+v, %v", servers, err)
	}
	if n := len(p.Node.State().Keys()); n != 3 {
		t.Fatalf("%d keys after recovery, want 3", n)
	}
	c.Apply(p, createKey("sk-after-recovery", 0))
	// New servers join the recovered cluster as usual.
	c.StartPeer("n9", true)
	c.WaitServers([]string{id}, []string{"n9"})
	c.Converged()
}

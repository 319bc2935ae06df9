package consensus_test

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/consensus/consensustest"
)

func TestExpectBootstrapDecision(t *testing.T) {
	three := map[string]string{"b": "10.0.0.2:7947", "a": "10.0.0.1:7947", "c": "10.0.0.3:7947"}
	cases := []struct {
		name   string
		self   string
		alive  map[string]string
		expect int
		want   bool
	}{
		{"too few", "a", map[string]string{"a": "x:1", "b": "y:1"}, 3, false},
		{"lowest bootstraps", "a", three, 3, true},
		{"others wait", "b", three, 3, false},
		{"highest waits", "c", three, 3, false},
		{"disabled", "a", three, 0, false},
		{"self unknown", "z", three, 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, got := consensus.ExpectBootstrap(tc.self, tc.alive, tc.expect, 3)
			if got != tc.want {
				t.Fatalf("ExpectBootstrap = %v, want %v", got, tc.want)
			}
		})
	}
	cfg, ok := consensus.ExpectBootstrap("a", three, 3, 3)
	if !ok || len(cfg.Servers) != 3 {
		t.Fatalf("configuration %+v", cfg)
	}
	for i, id := range []string{"a", "b", "c"} {
		s := cfg.Servers[i]
		if string(s.ID) != id || string(s.Address) != three[id] || s.Suffrage != raft.Voter {
			t.Fatalf("server %d: %+v", i, s)
		}
	}
	// Two servers: one voter (the lowest id), one non-voter, so the first
	// election needs nobody else.
	cfg, ok = consensus.ExpectBootstrap("a", map[string]string{"a": "x:1", "b": "y:1"}, 2, 3)
	if !ok || cfg.Servers[0].Suffrage != raft.Voter || cfg.Servers[1].Suffrage != raft.Nonvoter {
		t.Fatalf("two-server configuration %+v", cfg)
	}
	// More than expected are all included; voters stay within maxVoters.
	five := map[string]string{"a": "1:1", "b": "2:1", "c": "3:1", "d": "4:1", "e": "5:1", "f": "6:1"}
	cfg, _ = consensus.ExpectBootstrap("a", five, 3, 5)
	voters := 0
	for _, s := range cfg.Servers {
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	if len(cfg.Servers) != 6 || voters != 5 {
		t.Fatalf("six servers, max 5 voters: %+v", cfg)
	}
}

// Three nodes, all joining, none bootstrapping alone: with BootstrapExpect
// 3 exactly one bootstraps and the group elects a leader with three voters.
func TestBootstrapExpectThreeSimultaneous(t *testing.T) {
	c := consensustest.New(t, consensustest.Options{Logger: testLogger(), Configure: func(cfg *consensus.Config) { cfg.BootstrapExpect = 3 }})
	for _, id := range []string{"n3", "n1", "n2"} {
		c.StartPeer(id, true)
	}
	c.WaitServers([]string{"n1", "n2", "n3"}, nil)
	leaders := 0
	for _, p := range c.Running() {
		if p.Node.IsLeader() {
			leaders++
		}
	}
	if leaders != 1 {
		t.Fatalf("%d leaders", leaders)
	}
	if _, err := c.Followers()[0].Node.Apply(context.Background(), createKey("sk-expect", 0)); err != nil {
		t.Fatalf("apply through a follower: %v", err)
	}
	// A restart never bootstraps again: the node comes back as the same
	// server of the same cluster.
	c.Kill("n1")
	c.StartPeer("n1", true)
	c.WaitServers([]string{"n1", "n2", "n3"}, nil)
}

// Below the expected count nobody bootstraps.
func TestBootstrapExpectWaitsForEnough(t *testing.T) {
	c := consensustest.New(t, consensustest.Options{Logger: testLogger(), Configure: func(cfg *consensus.Config) {
		cfg.BootstrapExpect = 3
		cfg.LeaderWait = 200 * time.Millisecond
	}})
	a := c.StartPeer("n1", true)
	c.StartPeer("n2", true)
	time.Sleep(consensus.ExpectSettle + 500*time.Millisecond)
	if servers, err := a.Node.Servers(); err != nil || len(servers) != 0 || a.Node.Leader() != "" {
		t.Fatalf("two of three expected: servers %v (%v), leader %q", servers, err, a.Node.Leader())
	}
	c.StartPeer("n3", true)
	c.WaitServers([]string{"n1", "n2", "n3"}, nil)
}

// Two nodes that join each other elect a leader with BootstrapExpect 2.
func TestBootstrapExpectTwo(t *testing.T) {
	c := consensustest.New(t, consensustest.Options{Logger: testLogger(), Configure: func(cfg *consensus.Config) { cfg.BootstrapExpect = 2 }})
	c.StartPeer("n2", true)
	c.StartPeer("n1", true)
	c.WaitServers([]string{"n1"}, []string{"n2"})
}

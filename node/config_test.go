package node

import "testing"

// The internal ports never open on all interfaces just because the client
// port does.
func TestInternalListenDefaults(t *testing.T) {
	cases := []struct {
		listen, advertise, gossip, rpc string
	}{
		{"127.0.0.1:11436", "", "127.0.0.1:7946", "127.0.0.1:7947"},
		{"10.0.0.5:8080", "", "10.0.0.5:7946", "10.0.0.5:7947"},
		{"0.0.0.0:8080", "", "127.0.0.1:7946", "127.0.0.1:7947"},
		{"[::]:8080", "", "127.0.0.1:7946", "127.0.0.1:7947"},
		{":8080", "", "127.0.0.1:7946", "127.0.0.1:7947"},
		{"0.0.0.0:8080", "10.0.0.7", "10.0.0.7:7946", "10.0.0.7:7947"},
	}
	for _, c := range cases {
		cfg := Config{Listen: c.listen, Advertise: c.advertise}
		if err := cfg.fillAddrsFrom(loopbackOnly); err != nil {
			t.Fatal(err)
		}
		if cfg.GossipListen != c.gossip || cfg.RPCListen != c.rpc {
			t.Errorf("listen %s advertise %q: gossip %s rpc %s, want %s %s", c.listen, c.advertise, cfg.GossipListen, cfg.RPCListen, c.gossip, c.rpc)
		}
	}
}

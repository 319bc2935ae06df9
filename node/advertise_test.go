package node

import (
	"errors"
	"net"
	"strings"
	"testing"
)

// loopbackOnly is a computer with no network: only lo.
func loopbackOnly() ([]netInterface, error) {
	return []netInterface{{Name: "lo", Up: true, Loopback: true, Addrs: ips("127.0.0.1", "::1")}}, nil
}

func ips(ss ...string) []net.IP {
	var out []net.IP
	for _, s := range ss {
		out = append(out, net.ParseIP(s))
	}
	return out
}

func ifaces(list ...netInterface) func() ([]netInterface, error) {
	all, _ := loopbackOnly()
	return func() ([]netInterface, error) { return append(all, list...), nil }
}

// A node whose listeners are on all interfaces advertises the one address
// peers can dial, binds its internal ports there, never advertises
// loopback to a mesh it joins, and refuses to start, naming --advertise,
// when it cannot tell which address to use.
func TestAdvertiseChoice(t *testing.T) {
	eth0 := netInterface{Name: "eth0", Up: true, Addrs: ips("10.0.0.5", "fe80::1", "fd00::5")}
	eth1 := netInterface{Name: "eth1", Up: true, Addrs: ips("192.168.7.2")}
	public := netInterface{Name: "ens3", Up: true, Addrs: ips("203.0.113.9", "2001:db8::9")}
	v6only := netInterface{Name: "eth0", Up: true, Addrs: ips("fe80::2", "2001:db8::2")}
	down := netInterface{Name: "eth9", Up: false, Addrs: ips("10.9.9.9")}
	docker := netInterface{Name: "docker0", Up: true, Addrs: ips("172.17.0.1")}
	cases := []struct {
		name                      string
		listen, gossip, rpc       string
		advertise                 string
		join, secret              bool
		ifs                       func() ([]netInterface, error)
		wantAdv, wantGos, wantRPC string
		wantErr                   string // substring; "" means no error
	}{
		{name: "one private address", listen: "0.0.0.0:8080", secret: true, ifs: ifaces(eth0), wantAdv: "10.0.0.5", wantGos: "10.0.0.5:7946", wantRPC: "10.0.0.5:7947"},
		{name: "one private address, joining", listen: "0.0.0.0:8080", join: true, ifs: ifaces(eth0, down), wantAdv: "10.0.0.5", wantGos: "10.0.0.5:7946", wantRPC: "10.0.0.5:7947"},
		{name: "private beats public", listen: "0.0.0.0:8080", join: true, ifs: ifaces(public, eth0), wantAdv: "10.0.0.5", wantGos: "10.0.0.5:7946", wantRPC: "10.0.0.5:7947"},
		{name: "one public IPv4", listen: "0.0.0.0:8080", secret: true, ifs: ifaces(public), wantAdv: "203.0.113.9", wantGos: "203.0.113.9:7946", wantRPC: "203.0.113.9:7947"},
		{name: "IPv6 only on ::", listen: "[::]:8080", join: true, ifs: ifaces(v6only), wantAdv: "2001:db8::2", wantGos: "[2001:db8::2]:7946", wantRPC: "[2001:db8::2]:7947"},
		{name: "IPv6 only on 0.0.0.0 cannot be dialled", listen: "0.0.0.0:8080", join: true, ifs: ifaces(v6only), wantErr: "--advertise"},
		{name: "two private addresses", listen: "0.0.0.0:8080", secret: true, ifs: ifaces(eth0, eth1), wantErr: "several addresses peers might dial (10.0.0.5 on eth0, 192.168.7.2 on eth1): set --advertise"},
		{name: "docker bridge makes it ambiguous", listen: ":8080", join: true, ifs: ifaces(eth0, docker), wantErr: "set --advertise"},
		{name: "ambiguity settled by --advertise", listen: "0.0.0.0:8080", advertise: "192.168.7.2", join: true, ifs: ifaces(eth0, eth1), wantAdv: "192.168.7.2", wantGos: "192.168.7.2:7946", wantRPC: "192.168.7.2:7947"},
		{name: "only loopback, joining", listen: "0.0.0.0:8080", join: true, ifs: loopbackOnly, wantErr: "no interface has an address peers could dial (only loopback, or only IPv6 on a 0.0.0.0 listener): set --advertise"},
		{name: "only loopback, alone", listen: "0.0.0.0:8080", secret: true, ifs: loopbackOnly, wantAdv: "127.0.0.1", wantGos: "127.0.0.1:7946", wantRPC: "127.0.0.1:7947"},
		{name: "interfaces unreadable", listen: "0.0.0.0:8080", secret: true, ifs: func() ([]netInterface, error) { return nil, errors.New("boom") }, wantErr: "set --advertise"},
		{name: "explicit internal listener on all interfaces", listen: "127.0.0.1:8080", gossip: "0.0.0.0:7946", rpc: "0.0.0.0:7947", join: true, ifs: ifaces(eth0), wantAdv: "10.0.0.5", wantGos: "0.0.0.0:7946", wantRPC: "0.0.0.0:7947"},
		{name: "explicit internal listener, client listener names the host", listen: "192.168.7.2:8080", rpc: "0.0.0.0:7947", join: true, ifs: ifaces(eth0, eth1), wantAdv: "192.168.7.2", wantGos: "192.168.7.2:7946", wantRPC: "0.0.0.0:7947"},
		{name: "specific listener: nothing to choose", listen: "10.0.0.5:8080", join: true, ifs: ifaces(eth0, eth1), wantAdv: "", wantGos: "10.0.0.5:7946", wantRPC: "10.0.0.5:7947"},
		{name: "internal listeners given: nothing to choose", listen: "0.0.0.0:8080", gossip: "127.0.0.1:0", rpc: "127.0.0.1:0", ifs: ifaces(eth0, eth1), wantAdv: "", wantGos: "127.0.0.1:0", wantRPC: "127.0.0.1:0"},
		{name: "lone node without a secret: nobody can join, loopback", listen: "0.0.0.0:8080", ifs: ifaces(eth0, eth1), wantAdv: "", wantGos: "127.0.0.1:7946", wantRPC: "127.0.0.1:7947"},
		{name: "unspecified --advertise", listen: "0.0.0.0:8080", advertise: "0.0.0.0", ifs: ifaces(eth0), wantErr: "set --advertise to this node's routable address"},
		{name: "--advertise with a port", listen: "0.0.0.0:8080", advertise: "10.0.0.5:7946", ifs: ifaces(eth0), wantErr: "without a port"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := Config{Listen: c.listen, GossipListen: c.gossip, RPCListen: c.rpc, Advertise: c.advertise}
			if c.join {
				cfg.Join = []string{"peer:7946"}
			}
			if c.secret || c.join {
				cfg.ClusterSecret = "s"
			}
			err := cfg.fillAddrsFrom(c.ifs)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q (advertise %q)", err, c.wantErr, cfg.Advertise)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Advertise != c.wantAdv || cfg.GossipListen != c.wantGos || cfg.RPCListen != c.wantRPC {
				t.Fatalf("advertise %q gossip %s rpc %s, want %q %s %s", cfg.Advertise, cfg.GossipListen, cfg.RPCListen, c.wantAdv, c.wantGos, c.wantRPC)
			}
			if c.join && net.ParseIP(cfg.Advertise) != nil && net.ParseIP(cfg.Advertise).IsLoopback() {
				t.Fatalf("a joining node advertises loopback %s", cfg.Advertise)
			}
		})
	}
}

// The real interface list of this computer can be read, and the choice
// made from it is never loopback when the computer has a routable address.
func TestSystemInterfaces(t *testing.T) {
	list, err := systemInterfaces()
	if err != nil {
		t.Fatal(err)
	}
	loop := false
	for _, ifc := range list {
		loop = loop || ifc.Loopback
	}
	if !loop {
		t.Fatalf("no loopback interface in %+v", list)
	}
	got, err := chooseAdvertise(list, true, false)
	if err != nil {
		t.Logf("this computer is ambiguous: %v", err)
		return
	}
	t.Logf("would advertise %s", got)
}

package node

import (
	"fmt"
	"net"
	"strings"
)

// netInterface is one network interface as the advertise choice sees it:
// the system's list in production (systemInterfaces), a fixed list in tests.
type netInterface struct {
	Name     string
	Up       bool
	Loopback bool
	Addrs    []net.IP
}

// systemInterfaces lists this computer's interfaces and their addresses.
func systemInterfaces() ([]netInterface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []netInterface
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", ifc.Name, err)
		}
		ni := netInterface{Name: ifc.Name, Up: ifc.Flags&net.FlagUp != 0, Loopback: ifc.Flags&net.FlagLoopback != 0}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				ni.Addrs = append(ni.Addrs, ipn.IP)
			}
		}
		out = append(out, ni)
	}
	return out, nil
}

// isUnspecifiedHost reports whether a listener host means "all
// interfaces": empty, 0.0.0.0 or ::.
func isUnspecifiedHost(h string) bool {
	if h == "" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsUnspecified()
}

// chooseAdvertise picks the address peers dial for a node whose listeners
// are on all interfaces and that was given no --advertise. Candidates are
// the global unicast addresses (no loopback, link-local or multicast) of
// interfaces that are up; IPv6 ones only when ipv6 is set (a listener on
// "::"; one on 0.0.0.0 accepts IPv4 only). The first non-empty tier of
// private IPv4 (RFC 1918), other IPv4, IPv6 decides: one address is the
// answer, several are an error naming --advertise (the node cannot tell
// which one its peers can reach). With no candidate at all, a node that
// joins nobody advertises loopback (no remote peer can exist: the computer
// has no network), and a node given --join refuses to start.
func chooseAdvertise(ifaces []netInterface, ipv6, joining bool) (string, error) {
	type cand struct {
		ip    net.IP
		iface string
	}
	var tiers [3][]cand
	seen := map[string]bool{}
	for _, ifc := range ifaces {
		if !ifc.Up || ifc.Loopback {
			continue
		}
		for _, ip := range ifc.Addrs {
			if !ip.IsGlobalUnicast() || seen[ip.String()] {
				continue
			}
			tier := 2
			if ip.To4() != nil {
				tier = 1
				if ip.IsPrivate() {
					tier = 0
				}
			} else if !ipv6 {
				continue
			}
			seen[ip.String()] = true
			tiers[tier] = append(tiers[tier], cand{ip, ifc.Name})
		}
	}
	for _, t := range tiers {
		switch len(t) {
		case 0:
			continue
		case 1:
			return t[0].ip.String(), nil
		}
		var names []string
		for _, c := range t {
			names = append(names, c.ip.String()+" on "+c.iface)
		}
		return "", fmt.Errorf("listening on all interfaces, and this computer has several addresses peers might dial (%s): set --advertise (SERVICE_ADVERTISE) to the one they should use", strings.Join(names, ", "))
	}
	if joining {
		return "", fmt.Errorf("listening on all interfaces with --join, but no interface has an address peers could dial (only loopback, or only IPv6 on a 0.0.0.0 listener): set --advertise (SERVICE_ADVERTISE) to this node's address")
	}
	if ipv6 && !hasIPv4Loopback(ifaces) {
		return "::1", nil
	}
	return "127.0.0.1", nil
}

func hasIPv4Loopback(ifaces []netInterface) bool {
	for _, ifc := range ifaces {
		for _, ip := range ifc.Addrs {
			if ip.IsLoopback() && ip.To4() != nil {
				return true
			}
		}
	}
	return len(ifaces) == 0
}

// checkAdvertise refuses an --advertise value peers could never dial.
func checkAdvertise(a string) error {
	if a == "" {
		return nil
	}
	if strings.ContainsAny(a, " /") || strings.Contains(a, "://") {
		return fmt.Errorf("advertise %q: want a host name or an IP address", a)
	}
	ip := net.ParseIP(a)
	if ip == nil && strings.Contains(a, ":") {
		return fmt.Errorf("advertise %q: want a host without a port (the ports are those of the listeners)", a)
	}
	if ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("advertise %s: an unspecified address cannot be dialled; set --advertise to this node's routable address", a)
	}
	return nil
}

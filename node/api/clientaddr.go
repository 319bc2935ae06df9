package api

import (
	"fmt"
	"net"
	"net/http"
	"strings"
)

// DefaultTrustedProxies are the proxies whose X-Forwarded-For a node
// believes when the operator trusts a proxy and names none: loopback only.
var DefaultTrustedProxies = []string{"127.0.0.0/8", "::1/128"}

// ParseCIDRs parses proxy networks (a bare address is one host).
func ParseCIDRs(list []string) ([]*net.IPNet, error) {
	out := make([]*net.IPNet, 0, len(list))
	for _, s := range list {
		s = strings.TrimSpace(s)
		if !strings.Contains(s, "/") {
			ip := net.ParseIP(s)
			if ip == nil {
				return nil, fmt.Errorf("trusted proxy %q: want an IP address or a CIDR", s)
			}
			bits := 128
			if ip.To4() != nil {
				ip, bits = ip.To4(), 32
			}
			out = append(out, &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)})
			continue
		}
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: %v", s, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// maxForwardedHops bounds how many X-Forwarded-For entries are examined.
const maxForwardedHops = 32

// forwardedClient returns the client address of a request: the peer's IP,
// or, when the peer is a trusted proxy, the right-most X-Forwarded-For
// entry that is not itself a trusted proxy. Entries left of that one were
// written by the client and prove nothing, so rotating or spoofing them
// changes nothing. A malformed entry stops the walk at the last good hop.
func forwardedClient(r *http.Request, trusted []*net.IPNet) string {
	peer, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		peer = r.RemoteAddr
	}
	if len(trusted) == 0 || !inNets(peer, trusted) {
		return peer
	}
	var hops []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(v, ",")...)
	}
	client := peer
	for i, seen := len(hops)-1, 0; i >= 0 && seen < maxForwardedHops; i, seen = i-1, seen+1 {
		ip := net.ParseIP(strings.TrimSpace(hops[i]))
		if ip == nil {
			break
		}
		client = ip.String()
		if !inNets(client, trusted) {
			break
		}
	}
	return client
}

func inNets(addr string, nets []*net.IPNet) bool {
	ip := net.ParseIP(addr)
	if ip == nil {
		return false
	}
	for _, n := range nets {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

package api

import (
	"net/http"
	"testing"
)

func TestForwardedClient(t *testing.T) {
	trusted, err := ParseCIDRs([]string{"127.0.0.0/8", "::1/128", "10.1.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		remote string
		xff    []string
		want   string
	}{
		{"no header", "127.0.0.1:5000", nil, "127.0.0.1"},
		{"one proxy", "127.0.0.1:5000", []string{"203.0.113.9"}, "203.0.113.9"},
		// The client wrote the left entries; the proxy appended the real peer.
		{"spoofed left entries", "127.0.0.1:5000", []string{"198.51.100.1, 198.51.100.2, 203.0.113.9"}, "203.0.113.9"},
		{"victim spoof", "127.0.0.1:5000", []string{"192.0.2.77, 203.0.113.9"}, "203.0.113.9"},
		{"two trusted proxies", "127.0.0.1:5000", []string{"203.0.113.9, 10.1.2.3"}, "203.0.113.9"},
		{"header split over lines", "127.0.0.1:5000", []string{"198.51.100.1", "203.0.113.9, 10.1.2.3"}, "203.0.113.9"},
		{"untrusted peer ignores header", "192.0.2.5:5000", []string{"203.0.113.9"}, "192.0.2.5"},
		{"garbage stops at last good hop", "127.0.0.1:5000", []string{"not-an-ip, 10.1.2.3"}, "10.1.2.3"},
		{"all trusted", "127.0.0.1:5000", []string{"10.1.0.1, 127.0.0.2"}, "10.1.0.1"},
		{"ipv6", "[::1]:5000", []string{"2001:db8::1"}, "2001:db8::1"},
	}
	for _, c := range cases {
		r, _ := http.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.remote
		for _, v := range c.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if got := forwardedClient(r, trusted); got != c.want {
			t.Errorf("%s: got %s, want %s", c.name, got, c.want)
		}
	}
	// Without trust nothing in the header counts.
	r, _ := http.NewRequest("GET", "/", nil)
	r.RemoteAddr = "127.0.0.1:1"
	r.Header.Set("X-Forwarded-For", "203.0.113.9")
	if got := forwardedClient(r, nil); got != "127.0.0.1" {
		t.Errorf("untrusting: got %s", got)
	}
	if _, err := ParseCIDRs([]string{"10.0.0.0/33"}); err == nil {
		t.Error("bad CIDR accepted")
	}
}

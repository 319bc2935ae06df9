package auth

import (
	"net/http"
	"testing"
)

func TestKeyFromRequestWebSocket(t *testing.T) {
	ws := func(target string, h map[string]string) *http.Request {
		r, _ := http.NewRequest(http.MethodGet, target, nil)
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
		for k, v := range h {
			r.Header.Set(k, v)
		}
		return r
	}
	cases := []struct {
		name string
		r    *http.Request
		want string
	}{
		{"header wins", ws("/s?api_key=q", map[string]string{"Authorization": "Bearer h", "Sec-WebSocket-Protocol": "infermesh.key.p"}), "h"},
		{"subprotocol", ws("/s?api_key=q", map[string]string{"Sec-WebSocket-Protocol": "infermesh.live, infermesh.key.p"}), "p"},
		{"query", ws("/s?api_key=q", nil), "q"},
		{"empty subprotocol key", ws("/s", map[string]string{"Sec-WebSocket-Protocol": "infermesh.key."}), ""},
		{"none", ws("/s", nil), ""},
	}
	for _, c := range cases {
		got, ok := KeyFromRequest(c.r)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("%s: %q %v, want %q", c.name, got, ok, c.want)
		}
	}
	// Not an upgrade: query and subprotocol keys are ignored.
	r, _ := http.NewRequest(http.MethodGet, "/v1/models?api_key=q", nil)
	r.Header.Set("Sec-WebSocket-Protocol", "infermesh.key.p")
	if k, ok := KeyFromRequest(r); ok {
		t.Errorf("plain GET gave key %q", k)
	}
}

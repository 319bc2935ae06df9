package forward_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/infermesh/infermesh/mesh/forward"
)

// upgradeEcho upgrades to "echo" and answers every line in upper case,
// until the client closes its side; then it says bye and closes.
func upgradeEcho(t *testing.T, seen chan<- http.Header) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		if r.URL.Query().Get("refuse") != "" {
			http.Error(w, "no such thing", http.StatusBadRequest)
			return
		}
		w.Header().Set("X-Echo", "yes")
		w.WriteHeader(http.StatusSwitchingProtocols)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer conn.Close()
		for {
			line, err := brw.ReadString('\n')
			if err == io.EOF {
				conn.Write([]byte("BYE\n"))
				return
			}
			if err != nil {
				t.Errorf("read: %v", err)
				return
			}
			if _, err := conn.Write([]byte(strings.ToUpper(line))); err != nil {
				t.Errorf("write: %v", err)
				return
			}
		}
	})
}

func TestRelayUpgradesAndCarriesBytes(t *testing.T) {
	seen := make(chan http.Header, 1)
	p := startPeer(t, upgradeEcho(t, seen))
	c := newClient(t, secret)
	tun, err := c.Relay(context.Background(), p.addr, &forward.Request{Method: "GET", Path: "/x",
		Header: http.Header{"Sec-Websocket-Key": {"k"}, "Connection": {"Upgrade"}}}, "echo")
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	h, err := tun.Head()
	if err != nil {
		t.Fatal(err)
	}
	if h.Status != http.StatusSwitchingProtocols || h.Header.Get("X-Echo") != "yes" {
		t.Fatalf("head %d %v", h.Status, h.Header)
	}
	got := <-seen
	if got.Get("Upgrade") != "echo" || got.Get("Connection") != "Upgrade" || got.Get("Sec-Websocket-Key") != "k" {
		t.Fatalf("the handler saw headers %v", got)
	}
	rd := bufio.NewReader(tun)
	for _, line := range []string{"hello\n", "second line\n"} {
		if _, err := tun.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		back, err := rd.ReadString('\n')
		if err != nil || back != strings.ToUpper(line) {
			t.Fatalf("read %q, %v", back, err)
		}
	}
	if err := tun.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(rd)
	if err != nil || string(rest) != "BYE\n" {
		t.Fatalf("after close: %q, %v", rest, err)
	}
}

func TestRelayRefusalCarriesTheBody(t *testing.T) {
	seen := make(chan http.Header, 1)
	p := startPeer(t, upgradeEcho(t, seen))
	c := newClient(t, secret)
	tun, err := c.Relay(context.Background(), p.addr, &forward.Request{Method: "GET", Path: "/x?refuse=1"}, "echo")
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	h, err := tun.Head()
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(tun)
	if h.Status != http.StatusBadRequest || err != nil || !bytes.Contains(body, []byte("no such thing")) {
		t.Fatalf("%d %q %v", h.Status, body, err)
	}
}

func TestRelayRefusesWrongSecretAndDrain(t *testing.T) {
	seen := make(chan http.Header, 1)
	p := startPeer(t, upgradeEcho(t, seen))
	tun, err := newClient(t, "wrong").Relay(context.Background(), p.addr, &forward.Request{Method: "GET", Path: "/x"}, "echo")
	if err == nil {
		_, err = tun.Head()
		tun.Close()
	}
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("wrong secret: %v", err)
	}
	if len(seen) != 0 {
		t.Fatal("the handler ran for an unauthenticated relay")
	}
	p.srv.SetDraining(true)
	tun, err = newClient(t, secret).Relay(context.Background(), p.addr, &forward.Request{Method: "GET", Path: "/x"}, "echo")
	if err == nil {
		_, err = tun.Head()
		tun.Close()
	}
	if !forward.IsDraining(err) || !forward.Retryable(err) {
		t.Fatalf("draining: %v", err)
	}
}

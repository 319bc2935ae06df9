package rpcmux

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// acceptRaft returns the raft side's next connection, or nil when none
// arrives before the mux closes or the test's limit.
func acceptRaft(m *Mux) <-chan net.Conn {
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := m.Raft().Accept()
		if err != nil {
			c = nil
		}
		ch <- c
	}()
	return ch
}

func TestRaftHandshakeAdmitsOnlyTheSecret(t *testing.T) {
	m, _ := startMux(t)
	defer m.Close()
	got := acceptRaft(m)

	// A wrong secret: the client learns that it was refused, the server
	// counts it, raft never sees the connection.
	if _, err := DialRaft(m.Addr().String(), "not-the-secret", 5*time.Second); !errors.Is(err, ErrHandshake) {
		t.Fatalf("dial with a wrong secret: %v, want ErrHandshake", err)
	}
	waitRefused(t, m, 1)

	// A raw client that writes the mux byte and then raft bytes without a
	// handshake: its bytes are read as a (wrong) proof and the connection
	// is closed without a server proof.
	raw, err := net.Dial("tcp", m.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	payload := append([]byte{RaftByte}, bytes.Repeat([]byte{0x01}, 200)...)
	if _, err := raw.Write(payload); err != nil {
		t.Fatal(err)
	}
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	answer, _ := io.ReadAll(raw) // the nonce, then EOF
	if len(answer) != nonceLen {
		t.Fatalf("a client without the secret read %d bytes, want only the %d-byte nonce", len(answer), nonceLen)
	}
	waitRefused(t, m, 2)

	// The right secret goes through, and the bytes after the handshake are
	// raft's.
	c, err := DialRaft(m.Addr().String(), testSecret, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("raft")); err != nil {
		t.Fatal(err)
	}
	var sc net.Conn
	select {
	case sc = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the raft side got no connection")
	}
	if sc == nil {
		t.Fatal("raft accept failed")
	}
	defer sc.Close()
	buf := make([]byte, 4)
	if _, err := io.ReadFull(sc, buf); err != nil || string(buf) != "raft" {
		t.Fatalf("raft side read %q, %v", buf, err)
	}
	if m.RaftRefused() != 2 {
		t.Fatalf("refused %d, want 2", m.RaftRefused())
	}
}

// A server that does not hold the secret cannot pass as a raft peer: the
// client checks the server's proof too.
func TestRaftHandshakeChecksTheServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var b [1]byte
		io.ReadFull(c, b[:])
		// An impostor that plays the protocol with another secret.
		serverHandshake(c, []byte("impostor"), 5*time.Second)
	}()
	if _, err := DialRaft(ln.Addr().String(), testSecret, 5*time.Second); !errors.Is(err, ErrHandshake) {
		t.Fatalf("dial to an impostor: %v, want ErrHandshake", err)
	}
}

func TestSilentRaftClientTimesOut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(ln, testSecret, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.handshake = 200 * time.Millisecond
	go m.Serve()
	defer m.Close()
	c, err := net.Dial("tcp", m.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte{RaftByte}) // then nothing
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	answer, err := io.ReadAll(c)
	if err != nil || len(answer) != nonceLen {
		t.Fatalf("read %d bytes, %v: want the nonce, then the server closing", len(answer), err)
	}
	waitRefused(t, m, 1)
}

func TestEmptySecretIsRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := New(ln, "", nil); err == nil {
		t.Fatal("a mux without a secret was built")
	}
	if _, err := DialRaft(ln.Addr().String(), "", time.Second); err == nil {
		t.Fatal("dialled raft without a secret")
	}
}

func waitRefused(t *testing.T, m *Mux, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for m.RaftRefused() < n {
		if time.Now().After(deadline) {
			t.Fatalf("refused %d handshakes, want %d", m.RaftRefused(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

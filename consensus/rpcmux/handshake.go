package rpcmux

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// The raft handshake proves, in both directions, that the two ends of a raft
// connection hold the cluster secret, before raft's transport reads a byte.
// After the client's RaftByte:
//
//	server → client: server nonce (32 bytes)
//	client → server: client nonce (32 bytes) ‖ HMAC-SHA256(secret, handshakeLabel ‖ 0x01 ‖ server nonce ‖ client nonce)
//	server → client: HMAC-SHA256(secret, handshakeLabel ‖ 0x02 ‖ server nonce ‖ client nonce)
//
// The role byte keeps one side's proof from being reflected as the other's.
// A server that finds a wrong proof closes the connection without answering,
// so a client without the secret learns nothing it could use.
const handshakeLabel = "infermesh-raft-v1"

const (
	nonceLen = 32
	proofLen = sha256.Size
)

// DefaultHandshakeTimeout bounds the whole raft handshake on either side.
const DefaultHandshakeTimeout = 5 * time.Second

// ErrHandshake reports a raft connection whose peer did not prove the
// cluster secret (or broke off the handshake).
var ErrHandshake = errors.New("rpcmux: raft handshake failed")

// errEmptySecret refuses construction without a cluster secret.
var errEmptySecret = errors.New("rpcmux: a cluster secret is required for raft connections")

func proof(secret []byte, role byte, serverNonce, clientNonce []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(handshakeLabel))
	m.Write([]byte{role})
	m.Write(serverNonce)
	m.Write(clientNonce)
	return m.Sum(nil)
}

const (
	roleClient byte = 1
	roleServer byte = 2
)

// serverHandshake runs the server side on conn (its RaftByte already read).
func serverHandshake(conn net.Conn, secret []byte, timeout time.Duration) error {
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	var sn [nonceLen]byte
	rand.Read(sn[:])
	if _, err := conn.Write(sn[:]); err != nil {
		return fmt.Errorf("%w: send nonce: %w", ErrHandshake, err)
	}
	var in [nonceLen + proofLen]byte
	if _, err := io.ReadFull(conn, in[:]); err != nil {
		return fmt.Errorf("%w: read client proof: %w", ErrHandshake, err)
	}
	cn, got := in[:nonceLen], in[nonceLen:]
	if !hmac.Equal(got, proof(secret, roleClient, sn[:], cn)) {
		return fmt.Errorf("%w: the client's proof does not match this node's cluster secret", ErrHandshake)
	}
	if _, err := conn.Write(proof(secret, roleServer, sn[:], cn)); err != nil {
		return fmt.Errorf("%w: send server proof: %w", ErrHandshake, err)
	}
	return conn.SetDeadline(time.Time{})
}

// clientHandshake runs the client side on conn after its RaftByte.
func clientHandshake(conn net.Conn, secret []byte, timeout time.Duration) error {
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	var sn [nonceLen]byte
	if _, err := io.ReadFull(conn, sn[:]); err != nil {
		return fmt.Errorf("%w: read server nonce: %w", ErrHandshake, err)
	}
	var out [nonceLen + proofLen]byte
	rand.Read(out[:nonceLen])
	cn := out[:nonceLen]
	copy(out[nonceLen:], proof(secret, roleClient, sn[:], cn))
	if _, err := conn.Write(out[:]); err != nil {
		return fmt.Errorf("%w: send proof: %w", ErrHandshake, err)
	}
	var sp [proofLen]byte
	if _, err := io.ReadFull(conn, sp[:]); err != nil {
		// A server that refuses our proof closes without answering.
		return fmt.Errorf("%w: the server refused this node's cluster secret or closed: %w", ErrHandshake, err)
	}
	if !hmac.Equal(sp[:], proof(secret, roleServer, sn[:], cn)) {
		return fmt.Errorf("%w: the server's proof does not match this node's cluster secret", ErrHandshake)
	}
	return conn.SetDeadline(time.Time{})
}

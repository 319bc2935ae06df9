package forward

import (
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"hash"
)

// Frame authentication on a Multiplex stream.
//
// The stream's first frame (MultiplexOpen) is signed like every other call
// (mesh/peerauth: HMAC under the cluster secret, a timestamp and a nonce
// the verifier remembers), so a recorded open cannot be replayed. It
// carries the caller's ephemeral X25519 key; the peer answers with its
// own. Without mutual TLS, both derive a frame key from the shared secret
// and every later caller frame (calls, cancels) carries an HMAC of its kind,
// its id and its bytes under that key, and ids must grow: a frame copied
// from another stream or repeated on this one is refused. An attacker on
// the path who rewrites the peer's key only breaks the stream: the caller's
// key is signed, and the peer's frame key needs the caller's or the peer's
// private key. With mutual TLS the channel itself is authenticated and no
// frame MACs are sent.

// frameMACLen is the length of a frame MAC (truncated HMAC-SHA256).
const frameMACLen = 16

// muxKeyLabel is the HKDF info of the frame key.
const muxKeyLabel = "infermesh-mux-v1"

// Frame kinds covered by a MAC.
const (
	frameCall   byte = 1
	frameCancel byte = 2
)

// newMuxKey returns a fresh ephemeral X25519 key.
func newMuxKey() (*ecdh.PrivateKey, error) {
	return ecdh.X25519().GenerateKey(rand.Reader)
}

// frameMAC computes and checks frame MACs under one stream's key. It is not
// safe for concurrent use: the caller sends frames under its send lock, the
// peer checks them on its one receiving goroutine.
type frameMAC struct {
	h  hash.Hash
	in [9]byte
}

// newFrameMAC derives the frame key from this end's private key and the
// other end's public key; callerPub and peerPub (in that order) salt it.
func newFrameMAC(priv *ecdh.PrivateKey, other []byte, callerPub, peerPub []byte) (*frameMAC, error) {
	pub, err := ecdh.X25519().NewPublicKey(other)
	if err != nil {
		return nil, errors.New("forward: bad multiplex public key")
	}
	shared, err := priv.ECDH(pub)
	if err != nil {
		return nil, errors.New("forward: multiplex key agreement failed")
	}
	salt := append(append([]byte{}, callerPub...), peerPub...)
	key, err := hkdf.Key(sha256.New, shared, salt, muxKeyLabel, 32)
	if err != nil {
		return nil, err
	}
	return &frameMAC{h: hmac.New(sha256.New, key)}, nil
}

// sum returns the MAC of a frame of kind with id and body, appended to dst.
func (m *frameMAC) sum(dst []byte, kind byte, id uint64, body []byte) []byte {
	m.in[0] = kind
	binary.BigEndian.PutUint64(m.in[1:], id)
	m.h.Reset()
	m.h.Write(m.in[:])
	m.h.Write(body)
	var out [sha256.Size]byte
	return append(dst, m.h.Sum(out[:0])[:frameMACLen]...)
}

// check reports whether mac is the MAC of the frame.
func (m *frameMAC) check(mac []byte, kind byte, id uint64, body []byte) bool {
	var buf [frameMACLen]byte
	return len(mac) == frameMACLen && hmac.Equal(mac, m.sum(buf[:0], kind, id, body))
}

// channelAuthenticated reports whether a connection's TLS state proves the
// peer: a client certificate the server verified against its CA
// (rpcmux.PeerTLS requires and verifies one on every connection it admits;
// a resumed session keeps the chains verified at its full handshake).
func channelAuthenticated(cs *tls.ConnectionState) bool {
	return cs != nil && cs.HandshakeComplete && len(cs.VerifiedChains) > 0
}

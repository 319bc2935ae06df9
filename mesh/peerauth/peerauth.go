// Package peerauth authenticates Connect calls between the nodes of one
// cluster without ever sending the cluster secret: the calling node signs
// each call with HMAC-SHA256 under a key derived from the secret, and the
// called node checks the signature, the time and that the call is not a
// replay.
//
// The signature covers the HTTP method, the procedure path, a timestamp, a
// random nonce and the SHA-256 digest of the request message (its
// deterministic protobuf encoding), and travels in one header, Header:
//
//	v1.<unix milliseconds>.<nonce, base64url>.<signature, base64url>
//
// The Verifier refuses, with CodeUnauthenticated, a call without the header,
// with a malformed one, with a timestamp outside ±Skew of its clock, with a
// signature that does not match, or whose nonce it has already seen within
// the window. Signer and Verifier are connect.Interceptors: put the Signer
// on clients and the Verifier on handlers. Unary, server-streaming and
// bidirectional calls are supported: a streaming call is signed over its
// first request message, and the handler's first Receive verifies it
// before anything can be sent back. Later messages of a bidirectional
// stream travel on the same authenticated HTTP/2 stream and are not
// signed one by one. Client-streaming calls are refused.
//
// peerauth protects against nodes and processes that do not hold the
// secret. It does not encrypt: anyone on the path still reads the bytes.
package peerauth

import (
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
)

// Header carries the signature of a node-to-node call.
const Header = "Infermesh-Peer-Auth"

// Defaults for Options fields left zero.
const (
	// DefaultSkew is how far a call's timestamp may be from the receiver's
	// clock, either way.
	DefaultSkew = 30 * time.Second
	// DefaultMaxReplay bounds the nonces a Verifier remembers. When that
	// many calls arrived within the replay window, further calls are
	// refused (UNAVAILABLE, retryable) rather than let replays through.
	DefaultMaxReplay = 1 << 20
)

// label separates these signatures from any other use of the secret; it is
// also the HKDF info of the signing key.
const label = "infermesh-peer-v1"

const (
	version  = "v1"
	nonceLen = 16
	macLen   = sha256.Size
	// streamMethod is the HTTP method of every call this package signs:
	// Connect sends unary and streaming calls as POST (we never enable
	// Connect's GET for unary calls).
	streamMethod = http.MethodPost
)

// Options configure a Signer or a Verifier.
type Options struct {
	// Clock tells the time; nil uses time.Now.
	Clock func() time.Time
	// Skew is the accepted difference between a call's timestamp and the
	// Verifier's clock (default DefaultSkew).
	Skew time.Duration
	// MaxReplay bounds the Verifier's replay cache (default
	// DefaultMaxReplay).
	MaxReplay int
	// Logger receives refusals (never the secret or the signature); nil
	// discards.
	Logger *slog.Logger
	// Registerer receives the Verifier's refusal counter,
	// infermesh_peerauth_refused_total{reason}; nil registers nothing.
	Registerer prometheus.Registerer
}

// deriveKey returns the signing key for secret. An empty secret is refused:
// a node never talks to peers without one.
func deriveKey(secret string) ([]byte, error) {
	if secret == "" {
		return nil, errors.New("peerauth: a cluster secret is required")
	}
	return hkdf.Key(sha256.New, []byte(secret), nil, label, 32)
}

// keyed holds what Signer and Verifier share: the key, pooled HMAC states
// and pooled marshal buffers.
type keyed struct {
	clock func() time.Time
	macs  sync.Pool // *macState
	bufs  sync.Pool // *[]byte
}

func newKeyed(secret string, clock func() time.Time) (*keyed, error) {
	key, err := deriveKey(secret)
	if err != nil {
		return nil, err
	}
	if clock == nil {
		clock = time.Now
	}
	k := &keyed{clock: clock}
	k.macs.New = func() any { return &macState{h: hmac.New(sha256.New, key), in: make([]byte, 0, 256)} }
	k.bufs.New = func() any { b := make([]byte, 0, 4<<10); return &b }
	return k, nil
}

// digest returns the SHA-256 of msg's deterministic protobuf encoding.
func (k *keyed) digest(msg any) ([sha256.Size]byte, error) {
	m, ok := msg.(proto.Message)
	if !ok {
		return [sha256.Size]byte{}, fmt.Errorf("peerauth: cannot sign a %T (not a protobuf message)", msg)
	}
	bp := k.bufs.Get().(*[]byte)
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend((*bp)[:0], m)
	if err != nil {
		k.bufs.Put(bp)
		return [sha256.Size]byte{}, fmt.Errorf("peerauth: encode the request: %w", err)
	}
	d := sha256.Sum256(b)
	if cap(b) <= 1<<20 { // do not keep huge buffers around
		*bp = b[:0]
		k.bufs.Put(bp)
	}
	return d, nil
}

// macState is a pooled HMAC and the buffer its input is assembled in (one
// Write, nothing allocated per call).
type macState struct {
	h  hash.Hash
	in []byte
}

// mac computes the signature of one call into out. The input is the label,
// the method and the procedure (each preceded by its length as a uvarint),
// the timestamp (8 bytes big-endian), the nonce and the digest.
func (k *keyed) mac(out *[macLen]byte, method, procedure string, millis int64, nonce []byte, digest *[sha256.Size]byte) {
	st := k.macs.Get().(*macState)
	in := append(st.in[:0], label...)
	for _, s := range [...]string{method, procedure} {
		in = binary.AppendUvarint(in, uint64(len(s)))
		in = append(in, s...)
	}
	in = binary.BigEndian.AppendUint64(in, uint64(millis))
	in = append(in, nonce...)
	in = append(in, digest[:]...)
	st.h.Reset()
	st.h.Write(in)
	st.h.Sum(out[:0])
	st.in = in
	k.macs.Put(st)
}

// Signer signs outgoing calls. Use it as a client interceptor
// (connect.WithInterceptors); it is safe for concurrent use.
type Signer struct {
	k *keyed
}

// NewSigner returns a Signer for secret (which must not be empty). Only
// opts.Clock matters to a Signer.
func NewSigner(secret string, opts Options) (*Signer, error) {
	k, err := newKeyed(secret, opts.Clock)
	if err != nil {
		return nil, err
	}
	return &Signer{k: k}, nil
}

// sign sets Header on h for a call of procedure carrying msg.
func (s *Signer) sign(h http.Header, procedure string, msg any) error {
	d, err := s.k.digest(msg)
	if err != nil {
		return err
	}
	var nonce [nonceLen]byte
	rand.Read(nonce[:])
	millis := s.k.clock().UnixMilli()
	var mac [macLen]byte
	s.k.mac(&mac, streamMethod, procedure, millis, nonce[:], &d)
	var buf [96]byte
	b := append(buf[:0], version...)
	b = append(b, '.')
	b = strconv.AppendInt(b, millis, 10)
	b = append(b, '.')
	b = base64.RawURLEncoding.AppendEncode(b, nonce[:])
	b = append(b, '.')
	b = base64.RawURLEncoding.AppendEncode(b, mac[:])
	h[Header] = []string{string(b)}
	return nil
}

// WrapUnary signs unary calls made by a client.
func (s *Signer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			if err := s.sign(req.Header(), req.Spec().Procedure, req.Any()); err != nil {
				return nil, connect.NewError(connect.CodeInternal, err)
			}
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient signs the (first) request message of a streaming
// call before it is sent; the headers leave with it.
func (s *Signer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		return &signingConn{StreamingClientConn: next(ctx, spec), s: s}
	}
}

// WrapStreamingHandler leaves handlers alone; a Signer belongs on clients.
func (s *Signer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

type signingConn struct {
	connect.StreamingClientConn
	s      *Signer
	signed bool
}

// Send signs the first message into the request headers, then sends it.
func (c *signingConn) Send(msg any) error {
	if !c.signed {
		c.signed = true
		if err := c.s.sign(c.RequestHeader(), c.Spec().Procedure, msg); err != nil {
			return connect.NewError(connect.CodeInternal, err)
		}
	}
	return c.StreamingClientConn.Send(msg)
}

// Verifier checks incoming calls. Use it as a handler interceptor; one
// Verifier may (and on a node should) serve every service on the port, so
// they share one replay cache. It is safe for concurrent use.
type Verifier struct {
	k       *keyed
	skew    time.Duration
	replay  *replayCache
	log     *slog.Logger
	refused *prometheus.CounterVec
}

// NewVerifier returns a Verifier for secret (which must not be empty).
func NewVerifier(secret string, opts Options) (*Verifier, error) {
	k, err := newKeyed(secret, opts.Clock)
	if err != nil {
		return nil, err
	}
	if opts.Skew <= 0 {
		opts.Skew = DefaultSkew
	}
	if opts.MaxReplay <= 0 {
		opts.MaxReplay = DefaultMaxReplay
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	v := &Verifier{
		k:      k,
		skew:   opts.Skew,
		replay: newReplayCache(2*opts.Skew, opts.MaxReplay),
		log:    opts.Logger.With("component", "peerauth"),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "infermesh", Subsystem: "peerauth", Name: "refused_total",
			Help: "Node-to-node calls refused by peer authentication, by reason (missing, malformed, stale, signature, replayed, replay_full, stream_type).",
		}, []string{"reason"}),
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(v.refused); err != nil {
			return nil, fmt.Errorf("peerauth: metrics: %w", err)
		}
	}
	return v, nil
}

// refuse counts and logs a refusal and returns the error the caller hears.
func (v *Verifier) refuse(reason, procedure, peer string) error {
	v.refused.WithLabelValues(reason).Inc()
	v.log.Warn("refused a node-to-node call", "reason", reason, "procedure", procedure, "peer", peer)
	if reason == "replay_full" {
		return connect.NewError(connect.CodeUnavailable, errors.New("peer authentication: too many calls in the replay window"))
	}
	return connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("peer authentication failed: %s", reason))
}

// verify checks the signature header of one call carrying msg.
func (v *Verifier) verify(method, procedure, peer string, h http.Header, msg any) error {
	vals := h[Header]
	if len(vals) != 1 {
		return v.refuse("missing", procedure, peer)
	}
	millis, nonce, mac, ok := parse(vals[0])
	if !ok {
		return v.refuse("malformed", procedure, peer)
	}
	now := v.k.clock()
	if d := now.Sub(time.UnixMilli(millis)); d > v.skew || d < -v.skew {
		return v.refuse("stale", procedure, peer)
	}
	d, err := v.k.digest(msg)
	if err != nil {
		return v.refuse("malformed", procedure, peer)
	}
	var want [macLen]byte
	v.k.mac(&want, method, procedure, millis, nonce[:], &d)
	if !hmac.Equal(mac[:], want[:]) {
		return v.refuse("signature", procedure, peer)
	}
	switch v.replay.add(nonce, now) {
	case replaySeen:
		return v.refuse("replayed", procedure, peer)
	case replayFull:
		return v.refuse("replay_full", procedure, peer)
	}
	return nil
}

// parse splits a header value into its timestamp, nonce and signature.
func parse(s string) (millis int64, nonce [nonceLen]byte, mac [macLen]byte, ok bool) {
	v, rest, ok1 := strings.Cut(s, ".")
	ts, rest, ok2 := strings.Cut(rest, ".")
	n64, m64, ok3 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !ok3 || v != version {
		return 0, nonce, mac, false
	}
	millis, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return 0, nonce, mac, false
	}
	if !decode(nonce[:], n64) || !decode(mac[:], m64) {
		return 0, nonce, mac, false
	}
	return millis, nonce, mac, true
}

// decode fills dst exactly from unpadded base64url s.
func decode(dst []byte, s string) bool {
	var src [64]byte
	if len(s) > len(src) || base64.RawURLEncoding.DecodedLen(len(s)) != len(dst) {
		return false
	}
	n := copy(src[:], s)
	got, err := base64.RawURLEncoding.Decode(dst, src[:n])
	return err == nil && got == len(dst)
}

// WrapUnary verifies unary calls before the handler runs.
func (v *Verifier) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return nil, connect.NewError(connect.CodeInternal, errors.New("peerauth: a Verifier belongs on handlers"))
		}
		method := req.HTTPMethod()
		if method == "" {
			method = streamMethod
		}
		if err := v.verify(method, req.Spec().Procedure, req.Peer().Addr, req.Header(), req.Any()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient refuses client use: a Verifier belongs on handlers.
func (v *Verifier) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		return &refusedClientConn{StreamingClientConn: next(ctx, spec)}
	}
}

// WrapStreamingHandler verifies a server-streaming call when its request
// message is received, which Connect does before the handler runs, and a
// bidirectional call when the handler receives its first message; nothing
// can be sent before that. Client streams are refused.
func (v *Verifier) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if st := conn.Spec().StreamType; st != connect.StreamTypeServer && st != connect.StreamTypeBidi {
			return v.refuse("stream_type", conn.Spec().Procedure, conn.Peer().Addr)
		}
		return next(ctx, &verifyingConn{StreamingHandlerConn: conn, v: v})
	}
}

type verifyingConn struct {
	connect.StreamingHandlerConn
	v        *Verifier
	received bool
	verified bool
	err      error // why the first message was refused; every later Receive fails with it
}

// Receive reads the first request message and verifies it. Later
// messages (bidirectional streams) pass through; a server-streaming
// call's second Receive is Connect's check for the end of the request.
func (c *verifyingConn) Receive(msg any) error {
	if c.received {
		if !c.verified {
			return c.err
		}
		return c.StreamingHandlerConn.Receive(msg) // Connect checks for EOF
	}
	c.received = true
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		c.err = err
		return err
	}
	if err := c.v.verify(streamMethod, c.Spec().Procedure, c.Peer().Addr, c.RequestHeader(), msg); err != nil {
		c.err = err
		return err
	}
	c.verified = true
	return nil
}

// Send refuses to send anything before the request was verified.
func (c *verifyingConn) Send(msg any) error {
	if !c.verified {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("peer authentication: response before a verified request"))
	}
	return c.StreamingHandlerConn.Send(msg)
}

type refusedClientConn struct {
	connect.StreamingClientConn
}

// Send refuses: a Verifier is not a client interceptor.
func (c *refusedClientConn) Send(any) error {
	return connect.NewError(connect.CodeInternal, errors.New("peerauth: a Verifier belongs on handlers"))
}

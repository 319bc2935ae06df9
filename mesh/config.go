package mesh

import (
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// DeadNodeReclaimTime is how long after a node was declared dead another
// address may claim its id.
const DeadNodeReclaimTime = 30 * time.Second

// DefaultGossipPort is the gossip port used when an address has none.
const DefaultGossipPort = 7946

// Config describes one node's membership in the mesh.
type Config struct {
	// NodeID names the node: memberlist name, raft server id and the value
	// of X-Service-Backend. Required; must be unique in the mesh.
	NodeID string
	// BindAddr is the gossip listen address, host:port (UDP and TCP). Port 0
	// picks a free port. Default "0.0.0.0:7946".
	BindAddr string
	// AdvertiseAddr is the gossip address peers should dial, host or
	// host:port, when it differs from BindAddr. A missing port means the
	// bound port.
	AdvertiseAddr string
	// HTTPAddr is the client HTTP address (host:port) peers and tools use.
	HTTPAddr string
	// RPCAddr is the internal Connect address (host:port) peers dial.
	RPCAddr string
	// Version is the node's software version, carried in NodeMeta.
	Version string
	// Join lists gossip addresses (host or host:port) of running nodes. The
	// node retries them in the background with backoff until one answers.
	// Empty means the node starts a mesh of one.
	Join []string
	// JoinBackoffMin and JoinBackoffMax bound the retry delay between join
	// rounds; the delay doubles from min to max, and each wait is jittered
	// between half the delay and the delay. Defaults 250ms and 2s, so a
	// seed that starts late is found within about two seconds.
	JoinBackoffMin, JoinBackoffMax time.Duration
	// EncryptionKey enables gossip encryption (AES, 16, 24 or 32 bytes).
	// Nodes with a different key, or none, cannot join. See ParseKey.
	// When it is empty and ClusterSecret is set, the key is derived from
	// the secret (GossipKey).
	EncryptionKey []byte
	// ClusterSecret, when EncryptionKey is empty, yields the gossip key
	// (GossipKey), so gossip is encrypted and authenticated whenever the
	// node has a cluster secret: a node with another secret cannot become
	// a member. It is never sent.
	ClusterSecret string
	// Tap, when set, receives a copy of every byte the gossip transport
	// receives (UDP packets and TCP streams, inbound and outbound) before
	// memberlist reads it. It must not keep the slice. For tests.
	Tap func(b []byte)
	// Timers tunes failure detection and gossip; the zero value means
	// LANTimers.
	Timers Timers
	// RecordInterval is how often changes to load (in-flight, queue depth,
	// latency) are published; changes to health, models or routing settings
	// are published at once. Default 250ms.
	RecordInterval time.Duration
	// RecordHeartbeat republishes the record with a new sequence number even
	// when nothing changed, so that record ages say the node is alive.
	// Heartbeats go to a few random members and are not relayed; push-pull
	// repairs gaps, and an ejected peer is asked for a record directly.
	// Default 10s.
	RecordHeartbeat time.Duration
	// EjectHold is the least time an ejected peer stays out of routing: the
	// records a dead peer published just before it died may still be
	// circulating, and only a record that arrives after the hold can bring
	// it back. Default 4s (2 × RecordHeartbeat when that is shorter).
	EjectHold time.Duration
	// LatencyAlpha is the weight of a new observation in the per-model
	// latency moving average, in (0, 1]. Default 0.2.
	LatencyAlpha float64

	// transport replaces memberlist's network transport (an in-memory one
	// in the scale simulation); nil binds BindAddr.
	transport memberlist.NodeAwareTransport
}

// Timers are memberlist's failure-detection and gossip settings.
type Timers struct {
	// ProbeInterval is the time between failure probes of a random node.
	ProbeInterval time.Duration
	// ProbeTimeout is how long to wait for a probe's ack.
	ProbeTimeout time.Duration
	// GossipInterval is the time between gossip rounds (broadcasts).
	GossipInterval time.Duration
	// GossipNodes is how many nodes each gossip round sends to.
	GossipNodes int
	// PushPullInterval is the time between full state syncs with a random
	// node; it repairs anything gossip lost.
	PushPullInterval time.Duration
	// TCPTimeout bounds TCP exchanges (push-pull, joins, reliable sends).
	TCPTimeout time.Duration
	// SuspicionMult scales how long a suspected node has to refute.
	SuspicionMult int
	// RetransmitMult scales how often a broadcast is retransmitted.
	RetransmitMult int
	// GossipToTheDeadTime is how long dead nodes still receive gossip.
	GossipToTheDeadTime time.Duration
}

// LANTimers returns memberlist's defaults for a LAN.
func LANTimers() Timers {
	return timersFrom(memberlist.DefaultLANConfig())
}

// LocalTimers returns memberlist's defaults for a single host (loopback).
func LocalTimers() Timers {
	return timersFrom(memberlist.DefaultLocalConfig())
}

// TestTimers returns fast settings for in-process test clusters on
// loopback: convergence in tens of milliseconds, while leaving enough slack
// that a busy machine does not produce false failure suspicions.
func TestTimers() Timers {
	return Timers{
		ProbeInterval:       200 * time.Millisecond,
		ProbeTimeout:        150 * time.Millisecond,
		GossipInterval:      20 * time.Millisecond,
		GossipNodes:         3,
		PushPullInterval:    500 * time.Millisecond,
		TCPTimeout:          2 * time.Second,
		SuspicionMult:       5,
		RetransmitMult:      3,
		GossipToTheDeadTime: 2 * time.Second,
	}
}

func timersFrom(c *memberlist.Config) Timers {
	return Timers{
		ProbeInterval:       c.ProbeInterval,
		ProbeTimeout:        c.ProbeTimeout,
		GossipInterval:      c.GossipInterval,
		GossipNodes:         c.GossipNodes,
		PushPullInterval:    c.PushPullInterval,
		TCPTimeout:          c.TCPTimeout,
		SuspicionMult:       c.SuspicionMult,
		RetransmitMult:      c.RetransmitMult,
		GossipToTheDeadTime: c.GossipToTheDeadTime,
	}
}

// ParseKey decodes a gossip encryption key given as base64 (standard or
// URL alphabet, padded or not) and checks its length (16, 24 or 32 bytes).
func ParseKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	var key []byte
	var err error
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if key, err = enc.DecodeString(s); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("mesh: gossip key is not base64: %w", err)
	}
	if err := memberlist.ValidateKey(key); err != nil {
		return nil, fmt.Errorf("mesh: gossip key: %w", err)
	}
	return key, nil
}

// gossipKeyInfo is the HKDF info of the gossip key derived from a cluster
// secret.
const gossipKeyInfo = "infermesh-gossip-v1"

// GossipKey derives the 32-byte gossip encryption key (AES-256) from a
// cluster secret with HKDF-SHA256 (no salt, info "infermesh-gossip-v1").
// Nodes with the same secret derive the same key; the secret cannot be
// recovered from it.
func GossipKey(secret string) []byte {
	k, err := hkdf.Key(sha256.New, []byte(secret), nil, gossipKeyInfo, 32)
	if err != nil {
		panic(err) // only for lengths HKDF-SHA256 cannot produce
	}
	return k
}

// withDefaults fills unset fields and validates the result.
func (c Config) withDefaults() (Config, error) {
	if c.NodeID == "" {
		return c, errors.New("mesh: NodeID is required")
	}
	if c.BindAddr == "" {
		c.BindAddr = net.JoinHostPort("0.0.0.0", strconv.Itoa(DefaultGossipPort))
	}
	if c.JoinBackoffMin <= 0 {
		c.JoinBackoffMin = 250 * time.Millisecond
	}
	if c.JoinBackoffMax < c.JoinBackoffMin {
		c.JoinBackoffMax = max(2*time.Second, c.JoinBackoffMin)
	}
	if c.Timers == (Timers{}) {
		c.Timers = LANTimers()
	}
	if c.RecordInterval <= 0 {
		c.RecordInterval = 250 * time.Millisecond
	}
	if c.RecordHeartbeat <= 0 {
		c.RecordHeartbeat = 10 * time.Second
	}
	if c.EjectHold <= 0 {
		c.EjectHold = min(4*time.Second, 2*c.RecordHeartbeat)
	}
	if c.LatencyAlpha <= 0 || c.LatencyAlpha > 1 {
		c.LatencyAlpha = 0.2
	}
	if len(c.EncryptionKey) == 0 && c.ClusterSecret != "" {
		c.EncryptionKey = GossipKey(c.ClusterSecret)
	}
	if c.EncryptionKey != nil {
		if err := memberlist.ValidateKey(c.EncryptionKey); err != nil {
			return c, fmt.Errorf("mesh: encryption key: %w", err)
		}
	}
	return c, nil
}

// memberlistConfig translates c into memberlist's configuration.
func (c Config) memberlistConfig() (*memberlist.Config, error) {
	mc := memberlist.DefaultLANConfig()
	mc.Name = c.NodeID
	host, port, err := splitHostPort(c.BindAddr, DefaultGossipPort)
	if err != nil {
		return nil, fmt.Errorf("mesh: bind address: %w", err)
	}
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertisePort = port
	if c.AdvertiseAddr != "" {
		ah, ap, err := splitHostPort(c.AdvertiseAddr, port)
		if err != nil {
			return nil, fmt.Errorf("mesh: advertise address: %w", err)
		}
		ips, err := net.LookupIP(ah)
		if err != nil || len(ips) == 0 {
			return nil, fmt.Errorf("mesh: advertise address %q does not resolve: %v", ah, err)
		}
		mc.AdvertiseAddr, mc.AdvertisePort = ips[0].String(), ap
	}
	t := c.Timers
	mc.ProbeInterval = t.ProbeInterval
	mc.ProbeTimeout = t.ProbeTimeout
	mc.GossipInterval = t.GossipInterval
	mc.GossipNodes = t.GossipNodes
	mc.PushPullInterval = t.PushPullInterval
	mc.TCPTimeout = t.TCPTimeout
	mc.SuspicionMult = t.SuspicionMult
	mc.RetransmitMult = t.RetransmitMult
	mc.GossipToTheDeadTime = t.GossipToTheDeadTime
	// A node that died may come back under its id from a new address
	// after this long (a rescheduled Kubernetes pod gets a new IP; one
	// that left gracefully may at once). Without it memberlist refuses the
	// new address for good as a name conflict.
	mc.DeadNodeReclaimTime = DeadNodeReclaimTime
	if c.EncryptionKey != nil {
		kr, err := memberlist.NewKeyring(nil, c.EncryptionKey)
		if err != nil {
			return nil, fmt.Errorf("mesh: keyring: %w", err)
		}
		mc.Keyring = kr
		mc.GossipVerifyIncoming = true
		mc.GossipVerifyOutgoing = true
	}
	return mc, nil
}

// splitHostPort splits "host:port", "host" or ":port"; a missing port is def.
func splitHostPort(addr string, def int) (string, int, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return strings.Trim(addr, "[]"), def, nil
		}
		return "", 0, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", addr)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

// attachTransport gives mc its transport: memberlist's network transport
// bound on mc's address (or c.transport, in simulations), wrapped so that
// every byte is counted (Mesh.GossipBytes) and tapped (Config.Tap). Call
// it last: nothing that can fail should follow the bind.
func (c Config) attachTransport(mc *memberlist.Config, bytes *gossipBytes) error {
	var inner memberlist.NodeAwareTransport = c.transport
	if inner == nil {
		nt, err := newNetTransport(mc.BindAddr, mc.BindPort)
		if err != nil {
			return err
		}
		if mc.BindPort == 0 {
			if mc.AdvertisePort == 0 {
				mc.AdvertisePort = nt.GetAutoBindPort()
			}
			mc.BindPort = nt.GetAutoBindPort()
		}
		inner = nt
	}
	mc.Transport = newMeteredTransport(inner, bytes, c.Tap)
	return nil
}

package mesh

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// gossipBytes counts the bytes the gossip transport moved, as they cross
// the wire (after encryption; UDP/IP headers not included).
type gossipBytes struct {
	in, out atomic.Uint64
}

// meteredTransport wraps a memberlist transport (the network one, or an
// in-memory one in simulations), counting every byte it sends and
// receives (UDP packets, inbound and outbound TCP streams) and, when tap
// is set, copying every received byte to it first (Config.Tap; tests use
// it to check what reaches a node).
type meteredTransport struct {
	memberlist.NodeAwareTransport
	bytes    *gossipBytes
	tap      func([]byte)
	packets  chan *memberlist.Packet
	streams  chan net.Conn
	done     chan struct{}
	stopOnce sync.Once
}

// newNetTransport binds memberlist's network transport on host:port (port
// 0 picks one, as memberlist does).
func newNetTransport(host string, port int) (*memberlist.NetTransport, error) {
	var (
		nt  *memberlist.NetTransport
		err error
	)
	for try := 0; try < 10; try++ {
		nt, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: port})
		if err == nil || port != 0 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("mesh: gossip transport: %w", err)
	}
	return nt, nil
}

// newMeteredTransport starts counting (and tapping, when tap is set) what
// inner moves.
func newMeteredTransport(inner memberlist.NodeAwareTransport, bytes *gossipBytes, tap func([]byte)) *meteredTransport {
	t := &meteredTransport{NodeAwareTransport: inner, bytes: bytes, tap: tap,
		packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), done: make(chan struct{})}
	go t.copyPackets()
	go t.copyStreams()
	return t
}

func (t *meteredTransport) copyPackets() {
	in := t.NodeAwareTransport.PacketCh()
	for {
		select {
		case p := <-in:
			t.bytes.in.Add(uint64(len(p.Buf)))
			if t.tap != nil {
				t.tap(p.Buf)
			}
			select {
			case t.packets <- p:
			case <-t.done:
				return
			}
		case <-t.done:
			return
		}
	}
}

func (t *meteredTransport) copyStreams() {
	in := t.NodeAwareTransport.StreamCh()
	for {
		select {
		case c := <-in:
			select {
			case t.streams <- t.wrap(c):
			case <-t.done:
				c.Close()
				return
			}
		case <-t.done:
			return
		}
	}
}

func (t *meteredTransport) wrap(c net.Conn) net.Conn {
	return &meteredConn{Conn: c, bytes: t.bytes, tap: t.tap}
}

// PacketCh delivers received packets after they were counted and tapped.
func (t *meteredTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// StreamCh delivers inbound streams whose bytes are counted.
func (t *meteredTransport) StreamCh() <-chan net.Conn { return t.streams }

// WriteTo sends a packet and counts it.
func (t *meteredTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	t.bytes.out.Add(uint64(len(b)))
	return t.NodeAwareTransport.WriteTo(b, addr)
}

// WriteToAddress sends a packet and counts it.
func (t *meteredTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	t.bytes.out.Add(uint64(len(b)))
	return t.NodeAwareTransport.WriteToAddress(b, a)
}

// DialTimeout opens an outbound stream whose bytes are counted.
func (t *meteredTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := t.NodeAwareTransport.DialTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	return t.wrap(c), nil
}

// DialAddressTimeout opens an outbound stream whose bytes are counted.
func (t *meteredTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := t.NodeAwareTransport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	return t.wrap(c), nil
}

// Shutdown stops the copying and the transport. memberlist stops reading
// before it shuts its transport down, and the network transport's
// listeners wait to hand over what they received: drain them until they
// have stopped, or the shutdown never returns.
func (t *meteredTransport) Shutdown() error {
	t.stopOnce.Do(func() { close(t.done) })
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case <-t.NodeAwareTransport.PacketCh():
			case c := <-t.NodeAwareTransport.StreamCh():
				c.Close()
			case <-stop:
				return
			}
		}
	}()
	err := t.NodeAwareTransport.Shutdown()
	close(stop)
	<-drained
	return err
}

// meteredConn counts what crosses a stream and taps what is read.
type meteredConn struct {
	net.Conn
	bytes *gossipBytes
	tap   func([]byte)
}

// Read reads from the connection, counts and taps the bytes read.
func (c *meteredConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.bytes.in.Add(uint64(n))
		if c.tap != nil {
			c.tap(p[:n])
		}
	}
	return n, err
}

// Write writes to the connection and counts the bytes written.
func (c *meteredConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.bytes.out.Add(uint64(n))
	return n, err
}

package mesh

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// tapTransport is memberlist's own network transport with every byte it
// receives (UDP packets, inbound and outbound TCP streams) copied to a
// tap first. Config.Tap installs it; tests use it to check what reaches a
// node.
type tapTransport struct {
	*memberlist.NetTransport
	tap      func([]byte)
	packets  chan *memberlist.Packet
	streams  chan net.Conn
	done     chan struct{}
	stopOnce sync.Once
}

// newTapTransport binds memberlist's transport on host:port (port 0 picks
// one, as memberlist does) and starts copying what it receives to tap.
func newTapTransport(host string, port int, tap func([]byte)) (*tapTransport, error) {
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
	t := &tapTransport{NetTransport: nt, tap: tap, packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), done: make(chan struct{})}
	go t.copyPackets()
	go t.copyStreams()
	return t, nil
}

func (t *tapTransport) copyPackets() {
	in := t.NetTransport.PacketCh()
	for {
		select {
		case p := <-in:
			t.tap(p.Buf)
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

func (t *tapTransport) copyStreams() {
	in := t.NetTransport.StreamCh()
	for {
		select {
		case c := <-in:
			select {
			case t.streams <- &tapConn{Conn: c, tap: t.tap}:
			case <-t.done:
				c.Close()
				return
			}
		case <-t.done:
			return
		}
	}
}

// PacketCh delivers received packets after the tap saw them.
func (t *tapTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// StreamCh delivers inbound streams whose reads the tap sees.
func (t *tapTransport) StreamCh() <-chan net.Conn { return t.streams }

// DialTimeout opens an outbound stream whose reads the tap sees.
func (t *tapTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := t.NetTransport.DialTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	return &tapConn{Conn: c, tap: t.tap}, nil
}

// DialAddressTimeout opens an outbound stream whose reads the tap sees.
func (t *tapTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}

// Shutdown stops the copying and the transport.
func (t *tapTransport) Shutdown() error {
	t.stopOnce.Do(func() { close(t.done) })
	return t.NetTransport.Shutdown()
}

// tapConn copies what is read from a connection to a tap.
type tapConn struct {
	net.Conn
	tap func([]byte)
}

// Read reads from the connection and taps the bytes read.
func (c *tapConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.tap(p[:n])
	}
	return n, err
}

package mesh

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// simNet is an in-memory network for memberlist: packets are dropped when
// the receiver's queue is full (as UDP would), streams are pipes, and a
// transport that shut down refuses both, so no sender blocks on a node
// that is gone.
type simNet struct {
	mu     sync.RWMutex
	byAddr map[string]*simTransport
	port   int
	drops  atomic.Uint64
}

func newSimNet() *simNet { return &simNet{byAddr: map[string]*simTransport{}} }

// simTransport is one node's end of a simNet.
type simTransport struct {
	net     *simNet
	addr    string
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	closed  bool
}

var _ memberlist.NodeAwareTransport = (*simTransport)(nil)

func (n *simNet) newTransport() *simTransport {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.port++
	t := &simTransport{net: n, addr: "127.0.0.1:" + strconv.Itoa(n.port),
		packets: make(chan *memberlist.Packet, 1024), streams: make(chan net.Conn, 64), done: make(chan struct{})}
	n.byAddr[t.addr] = t
	return t
}

func (n *simNet) peer(addr string) (*simTransport, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	t, ok := n.byAddr[addr]
	if !ok {
		return nil, fmt.Errorf("no route to %s", addr)
	}
	return t, nil
}

var errSimClosed = errors.New("sim transport closed")

func (t *simTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	host, port, _ := net.SplitHostPort(t.addr)
	p, _ := strconv.Atoi(port)
	return net.ParseIP(host), p, nil
}

func (t *simTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *simTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	dest, err := t.net.peer(a.Addr)
	if err != nil {
		return time.Time{}, err
	}
	now := time.Now()
	p := &memberlist.Packet{Buf: append([]byte(nil), b...), From: simAddr(t.addr), Timestamp: now}
	select {
	case <-dest.done:
	case dest.packets <- p:
	default:
		t.net.drops.Add(1)
	}
	return now, nil
}

func (t *simTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *simTransport) IngestPacket(net.Conn, net.Addr, time.Time, bool) error {
	return errors.New("not supported")
}

func (t *simTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *simTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	dest, err := t.net.peer(a.Addr)
	if err != nil {
		return nil, err
	}
	p1, p2 := net.Pipe()
	dest.mu.Lock()
	defer dest.mu.Unlock()
	if !dest.closed {
		select {
		case dest.streams <- p1:
			return p2, nil
		default: // a backlog as full as a listener's: refused
		}
	}
	p1.Close()
	p2.Close()
	return nil, errSimClosed
}

func (t *simTransport) StreamCh() <-chan net.Conn { return t.streams }

func (t *simTransport) IngestStream(net.Conn) error { return errors.New("not supported") }

// Shutdown refuses new streams and closes the ones not accepted yet, so
// their writers fail as they would on a connection to a dead process.
func (t *simTransport) Shutdown() error {
	t.once.Do(func() { close(t.done) })
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	for {
		select {
		case c := <-t.streams:
			c.Close()
		default:
			return nil
		}
	}
}

// simAddr is a net.Addr for a sim address.
type simAddr string

func (a simAddr) Network() string { return "sim" }
func (a simAddr) String() string  { return string(a) }

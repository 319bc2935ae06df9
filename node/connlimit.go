package node

import (
	"net"
	"sync"
)

// perClientListener caps the connections one client address may hold open
// at once on a listener; a connection over the cap is closed as soon as it
// is accepted. Behind a proxy every connection comes from the proxy, so an
// operator who trusts one raises the cap (--max-conns-per-client 0 turns
// it off).
type perClientListener struct {
	net.Listener
	max     int
	mu      sync.Mutex
	open    map[string]int
	refused func()
}

func limitPerClient(ln net.Listener, max int, refused func()) net.Listener {
	if max <= 0 {
		return ln
	}
	return &perClientListener{Listener: ln, max: max, open: map[string]int{}, refused: refused}
}

// Accept returns the next connection whose address is under its cap.
func (l *perClientListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host, _, herr := net.SplitHostPort(c.RemoteAddr().String())
		if herr != nil {
			host = c.RemoteAddr().String()
		}
		l.mu.Lock()
		if l.open[host] >= l.max {
			l.mu.Unlock()
			c.Close()
			if l.refused != nil {
				l.refused()
			}
			continue
		}
		l.open[host]++
		l.mu.Unlock()
		return &countedConn{Conn: c, l: l, host: host}, nil
	}
}

func (l *perClientListener) done(host string) {
	l.mu.Lock()
	if l.open[host]--; l.open[host] <= 0 {
		delete(l.open, host)
	}
	l.mu.Unlock()
}

// countedConn gives its slot back once, on the first Close.
type countedConn struct {
	net.Conn
	l    *perClientListener
	host string
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.done(c.host) })
	return err
}

package mesh

import (
	"sync"

	"github.com/infermesh/infermesh/mesh/route"
)

// EventType says what happened to a node.
type EventType uint8

// Event types.
const (
	// EventJoin: memberlist reports a node alive (joined or came back).
	EventJoin EventType = iota + 1
	// EventUpdate: a node's identity, health, models or routing settings
	// changed, or it was ejected or restored. Load-only changes
	// (in-flight, queue depth, latency) raise no events.
	EventUpdate
	// EventLeave: a node left gracefully.
	EventLeave
	// EventFailed: memberlist declared a node dead.
	EventFailed
)

// String returns the event type's name.
func (t EventType) String() string {
	switch t {
	case EventJoin:
		return "join"
	case EventUpdate:
		return "update"
	case EventLeave:
		return "leave"
	case EventFailed:
		return "failed"
	default:
		return "unknown"
	}
}

// Event is one membership or record change.
type Event struct {
	// Type says what happened.
	Type EventType
	// Peer is the node's view after the change (for leave and failed: the
	// last view before it went away).
	Peer route.Peer
}

// Subscription delivers events in order. The queue behind C is unbounded,
// so gossip never blocks on a slow subscriber and no event is dropped;
// subscribers should still keep up. Close releases it.
type Subscription struct {
	// C receives the events. It is closed after Close.
	C <-chan Event

	out   chan Event
	types map[EventType]bool
	hub   *hub

	mu      sync.Mutex
	queue   []Event
	wake    chan struct{}
	done    chan struct{}
	closing sync.Once
}

// Close stops delivery and closes C.
func (s *Subscription) Close() {
	s.closing.Do(func() {
		s.hub.remove(s)
		close(s.done)
	})
}

func (s *Subscription) push(e Event) {
	if len(s.types) > 0 && !s.types[e.Type] {
		return
	}
	s.mu.Lock()
	s.queue = append(s.queue, e)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Subscription) pump() {
	defer close(s.out)
	for {
		s.mu.Lock()
		q := s.queue
		s.queue = nil
		s.mu.Unlock()
		for _, e := range q {
			select {
			case s.out <- e:
			case <-s.done:
				return
			}
		}
		select {
		case <-s.wake:
		case <-s.done:
			return
		}
	}
}

// hub fans events out to subscriptions.
type hub struct {
	mu   sync.Mutex
	subs map[*Subscription]struct{}
}

func newHub() *hub { return &hub{subs: map[*Subscription]struct{}{}} }

func (h *hub) subscribe(types []EventType) *Subscription {
	s := &Subscription{
		out:  make(chan Event),
		hub:  h,
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
	s.C = s.out
	if len(types) > 0 {
		s.types = map[EventType]bool{}
		for _, t := range types {
			s.types[t] = true
		}
	}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	go s.pump()
	return s
}

func (h *hub) remove(s *Subscription) {
	h.mu.Lock()
	delete(h.subs, s)
	h.mu.Unlock()
}

func (h *hub) emit(e Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		s.push(e)
	}
}

func (h *hub) closeAll() {
	h.mu.Lock()
	subs := make([]*Subscription, 0, len(h.subs))
	for s := range h.subs {
		subs = append(subs, s)
	}
	h.mu.Unlock()
	for _, s := range subs {
		s.Close()
	}
}

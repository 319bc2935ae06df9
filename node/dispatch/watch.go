package dispatch

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infermesh/infermesh/mesh/route"
)

// peerWatchInterval is how often attempts waiting for a peer's response
// head check that the peer is still routable.
const peerWatchInterval = 250 * time.Millisecond

// attempt is one forwarded attempt waiting for its response head.
type attempt struct {
	lost   atomic.Bool
	cancel context.CancelFunc
}

// watcher abandons attempts whose peer stops being routable (gone from the
// table, failed, or ejected) before the head arrived. One goroutine per
// peer checks every peerWatchInterval while that peer has waiting
// attempts, and exits at the first check that finds none, so an attempt
// costs two map updates instead of a goroutine and a ticker of its own.
type watcher struct {
	peers Peers

	mu      sync.Mutex
	waiting map[string]map[*attempt]struct{} // peer id -> attempts; present while its goroutine runs
}

func newWatcher(peers Peers) *watcher {
	return &watcher{peers: peers, waiting: map[string]map[*attempt]struct{}{}}
}

// start registers a for peer id, starting the peer's check loop if needed.
func (w *watcher) start(id string, a *attempt) {
	w.mu.Lock()
	set, running := w.waiting[id]
	if !running {
		set = map[*attempt]struct{}{}
		w.waiting[id] = set
	}
	set[a] = struct{}{}
	w.mu.Unlock()
	if !running {
		go w.loop(id)
	}
}

// stop unregisters a; after it returns a is not cancelled by the watcher.
func (w *watcher) stop(id string, a *attempt) {
	w.mu.Lock()
	delete(w.waiting[id], a)
	w.mu.Unlock()
}

func (w *watcher) loop(id string) {
	t := time.NewTicker(peerWatchInterval)
	defer t.Stop()
	for range t.C {
		w.mu.Lock()
		if len(w.waiting[id]) == 0 {
			delete(w.waiting, id)
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		if w.routable(id) {
			continue
		}
		w.mu.Lock()
		for a := range w.waiting[id] {
			a.lost.Store(true)
			a.cancel()
		}
		clear(w.waiting[id])
		w.mu.Unlock()
	}
}

// routable reports whether peer id may still answer an attempt it holds:
// routable, or draining (a draining peer finishes what it took).
func (w *watcher) routable(id string) bool {
	for _, p := range w.peers.Peers() {
		if p.ID == id {
			return p.Routable() || (!p.Ejected && p.Health == route.HealthDraining)
		}
	}
	return false
}

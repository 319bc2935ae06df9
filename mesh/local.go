package mesh

import (
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/infermesh/infermesh/mesh/route"
	meshv1 "github.com/infermesh/infermesh/proto/gen/infermesh/mesh/v1"
)

// Routing holds the settings a node publishes about how it wants to be
// routed to. Replicated pool policy may override them on the routing side.
type Routing struct {
	// MaxInFlight is the node's in-flight cap; 0 means no cap.
	MaxInFlight int
	// Weight is the node's weight for the weighted strategy; 0 means 1.
	Weight int
	// Canary marks the node as a canary.
	Canary bool
	// CanaryPercent is the share of callers (0-100) a canary receives.
	CanaryPercent int
}

// localState is this node's own record, before it is published.
type localState struct {
	id     string
	epoch  uint64
	alpha  float64
	clock  func() time.Time
	inFl   atomic.Int64
	queue  atomic.Int64
	loadCh atomic.Bool // load changed since the last publication

	mu      sync.Mutex
	leaving bool
	seq     uint64
	health  route.Health
	routing Routing
	models  map[string]bool    // installed model -> warm
	last    *meshv1.NodeRecord // the record next built last; nil before
	info    map[string]ModelInfo
	latency map[string]float64 // model -> moving average in microseconds
	prefix  route.PrefixDigest // chat prefixes served recently (prefix.go)
}

func newLocalState(id string, epoch uint64, alpha float64, clock func() time.Time) *localState {
	return &localState{
		id: id, epoch: epoch, alpha: alpha, clock: clock,
		health:  route.HealthAlive,
		models:  map[string]bool{},
		info:    map[string]ModelInfo{},
		latency: map[string]float64{},
	}
}

// ModelInfo describes an installed model in the gossiped record.
type ModelInfo struct {
	// WireID is the short id <name>:<tag> (<provider>:<model> for upstream
	// models), so any node can resolve it.
	WireID string
	// Task is what the model does (embeddings, chat, background-removal,
	// ...).
	Task string
	// Created is when the model was installed (for upstream models, when
	// the node started serving it), Unix seconds.
	Created int64
	// SizeBytes is the total size of the model's files on the node; 0
	// for upstream models.
	SizeBytes int64
}

// setInfo replaces the model descriptions; it reports whether they changed.
func (l *localState) setInfo(info map[string]ModelInfo) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if maps.Equal(info, l.info) {
		return false
	}
	l.info = maps.Clone(info)
	return true
}

// setHealth reports whether the health changed.
func (l *localState) setHealth(h route.Health) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.health == h {
		return false
	}
	l.health = h
	return true
}

func (l *localState) getHealth() route.Health {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.health
}

func (l *localState) setRouting(r Routing) bool {
	r.CanaryPercent = min(max(r.CanaryPercent, 0), 100)
	r.MaxInFlight = max(r.MaxInFlight, 0)
	r.Weight = max(r.Weight, 0)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.routing == r {
		return false
	}
	l.routing = r
	return true
}

func (l *localState) setModels(installed, warm []string) bool {
	next := make(map[string]bool, len(installed)+len(warm))
	for _, m := range installed {
		next[m] = false
	}
	for _, m := range warm {
		next[m] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(next) == len(l.models) {
		same := true
		for m, w := range next {
			if old, ok := l.models[m]; !ok || old != w {
				same = false
				break
			}
		}
		if same {
			return false
		}
	}
	l.models = next
	return true
}

func (l *localState) observe(model string, d time.Duration) {
	us := float64(d) / float64(time.Microsecond)
	l.mu.Lock()
	if old, ok := l.latency[model]; ok {
		l.latency[model] = old + l.alpha*(us-old)
	} else {
		l.latency[model] = us
	}
	l.mu.Unlock()
	l.loadCh.Store(true)
}

func (l *localState) setInFlight(n int) {
	if l.inFl.Swap(int64(n)) != int64(n) {
		l.loadCh.Store(true)
	}
}

func (l *localState) setQueueDepth(n int) {
	if l.queue.Swap(int64(n)) != int64(n) {
		l.loadCh.Store(true)
	}
}

func (l *localState) setLeaving() {
	l.mu.Lock()
	l.leaving = true
	l.mu.Unlock()
}

// adopt moves the local version past r's if r is a record of this node
// that is not older than the last one published and is not that record
// itself; it reports whether it did. Peers echo the current record back
// (relays, push-pull), and an echo must not count as a record from an
// earlier run: moving past it publishes a record whose echo comes back in
// turn, a loop that republished many times a second.
func (l *localState) adopt(r *meshv1.NodeRecord) bool {
	v := recordVersion(r)
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := version{l.epoch, l.seq}
	if cur.after(v) || (v == cur && proto.Equal(r, l.last)) {
		return false
	}
	l.epoch, l.seq = v.epoch, v.seq
	return true
}

// next builds the next version of the record.
func (l *localState) next() *meshv1.NodeRecord {
	l.loadCh.Store(false)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	r := &meshv1.NodeRecord{
		NodeId:        l.id,
		Epoch:         l.epoch,
		Seq:           l.seq,
		Health:        healthToProto(l.health),
		InFlight:      clampU32(l.inFl.Load()),
		MaxInFlight:   uint32(l.routing.MaxInFlight),
		QueueDepth:    clampU32(l.queue.Load()),
		Weight:        uint32(l.routing.Weight),
		Canary:        l.routing.Canary,
		CanaryPercent: uint32(l.routing.CanaryPercent),
		UpdatedUnixMs: l.clock().UnixMilli(),
		Leaving:       l.leaving,
		PrefixDigest:  digestToProto(l.prefix),
	}
	ids := make([]string, 0, len(l.models))
	for m := range l.models {
		ids = append(ids, m)
	}
	slices.Sort(ids)
	for _, m := range ids {
		in := l.info[m]
		r.Models = append(r.Models, &meshv1.ModelState{Model: m, Warm: l.models[m], LatencyUs: uint64(math.Round(l.latency[m])),
			WireId: in.WireID, Task: in.Task, CreatedUnix: in.Created, SizeBytes: in.SizeBytes})
	}
	l.last = proto.Clone(r).(*meshv1.NodeRecord)
	return r
}

func clampU32(v int64) uint32 {
	return uint32(min(max(v, 0), math.MaxUint32))
}

package node

import (
	"sync"

	"github.com/infermesh/infermesh/node/engine/onnx"
)

// modelMemory estimates the memory each loaded model holds on this node.
// ONNX Runtime reports no allocator statistics through its Go binding, so
// the figure comes from the process's resident set size (onnx.ResidentBytes):
// what the process grew by across the model's load (the growth is the
// model's: weights, initialised sessions, tokenizers; a load that
// overlapped another's is not measured, rather than serialising loads for
// an estimate), plus what it grew by between the end of the load
// and the end of the model's first request served here (the run memory a
// session keeps: ONNX Runtime's arena holds a run's largest activations
// until the model is unloaded unless --memory-arena / memory_arena is off).
// The second part is counted only when no other model loaded meanwhile;
// requests for other models running at the same moment can inflate it, so
// it is an estimate. Neither part is ever negative.
type modelMemory struct {
	mu sync.Mutex
	// events counts load starts and ends: a load that sees it move by
	// more than its own start and end overlapped another.
	events uint64
	// held is each loaded model's estimate.
	held map[string]int64
	// afterLoad is the resident size when a model's load ended, for
	// models whose first request has not ended yet.
	afterLoad map[string]int64
	// loads counts finished loads; loadSeq is its value at each pending
	// model's load, so a later load voids the first-run measure.
	loads   uint64
	loadSeq map[string]uint64
}

func newModelMemory() *modelMemory {
	return &modelMemory{held: map[string]int64{}, afterLoad: map[string]int64{}, loadSeq: map[string]uint64{}}
}

// beginLoad takes the resident size before a load; the returned func
// ends the measure (ok: the load succeeded). Loads run concurrently; one
// that overlapped another records no estimate.
func (m *modelMemory) beginLoad() func(id string, ok bool) {
	m.mu.Lock()
	m.events++
	start := m.events
	m.mu.Unlock()
	before, err := onnx.ResidentBytes()
	return func(id string, ok bool) {
		after, err2 := onnx.ResidentBytes()
		m.mu.Lock()
		defer m.mu.Unlock()
		m.events++
		if !ok || err != nil || err2 != nil || m.events != start+1 {
			return
		}
		m.loads++
		m.held[id] = max(after-before, 0)
		m.afterLoad[id] = after
		m.loadSeq[id] = m.loads
	}
}

// served adds to a model's estimate what the process grew by between its
// load and the end of its first request here. Later calls do nothing.
func (m *modelMemory) served(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	after, ok := m.afterLoad[id]
	if !ok {
		return
	}
	seq := m.loadSeq[id]
	delete(m.afterLoad, id)
	delete(m.loadSeq, id)
	if seq != m.loads {
		return // another model loaded since: its growth is not this one's
	}
	now, err := onnx.ResidentBytes()
	if err != nil {
		return
	}
	m.held[id] += max(now-after, 0)
}

// pending reports whether some model's first request has not ended yet
// (served has work to do).
func (m *modelMemory) pending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.afterLoad) > 0
}

// forget drops an unloaded model's estimate.
func (m *modelMemory) forget(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.held, id)
	delete(m.afterLoad, id)
	delete(m.loadSeq, id)
}

// bytes is a loaded model's estimate (0: not loaded here).
func (m *modelMemory) bytes(id string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held[id]
}

// all copies every loaded model's estimate.
func (m *modelMemory) all() map[string]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]int64, len(m.held))
	for id, b := range m.held {
		out[id] = b
	}
	return out
}

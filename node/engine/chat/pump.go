package chat

import (
	"context"
	"sync"

	"github.com/infermesh/infermesh/node/engine"
)

// DeltaPump passes streamed deltas to a callback from a goroutine of its
// own, in order, so a slow client never holds back a batch's next step.
// The first error the callback returns is reported by the next Send and by
// Finish.
type DeltaPump struct {
	fn   func(engine.ChatDelta) error
	mu   sync.Mutex
	wake *sync.Cond
	buf  []engine.ChatDelta
	err  error
	end  bool
	done chan struct{}
}

// NewDeltaPump starts a pump delivering to fn.
func NewDeltaPump(fn func(engine.ChatDelta) error) *DeltaPump {
	p := &DeltaPump{fn: fn, done: make(chan struct{})}
	p.wake = sync.NewCond(&p.mu)
	go p.run()
	return p
}

func (p *DeltaPump) run() {
	defer close(p.done)
	var batch []engine.ChatDelta
	for {
		p.mu.Lock()
		for len(p.buf) == 0 && !p.end {
			p.wake.Wait()
		}
		if len(p.buf) == 0 {
			p.mu.Unlock()
			return
		}
		batch, p.buf = p.buf, batch[:0]
		p.mu.Unlock()
		for _, dl := range batch {
			if err := p.fn(dl); err != nil {
				p.mu.Lock()
				p.err, p.end, p.buf = err, true, nil
				p.mu.Unlock()
				return
			}
		}
	}
}

// Send queues d, or returns the callback's error.
func (p *DeltaPump) Send(d engine.ChatDelta) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	if !p.end {
		p.buf = append(p.buf, d)
		p.wake.Signal()
	}
	return nil
}

// Finish waits until every queued delta is delivered and returns the
// callback's error, if any.
func (p *DeltaPump) Finish() error {
	p.mu.Lock()
	p.end = true
	p.wake.Signal()
	p.mu.Unlock()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Pumped runs gen with a send func that reaches onDelta through a
// DeltaPump (nil onDelta: none), waits for every delta to be delivered,
// and reports the context's error when the run failed because ctx ended.
func Pumped(ctx context.Context, onDelta func(engine.ChatDelta) error, gen func(send func(engine.ChatDelta) error) (engine.ChatResponse, error)) (engine.ChatResponse, error) {
	var p *DeltaPump
	send := onDelta
	if onDelta != nil {
		p = NewDeltaPump(onDelta)
		send = p.Send
	}
	resp, err := gen(send)
	if p != nil {
		if perr := p.Finish(); err == nil {
			err = perr
		}
	}
	if err != nil && ctx.Err() != nil {
		return resp, ctx.Err()
	}
	return resp, err
}

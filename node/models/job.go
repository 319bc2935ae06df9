package models

import (
	"sync"
	"time"
)

// subBuffer is each subscriber's event buffer. Progress events are dropped
// for a subscriber whose buffer is nearly full (it sees the next one);
// started and the final event are never dropped.
const subBuffer = 64

// Job is one running pull, shared by every client that asked for it.
type Job struct {
	key   string
	start time.Time
	every time.Duration
	clock func() time.Time

	mu       sync.Mutex
	subs     map[chan Event]struct{}
	last     *Progress
	lastSent time.Time
	winStart time.Time
	winBytes int64
	bps      int64
	final    *Event
	done     chan struct{}
}

func newJob(key string, start time.Time, every time.Duration, clock func() time.Time) *Job {
	return &Job{key: key, start: start, every: every, clock: clock, subs: map[chan Event]struct{}{}, winStart: start, done: make(chan struct{})}
}

// Key is the canonical id being pulled.
func (j *Job) Key() string { return j.key }

// Done is closed when the job has ended.
func (j *Job) Done() <-chan struct{} { return j.done }

// Subscribe returns a channel of the job's events: started, the latest
// progress, the progress that follows, and the final done or error event,
// after which the channel is closed. cancel stops the subscription (the
// job goes on for the others, and on its own).
func (j *Job) Subscribe() (events <-chan Event, cancel func()) {
	ch := make(chan Event, subBuffer)
	j.mu.Lock()
	defer j.mu.Unlock()
	ch <- Event{Type: "started", ModelKey: j.key}
	if j.last != nil {
		ch <- Event{Type: "progress", ModelKey: j.key, Progress: *j.last}
	}
	if j.final != nil {
		ch <- *j.final
		close(ch)
		return ch, func() {}
	}
	j.subs[ch] = struct{}{}
	return ch, func() {
		j.mu.Lock()
		defer j.mu.Unlock()
		if _, ok := j.subs[ch]; ok {
			delete(j.subs, ch)
			close(ch)
		}
	}
}

// progress records p and sends it to subscribers, at most once per the
// configured interval unless force is set. It computes bps over windows of
// about a second and the ETA from it.
func (j *Job) progress(p Progress, force bool) {
	now := j.clock()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.last != nil && p.Completed < j.last.Completed {
		// completed never goes back; a source switch resumes, it does not
		// restart.
		p.Completed = j.last.Completed
	}
	if el := now.Sub(j.winStart); el >= time.Second {
		j.bps = int64(float64(p.Completed-j.winBytes) / el.Seconds())
		j.winStart, j.winBytes = now, p.Completed
	} else if j.bps == 0 {
		// A first estimate once there is enough time to measure over.
		if el := now.Sub(j.start); el >= 100*time.Millisecond {
			j.bps = int64(float64(p.Completed) / el.Seconds())
		}
	}
	p.BPS = j.bps
	if p.BPS > 0 && p.Total > p.Completed {
		p.ETASeconds = (p.Total - p.Completed + p.BPS - 1) / p.BPS
	}
	phaseChanged := j.last == nil || j.last.Phase != p.Phase
	j.last = &p
	if !force && !phaseChanged && now.Sub(j.lastSent) < j.every {
		return
	}
	j.lastSent = now
	e := Event{Type: "progress", ModelKey: j.key, Progress: p}
	for ch := range j.subs {
		if len(ch) < subBuffer-1 {
			ch <- e
		}
	}
}

// finish sends the final event to every subscriber and closes them.
func (j *Job) finish(e Event) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.final = &e
	for ch := range j.subs {
		ch <- e
		close(ch)
	}
	j.subs = map[chan Event]struct{}{}
	close(j.done)
}

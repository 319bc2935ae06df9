// Package batch runs embedding jobs in the background: a caller submits many
// inputs at once, gets a job id, and polls until the vectors are ready. Jobs
// run one at a time, in chunks, so they yield to interactive requests, and
// live in memory until they expire. Polling costs nothing toward limits.
package batch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// Status of a job.
type Status string

// Job states: queued → in_progress → completed | failed | cancelled.
const (
	Queued     Status = "queued"
	InProgress Status = "in_progress"
	Completed  Status = "completed"
	Failed     Status = "failed"
	Cancelled  Status = "cancelled"
)

// ErrNotFound is returned for an unknown or expired job id.
var ErrNotFound = errors.New("batch job not found")

// ErrFull is returned when too many jobs are queued.
var ErrFull = errors.New("too many batch jobs queued")

// Job is one embedding job. Fields are read through Snapshot.
type Job struct {
	// ID is "embbatch_<prefix>_<20 hex digits>", the prefix being
	// Config.Prefix.
	ID string
	// Model is the id of the embedding model the job runs on.
	Model string
	// Status is the job's state (queued, in_progress, completed, failed or
	// cancelled).
	Status Status
	// CreatedAt is when the job was submitted.
	CreatedAt time.Time
	// CompletedAt is when the job completed, failed or was cancelled; zero
	// while it is queued or running.
	CompletedAt time.Time
	// Total is the number of inputs.
	Total int
	// Done is the number of inputs embedded so far.
	Done int
	// Vectors holds one embedding per input, in input order; set only once
	// the job completed.
	Vectors [][]float32
	// Tokens is the number of prompt tokens the job used, set on completion.
	Tokens int
	// Error is the failure message of a failed job; "" otherwise.
	Error string

	dims   int
	texts  []string
	cancel context.CancelFunc
}

// EmbedderFunc returns the embedder for a model id.
type EmbedderFunc func(ctx context.Context, model string) (engine.Embedder, error)

// Config configures a Manager.
type Config struct {
	// Prefix starts every job id (the node id, so a job can be found from
	// any node later).
	Prefix string
	// Chunk is how many inputs one engine call takes.
	Chunk int
	// MaxQueued bounds jobs that are queued or running.
	MaxQueued int
	// Retain is how long finished jobs stay readable.
	Retain time.Duration
}

// Manager owns the jobs of one node.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	clock  func() time.Time
	embed  EmbedderFunc
	queue  chan *Job
	ctx    context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	jobs   map[string]*Job
	active int
}

// New starts a manager with one worker.
func New(cfg Config, embed EmbedderFunc, log *slog.Logger, clock func() time.Time) *Manager {
	if cfg.Chunk <= 0 {
		cfg.Chunk = 64
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = 16
	}
	if cfg.Retain <= 0 {
		cfg.Retain = time.Hour
	}
	ctx, stop := context.WithCancel(context.Background())
	m := &Manager{cfg: cfg, log: log, clock: clock, embed: embed, queue: make(chan *Job, cfg.MaxQueued),
		ctx: ctx, stop: stop, jobs: map[string]*Job{}}
	m.wg.Add(1)
	go m.worker()
	return m
}

// Submit queues a job for texts; dims > 0 truncates vectors.
func (m *Manager) Submit(model string, texts []string, dims int) (Job, error) {
	var b [10]byte
	rand.Read(b[:])
	j := &Job{ID: fmt.Sprintf("embbatch_%s_%s", m.cfg.Prefix, hex.EncodeToString(b[:])), Model: model, Status: Queued,
		CreatedAt: m.clock(), Total: len(texts), texts: texts, dims: dims}
	m.mu.Lock()
	m.expireLocked()
	if m.active >= m.cfg.MaxQueued {
		m.mu.Unlock()
		return Job{}, ErrFull
	}
	m.active++
	m.jobs[j.ID] = j
	m.mu.Unlock()
	m.queue <- j
	return m.Snapshot(j.ID)
}

// Snapshot returns a copy of a job.
func (m *Manager) Snapshot(id string) (Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	j, ok := m.jobs[id]
	if !ok {
		return Job{}, ErrNotFound
	}
	c := *j
	c.texts, c.cancel = nil, nil
	if j.Status != Completed {
		c.Vectors = nil
	}
	return c, nil
}

// List returns snapshots of all jobs, newest first, without vectors.
func (m *Manager) List() []Job {
	m.mu.Lock()
	ids := make([]string, 0, len(m.jobs))
	for id := range m.jobs {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	out := make([]Job, 0, len(ids))
	for _, id := range ids {
		if j, err := m.Snapshot(id); err == nil {
			j.Vectors = nil
			out = append(out, j)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].CreatedAt.After(out[b].CreatedAt) })
	return out
}

// Cancel stops a queued or running job.
func (m *Manager) Cancel(id string) (Job, error) {
	m.mu.Lock()
	j, ok := m.jobs[id]
	if ok && (j.Status == Queued || j.Status == InProgress) {
		j.Status = Cancelled
		j.CompletedAt = m.clock()
		j.texts = nil
		if j.cancel != nil {
			j.cancel()
		}
	}
	m.mu.Unlock()
	if !ok {
		return Job{}, ErrNotFound
	}
	return m.Snapshot(id)
}

// Close stops the worker; running jobs are cancelled.
func (m *Manager) Close() {
	m.stop()
	m.wg.Wait()
}

func (m *Manager) expireLocked() {
	now := m.clock()
	for id, j := range m.jobs {
		if !j.CompletedAt.IsZero() && now.Sub(j.CompletedAt) > m.cfg.Retain {
			delete(m.jobs, id)
		}
	}
}

func (m *Manager) worker() {
	defer m.wg.Done()
	for {
		select {
		case <-m.ctx.Done():
			return
		case j := <-m.queue:
			m.run(j)
		}
	}
}

func (m *Manager) finish(j *Job, st Status, errMsg string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.active--
	if j.Status == Cancelled {
		return
	}
	j.Status, j.Error, j.CompletedAt, j.texts = st, errMsg, m.clock(), nil
}

func (m *Manager) run(j *Job) {
	ctx, cancel := context.WithCancel(m.ctx)
	defer cancel()
	m.mu.Lock()
	if j.Status == Cancelled {
		m.mu.Unlock()
		m.finish(j, Cancelled, "")
		return
	}
	j.Status, j.cancel = InProgress, cancel
	texts := j.texts
	m.mu.Unlock()
	emb, err := m.embed(ctx, j.Model)
	if err != nil {
		m.finish(j, Failed, err.Error())
		return
	}
	vectors := make([][]float32, 0, len(texts))
	tokens := 0
	for start := 0; start < len(texts); start += m.cfg.Chunk {
		end := min(start+m.cfg.Chunk, len(texts))
		res, err := emb.Embed(ctx, engine.EmbedRequest{Texts: texts[start:end], Dimensions: j.dims})
		if err != nil {
			if ctx.Err() != nil {
				m.finish(j, Cancelled, "")
			} else {
				m.finish(j, Failed, err.Error())
			}
			return
		}
		vectors = append(vectors, res.Vectors...)
		tokens += res.PromptTokens
		m.mu.Lock()
		j.Done = end
		m.mu.Unlock()
	}
	m.mu.Lock()
	j.Vectors, j.Tokens = vectors, tokens
	m.mu.Unlock()
	m.finish(j, Completed, "")
	m.log.Info("batch job completed", "id", j.ID, "inputs", len(texts), "tokens", tokens)
}

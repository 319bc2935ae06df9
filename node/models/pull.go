package models

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/infermesh/infermesh/node/apierr"
)

// PeerSource is a peer of the mesh that has a model installed and can send
// its manifest and files. The node implements it over mesh/transfer.
type PeerSource interface {
	// ID is the peer's node id.
	ID() string
	// Manifest returns the peer's manifest of the model.
	Manifest(ctx context.Context, model string) (*Manifest, error)
	// Fetch writes the file's bytes from offset to w.
	Fetch(ctx context.Context, model, file string, offset int64, w io.Writer) error
}

// PullConfig configures a Puller.
type PullConfig struct {
	// Store is where pulled models are installed and already installed ones
	// are found.
	Store *Store
	// Catalog resolves keys to entries: install recipe, file URLs, digests.
	Catalog *Catalog
	// Peers lists the peers that have a model installed and can send it
	// now, best first. Nil means no peers.
	Peers func(model string) []PeerSource
	// Installed runs after a pull installed a model (the node loads it,
	// making it warm, and gossips it). An error fails the pull, but the
	// model stays installed.
	Installed func(m *Manifest) error
	// HTTP fetches outside sources; default a client with dial and header
	// time-outs and no overall time-out.
	HTTP *http.Client
	// Retries bounds attempts per file at the outside source (each resumes
	// where the last stopped). Default 5.
	Retries int
	// StallTimeout abandons an attempt that received nothing this long.
	// Default 30s.
	StallTimeout time.Duration
	// ProgressEvery is the least time between two progress events of a
	// job (the last one of each file is always sent). Default 100ms.
	ProgressEvery time.Duration
	// Logger receives the puller's logs; nil discards them.
	Logger *slog.Logger
	// Clock tells the time for durations and download rates; nil means
	// time.Now.
	Clock func() time.Time
}

// Event is one event of a pull's stream.
type Event struct {
	// Type is started, progress, done or error.
	Type string
	// ModelKey is the id of the model being pulled (canonical when the
	// catalogue or store knows it); set on every event.
	ModelKey string
	// Progress is set on progress events.
	Progress Progress
	// DurationMS is set on done.
	DurationMS int64
	// Code and Message are set on error.
	Code, Message string
}

// Progress is the data of a progress event.
type Progress struct {
	// Phase is a free-text label of the current step: "downloading <file>
	// from <source>", "verifying <file>", "installing", "loading" or
	// "already installed".
	Phase string `json:"phase"`
	// Completed is the number of bytes received so far, over all files; it
	// never goes back.
	Completed int64 `json:"completed"`
	// Total is the size of all files in bytes, as far as known: it grows when
	// a source reports a size the catalogue did not give.
	Total int64 `json:"total"`
	// BPS is the download rate in bytes per second, measured over windows of
	// about a second; 0 until first measured.
	BPS int64 `json:"bps"`
	// ETASeconds is the estimated seconds left, rounded up; 0 when the rate
	// is unknown or nothing is left.
	ETASeconds int64 `json:"eta_seconds"`
}

// Puller runs pulls. Pulls of the same model share one job, whichever id
// (canonical or wire) each caller used: a job is listed under the id it
// was asked by and, once known, under the model's canonical id.
type Puller struct {
	cfg    PullConfig
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	mu   sync.Mutex
	jobs map[string]*Job
	wg   sync.WaitGroup
}

// NewPuller builds a Puller.
func NewPuller(cfg PullConfig) *Puller {
	if cfg.Retries <= 0 {
		cfg.Retries = 5
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = 30 * time.Second
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 100 * time.Millisecond
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.HTTP == nil {
		cfg.HTTP = DefaultHTTPClient()
	}
	if cfg.Peers == nil {
		cfg.Peers = func(string) []PeerSource { return nil }
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Puller{cfg: cfg, log: cfg.Logger.With("component", "pull"), ctx: ctx, cancel: cancel, jobs: map[string]*Job{}}
}

// DefaultHTTPClient is the client for outside sources: proxy from the
// environment, bounded dial and response-header waits, no overall limit
// (model files are large; stalls are caught by StallTimeout).
func DefaultHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		ResponseHeaderTimeout: 30 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConnsPerHost:   4,
	}}
}

// ErrUnknownModel is returned by Pull for a key that neither the catalogue
// nor any peer knows.
var ErrUnknownModel = errors.New("model is not in the catalogue and no peer has it")

// Pull starts a pull of key (canonical or wire id), or joins the one
// already running for it.
func (p *Puller) Pull(key string) (*Job, error) {
	id := key
	entry, inCatalog := p.cfg.Catalog.Get(key)
	if inCatalog {
		id = entry.Key
	}
	installed, _ := p.cfg.Store.Get(key)
	if installed != nil {
		id = installed.ID
	}
	peers := p.cfg.Peers(key)
	if !inCatalog && installed == nil && len(peers) == 0 {
		return nil, fmt.Errorf("%s: %w", key, ErrUnknownModel)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		return nil, errors.New("the node is shutting down")
	}
	if j, ok := p.jobs[id]; ok {
		return j, nil
	}
	j := newJob(id, p.cfg.Clock(), p.cfg.ProgressEvery, p.cfg.Clock)
	p.jobs[id] = j
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		final := p.run(j, entry, inCatalog, installed, peers)
		p.mu.Lock()
		for k, v := range p.jobs {
			if v == j {
				delete(p.jobs, k)
			}
		}
		p.mu.Unlock()
		j.finish(final)
	}()
	return j, nil
}

// Running lists the ids being pulled now (a job's own id, once each).
func (p *Puller) Running() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.jobs))
	for id, j := range p.jobs {
		if id == j.key {
			out = append(out, id)
		}
	}
	return out
}

// claim lists j under the canonical id its plan found (a pull asked by a
// wire id of a model only peers have learns it from a peer's manifest).
// When another job already holds that id, claim returns it, and j follows
// it instead of downloading the same files into the same staging folder.
func (p *Puller) claim(j *Job, id string) *Job {
	p.mu.Lock()
	defer p.mu.Unlock()
	if other, ok := p.jobs[id]; ok && other != j {
		return other
	}
	p.jobs[id] = j
	return nil
}

// follow makes j repeat other's progress and end as other ends.
func (p *Puller) follow(j, other *Job) Event {
	events, cancel := other.Subscribe()
	defer cancel()
	final := Event{Type: "error", Code: apierr.CodeDownloadFailed, Message: "the shared pull ended without a result"}
	for e := range events {
		switch e.Type {
		case "progress":
			j.progress(e.Progress, true)
		case "done", "error":
			final = e
		}
	}
	final.ModelKey = j.key
	return final
}

// Close cancels every running pull (their staged files stay, so a later
// pull resumes) and waits for them to end.
func (p *Puller) Close() {
	p.cancel()
	p.wg.Wait()
}

// run does one pull and returns its final event.
func (p *Puller) run(j *Job, entry Entry, inCatalog bool, installed *Manifest, peers []PeerSource) Event {
	start := p.cfg.Clock()
	fail := func(code string, err error) Event {
		p.log.Warn("pull failed", "model", j.key, "code", code, "err", err)
		if p.ctx.Err() != nil {
			code = apierr.CodeDraining
		}
		return Event{Type: "error", ModelKey: j.key, Code: code, Message: err.Error()}
	}
	done := func() Event {
		return Event{Type: "done", ModelKey: j.key, DurationMS: p.cfg.Clock().Sub(start).Milliseconds()}
	}
	if installed != nil {
		total := installed.TotalSize()
		j.progress(Progress{Phase: "already installed", Completed: total, Total: total}, true)
		if err := p.cfg.Installed(installed); err != nil {
			return fail(apierr.CodeLoadFailed, err)
		}
		return done()
	}
	plan, err := p.plan(j, entry, inCatalog, peers)
	if err != nil {
		return fail(apierr.CodeDownloadFailed, err)
	}
	if other := p.claim(j, plan.manifest.ID); other != nil {
		return p.follow(j, other)
	}
	if m, err := p.cfg.Store.Get(plan.manifest.ID); err == nil {
		// A pull by the other id installed it while this one planned.
		total := m.TotalSize()
		j.progress(Progress{Phase: "already installed", Completed: total, Total: total}, true)
		if err := p.cfg.Installed(m); err != nil {
			return fail(apierr.CodeLoadFailed, err)
		}
		return done()
	}
	dir := p.cfg.Store.StagingDir(plan.manifest.ID)
	d := &download{p: p, j: j, plan: plan, dir: dir, peers: peers}
	if code, err := d.run(); err != nil {
		return fail(code, err)
	}
	m := plan.manifest
	m.Sizes, m.SHA256 = d.sizes, d.sums
	j.progress(Progress{Phase: "installing", Completed: d.completed(), Total: d.total()}, true)
	if err := p.cfg.Store.InstallStaged(dir, m); err != nil {
		return fail(apierr.CodeInstallFailed, err)
	}
	j.progress(Progress{Phase: "loading", Completed: d.completed(), Total: d.total()}, true)
	if err := p.cfg.Installed(m); err != nil {
		return fail(apierr.CodeLoadFailed, err)
	}
	p.log.Info("pull done", "model", m.ID, "bytes", m.TotalSize(), "duration", p.cfg.Clock().Sub(start))
	return done()
}

// planFile is one file to fetch.
type planFile struct {
	name, url, sha string
	size           int64
}

// pullPlan is what a pull installs and where each file comes from.
type pullPlan struct {
	manifest *Manifest
	files    []planFile
}

// plan combines the catalogue entry and a peer's manifest: the entry
// decides the recipe when there is one; a digest or size the entry lacks
// comes from the peer, which verified its copy when it installed it.
func (p *Puller) plan(j *Job, entry Entry, inCatalog bool, peers []PeerSource) (*pullPlan, error) {
	var peerM *Manifest
	for _, src := range peers {
		ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
		m, err := src.Manifest(ctx, j.key)
		cancel()
		if err == nil {
			peerM = m
			break
		}
		p.log.Info("peer has no usable manifest", "model", j.key, "peer", src.ID(), "err", err)
	}
	if !inCatalog && peerM == nil {
		return nil, fmt.Errorf("no peer that has %s answered, and the catalogue does not list it", j.key)
	}
	plan := &pullPlan{}
	if inCatalog {
		plan.manifest = entry.Manifest()
		for _, f := range entry.Files {
			pf := planFile{name: f.Name, url: f.URL, sha: f.SHA256, size: f.Size}
			if peerM != nil {
				if pf.sha == "" {
					pf.sha = peerM.SHA256[f.Name]
				}
				if pf.size == 0 {
					pf.size = peerM.Sizes[f.Name]
				}
			}
			plan.files = append(plan.files, pf)
		}
		return plan, nil
	}
	m := *peerM
	m.Sizes, m.SHA256, m.Created = nil, nil, 0
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("peer manifest: %w", err)
	}
	plan.manifest = &m
	for _, f := range peerM.FileNames() {
		plan.files = append(plan.files, planFile{name: f, sha: peerM.SHA256[f], size: peerM.Sizes[f]})
	}
	return plan, nil
}

// hostOf names an outside source in progress phases.
func hostOf(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		return u.Host
	}
	return raw
}

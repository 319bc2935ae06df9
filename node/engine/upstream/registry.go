package upstream

import (
	"log/slog"
	"net/http"
	"sort"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// ModelInfo describes one served provider model.
type ModelInfo struct {
	// ID is the canonical id upstream/<provider>/<model>.
	ID string
	// WireID is <provider>:<model>, with the provider's model name as given.
	WireID string
	// Task is chat, embeddings, image-generation or text-to-speech.
	Task engine.Task
	// Provider is the configured provider's name.
	Provider string
	// Model is the provider's name for the model.
	Model string
	// Created is when the registry was built, Unix seconds.
	Created int64
}

// Registry holds a node's providers and their engines. Its engines are
// always warm: they hold no weights, only an HTTP client. A nil *Registry
// serves no models.
type Registry struct {
	models  []ModelInfo
	engines map[string]engine.Engine // by canonical and wire id
	clients []*client
}

// Options are the registry's dependencies.
type Options struct {
	// Getenv looks up api_key_env variables; nil means none are set.
	Getenv func(string) string
	// Logger receives one line per provider (never its key).
	Logger *slog.Logger
	// Clock stamps the models' creation time; nil means time.Now.
	Clock func() time.Time
}

// New validates cfg, reads the providers' keys and builds an engine per
// allowed model.
func New(cfg Config, opt Options) (*Registry, error) {
	if opt.Getenv == nil {
		opt.Getenv = func(string) string { return "" }
	}
	if opt.Clock == nil {
		opt.Clock = time.Now
	}
	provs, err := cfg.resolve(opt.Getenv)
	if err != nil {
		return nil, err
	}
	created := opt.Clock().Unix()
	r := &Registry{engines: map[string]engine.Engine{}}
	for _, p := range provs {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		c := &client{p: p, http: &http.Client{Transport: tr}}
		r.clients = append(r.clients, c)
		var ids []string
		for _, m := range p.models {
			var eng engine.Engine
			switch m.task {
			case engine.TaskEmbeddings:
				eng = &embedEngine{providerModel{c: c, m: m}}
			case engine.TaskImageGeneration:
				eng = &imageEngine{providerModel{c: c, m: m}}
			case engine.TaskTextToSpeech:
				eng = &speechEngine{providerModel{c: c, m: m}}
			default:
				eng = &chatEngine{providerModel{c: c, m: m}}
			}
			r.engines[m.id], r.engines[m.wire] = eng, eng
			r.models = append(r.models, ModelInfo{ID: m.id, WireID: m.wire, Task: m.task, Provider: p.name, Model: m.Model, Created: created})
			ids = append(ids, m.id)
		}
		if opt.Logger != nil {
			opt.Logger.Info("upstream provider", "provider", p.name, "base_url", p.base, "key", p.key != "", "timeout", p.timeout, "models", ids)
		}
	}
	sort.Slice(r.models, func(i, j int) bool { return r.models[i].ID < r.models[j].ID })
	return r, nil
}

// Models lists the served provider models, sorted by canonical id.
func (r *Registry) Models() []ModelInfo {
	if r == nil {
		return nil
	}
	return append([]ModelInfo(nil), r.models...)
}

// Engine returns the engine of a canonical or wire id.
func (r *Registry) Engine(id string) (engine.Engine, bool) {
	if r == nil {
		return nil, false
	}
	e, ok := r.engines[id]
	return e, ok
}

// Close drops the providers' idle connections.
func (r *Registry) Close() {
	if r == nil {
		return
	}
	for _, c := range r.clients {
		c.http.CloseIdleConnections()
	}
}

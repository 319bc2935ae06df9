package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"time"

	"github.com/infermesh/infermesh/consensus"
	"github.com/infermesh/infermesh/mesh/route"
	"github.com/infermesh/infermesh/mesh/transfer"
	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/models"
)

// hubDeps are what the api.ModelHub needs: the store, catalogue and
// engines, the backend (a pull key may name a mesh model) and the cluster
// (holders, replicated policy, transfer client) once Start built it.
type hubDeps struct {
	nodeID  string
	store   *models.Store
	catalog *models.Catalog
	engines *engines
	backend *backend
	cluster *cluster
	log     *slog.Logger
}

// hub is the api.ModelHub: catalogue, pulls (from peers first, then the
// outside source), provenance and operator removal. Its puller is set
// right after the hub, whose pullPeers and pulledInstalled it calls.
type hub struct {
	hubDeps
	puller *models.Puller
}

func newHub(d hubDeps) *hub { return &hub{hubDeps: d} }

var _ api.ModelHub = (*hub)(nil)

// Catalog lists the catalogue with this node's state of each model.
func (n *hub) Catalog() []api.CatalogEntry {
	holders := n.modelHolders()
	entries := n.catalog.Entries()
	out := make([]api.CatalogEntry, 0, len(entries))
	for _, e := range entries {
		row := api.CatalogEntry{Listing: e.Listing, InstalledOn: nonNil(holders[e.Key])}
		row.Modalities, row.Tags = nonNil(e.Modalities), nonNil(e.Tags)
		if _, err := n.store.Get(e.Key); err == nil {
			row.IsInstalled = true
			row.IsActive = n.engines.isWarm(e.Key)
		}
		if t := n.engines.lastUsed(e.Key); !t.IsZero() {
			s := t.UTC().Format(time.RFC3339)
			row.LastUsedUTC = &s
		}
		out = append(out, row)
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// modelHolders maps each model id to the routable nodes that have it
// installed (this node included), sorted.
func (n *hub) modelHolders() map[string][]string {
	out := map[string][]string{}
	for _, m := range n.store.List() {
		out[m.ID] = append(out[m.ID], n.nodeID)
	}
	if n.cluster.mesh == nil {
		return out
	}
	for _, p := range n.cluster.mesh.Peers() {
		if p.Self || p.Health == route.HealthUnknown {
			continue
		}
		for id := range p.Models {
			out[id] = append(out[id], p.ID)
		}
	}
	for id := range out {
		sort.Strings(out[id])
	}
	return out
}

// RefreshCatalog reloads every catalogue source.
func (n *hub) RefreshCatalog(ctx context.Context) (api.CatalogRefresh, error) {
	ch, err := n.catalog.Refresh(ctx)
	if err != nil {
		return api.CatalogRefresh{}, err
	}
	return api.CatalogRefresh{Object: "catalog.refresh", Added: ch.Added, Removed: ch.Removed, Changed: ch.Changed,
		Entries: ch.Entries, Sources: ch.Sources}, nil
}

// Provenance returns the model card registered for id: the installed
// model's own, else the catalogue entry's.
func (n *hub) Provenance(id string) (api.ModelCard, bool) {
	var card *models.Card
	key := id
	if m, err := n.store.Get(id); err == nil {
		card, key = m.Card, m.ID
	} else if e, ok := n.catalog.Get(id); ok {
		card, key = e.Card, e.Key
	}
	if card == nil {
		// Models installed without a card (e.g. by `make assets`) get the
		// card the catalogue registers for their id.
		c, ok := n.catalog.Card(key)
		if !ok {
			return api.ModelCard{}, false
		}
		card = &c
	}
	return api.ModelCard{Model: key, Object: "model.card", Publisher: card.Publisher, Source: card.Source,
		License: card.License, IntendedUse: card.IntendedUse, KnownLimitations: card.KnownLimitations}, true
}

// PullAllowed applies the replicated governance mode and model lifecycle.
func (n *hub) PullAllowed(key string) *apierr.Error {
	if n.cluster.raft == nil {
		return nil
	}
	pol := n.cluster.raft.State().Policy()
	if pol.Governance == consensus.GovernanceCurated {
		return apierr.New(http.StatusForbidden, apierr.TypePermission, apierr.CodeGovernanceDenied, "model_key",
			"Model downloads are disabled: the operator's governance mode is curated.")
	}
	id := key
	if e, ok := n.catalog.Get(key); ok {
		id = e.Key
	} else if m, ok := n.backend.Model(key); ok {
		id = m.ID
	}
	if lc, _ := n.cluster.modelLifecycle(id); lc == consensus.LifecycleBlocked {
		return apierr.New(http.StatusForbidden, apierr.TypePermission, apierr.CodeModelBlocked, "model_key",
			fmt.Sprintf("The model '%s' is blocked by the operator's model policy.", id))
	}
	return nil
}

// Pull starts or joins a pull on this node.
func (n *hub) Pull(key string) (api.PullJob, error) {
	j, err := n.puller.Pull(key)
	if errors.Is(err, models.ErrUnknownModel) {
		return nil, fmt.Errorf("the model '%s' is not in the catalogue and no node of the mesh has it: %w", key, api.ErrModelNotFound)
	}
	if err != nil {
		return nil, err
	}
	return pullJob{j}, nil
}

// pullJob adapts a models.Job to the API's events.
type pullJob struct{ j *models.Job }

func (p pullJob) Subscribe() (<-chan api.PullEvent, func()) {
	in, cancel := p.j.Subscribe()
	out := make(chan api.PullEvent)
	stop := make(chan struct{})
	go func() {
		defer close(out)
		for e := range in {
			select {
			case out <- pullEvent(e):
			case <-stop:
				return
			}
		}
	}()
	return out, func() { close(stop); cancel() }
}

// pullEvent is the SSE form of a pull event. The error event's data is
// {"model_key", "error": {"message", "type", "code"}}, the OpenAI error
// object, so clients parse it like any other error.
func pullEvent(e models.Event) api.PullEvent {
	switch e.Type {
	case "progress":
		return api.PullEvent{Name: "progress", Data: e.Progress}
	case "done":
		return api.PullEvent{Name: "done", Data: map[string]any{"model_key": e.ModelKey, "duration_ms": e.DurationMS}}
	case "error":
		return api.PullEvent{Name: "error", Data: map[string]any{"model_key": e.ModelKey,
			"error": map[string]any{"message": e.Message, "type": apierr.TypeServer, "code": e.Code}}}
	}
	return api.PullEvent{Name: "started", Data: map[string]any{"model_key": e.ModelKey}}
}

// RemoveModel unloads and uninstalls a model from this node.
func (n *hub) RemoveModel(id string) error {
	m, err := n.store.Get(id)
	if err != nil {
		return errNotFound(id)
	}
	n.engines.unload(m.ID)
	if err := n.store.Remove(m.ID); err != nil {
		return err
	}
	n.log.Info("model removed by the operator", "id", m.ID)
	publishModels(n.cluster, n.store, n.engines)
	return nil
}

// pulledInstalled warms a model a pull installed and gossips it.
func (n *hub) pulledInstalled(m *models.Manifest) error {
	defer publishModels(n.cluster, n.store, n.engines)
	_, err := n.engines.load(m)
	return err
}

// pullPeers lists the routable peers that have a model installed, least
// loaded first, as pull sources.
func (n *hub) pullPeers(model string) []models.PeerSource {
	c := n.cluster
	if c.mesh == nil || c.xferCli == nil {
		return nil
	}
	var peers []route.Peer
	for _, p := range c.mesh.Peers() {
		if p.Self || p.Ejected || (p.Health != route.HealthReady && p.Health != route.HealthSaturated) {
			continue
		}
		if _, ok := p.Models[model]; ok {
			peers = append(peers, p)
			continue
		}
		for _, pm := range p.Models {
			if pm.WireID != "" && pm.WireID == model {
				peers = append(peers, p)
				break
			}
		}
	}
	sort.SliceStable(peers, func(i, j int) bool { return peers[i].InFlight < peers[j].InFlight })
	out := make([]models.PeerSource, 0, len(peers))
	for _, p := range peers {
		out = append(out, peerSource{id: p.ID, addr: p.RPCAddr, c: c.xferCli})
	}
	return out
}

// peerSource is one peer as a pull source, over mesh/transfer.
type peerSource struct {
	id, addr string
	c        *transfer.Client
}

func (p peerSource) ID() string { return p.id }

func (p peerSource) Manifest(ctx context.Context, model string) (*models.Manifest, error) {
	b, err := p.c.Manifest(ctx, p.addr, model)
	if err != nil {
		return nil, err
	}
	return models.ParseManifest(b)
}

func (p peerSource) Fetch(ctx context.Context, model, file string, offset int64, w io.Writer) error {
	return p.c.Fetch(ctx, p.addr, model, file, offset, w)
}

// storeFiles serves installed model files to peers (transfer.Files).
type storeFiles struct{ s *models.Store }

func (f storeFiles) Manifest(model string) ([]byte, error) {
	b, err := f.s.ManifestJSON(model)
	if errors.Is(err, models.ErrNotFound) {
		return nil, transfer.ErrNotFound
	}
	return b, err
}

func (f storeFiles) Open(model, file string) (io.ReadSeekCloser, int64, string, error) {
	m, path, err := f.s.Path(model, file)
	if errors.Is(err, models.ErrNotFound) {
		return nil, 0, "", transfer.ErrNotFound
	}
	if err != nil {
		return nil, 0, "", err
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, 0, "", err
	}
	return fh, m.Sizes[file], m.SHA256[file], nil
}

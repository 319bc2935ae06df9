package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/models"
)

// This file makes *Node the api.Backend.

func (n *Node) toAPI(m *models.Manifest) api.Model {
	return api.Model{
		ID: m.ID, WireID: m.WireID(), Runtime: m.Runtime(), Task: m.Task,
		Modalities: m.Modalities, Created: m.Created, SizeBytes: m.TotalSize(),
		Warm: n.engines.isWarm(m.ID),
	}
}

// Models lists the installed models.
func (n *Node) Models() []api.Model {
	ms := n.store.List()
	out := make([]api.Model, 0, len(ms))
	for _, m := range ms {
		out = append(out, n.toAPI(m))
	}
	return out
}

// Model resolves a canonical or wire id.
func (n *Node) Model(id string) (api.Model, bool) {
	m, err := n.store.Get(id)
	if err != nil {
		return api.Model{}, false
	}
	return n.toAPI(m), true
}

// Embedder returns the embeddings engine of a model.
func (n *Node) Embedder(ctx context.Context, id string) (engine.Embedder, error) {
	e, err := n.engines.get(ctx, id, engine.TaskEmbeddings)
	if err != nil {
		return nil, err
	}
	return e.(engine.Embedder), nil
}

// BackgroundRemover returns the background-removal engine of a model, or
// of the first installed one when id is empty.
func (n *Node) BackgroundRemover(ctx context.Context, id string) (engine.BackgroundRemover, string, error) {
	if id == "" {
		for _, m := range n.store.List() {
			if engine.Task(m.Task) == engine.TaskBackgroundRemoval {
				id = m.ID
				break
			}
		}
		if id == "" {
			return nil, "", fmt.Errorf("no background-removal model installed: %w", api.ErrModelNotFound)
		}
	}
	e, err := n.engines.get(ctx, id, engine.TaskBackgroundRemoval)
	if err != nil {
		return nil, "", err
	}
	return e.(engine.BackgroundRemover), e.ID(), nil
}

// Draining reports whether the node is shutting down.
func (n *Node) Draining() bool { return n.draining.Load() }

// Status is the dashboard's view of this node.
func (n *Node) Status() map[string]any {
	state := "ready"
	if n.Draining() {
		state = "draining"
	}
	type modelRow struct {
		ID     string `json:"id"`
		WireID string `json:"wire_id"`
		Task   string `json:"task"`
		Warm   bool   `json:"warm"`
	}
	var rows []modelRow
	for _, m := range n.Models() {
		rows = append(rows, modelRow{m.ID, m.WireID, m.Task, m.Warm})
	}
	return map[string]any{
		"node_id":        n.cfg.NodeID,
		"state":          state,
		"version":        n.cfg.Version,
		"uptime_seconds": int64(n.clock().Sub(n.started).Seconds()),
		"models":         rows,
		"peers":          []any{},
	}
}

var _ api.Backend = (*Node)(nil)

// errNotFound wraps models.ErrNotFound as the API's sentinel.
func errNotFound(id string) error {
	return fmt.Errorf("the model '%s' does not exist or is not installed on this mesh: %w", id, api.ErrModelNotFound)
}

func isNotFound(err error) bool { return errors.Is(err, models.ErrNotFound) }

package node

import (
	"context"
	"fmt"
	"os"

	"github.com/infermesh/infermesh/mesh"
	"github.com/infermesh/infermesh/node/api"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/upstream"
)

// This file wires upstream providers (runtime "upstream") into the node:
// their models are listed, gossiped and served like installed models, and
// always warm.

// initUpstream loads the providers file named in the config, if any.
func (n *Node) initUpstream() error {
	if n.cfg.ProvidersFile == "" {
		return nil
	}
	cfg, err := upstream.LoadConfig(n.cfg.ProvidersFile)
	if err != nil {
		return err
	}
	reg, err := upstream.New(cfg, upstream.Options{Getenv: os.Getenv, Logger: n.log, Clock: n.clock})
	if err != nil {
		return fmt.Errorf("providers file %s:\n%w", n.cfg.ProvidersFile, err)
	}
	n.engines.upstream = reg
	return nil
}

// upstreamModels is the API's view of the provider models.
func (e *engines) upstreamModels() []api.Model {
	var out []api.Model
	for _, m := range e.upstream.Models() {
		out = append(out, api.Model{ID: m.ID, WireID: m.WireID, Runtime: "upstream", Task: string(m.Task),
			Modalities: []string{string(m.Task)}, Created: m.Created, Warm: true})
	}
	return out
}

// publishUpstream adds the provider models to the gossiped model info and
// returns their ids (installed and warm).
func (e *engines) publishUpstream(info map[string]mesh.ModelInfo) []string {
	var ids []string
	for _, m := range e.upstream.Models() {
		info[m.ID] = mesh.ModelInfo{WireID: m.WireID, Task: string(m.Task), Created: m.Created}
		ids = append(ids, m.ID)
	}
	return ids
}

// fromUpstream returns the provider engine for id when id names one; ok is
// false when it does not.
func (e *engines) fromUpstream(_ context.Context, id string, task engine.Task) (eng engine.Engine, ok bool, err error) {
	eng, ok = e.upstream.Engine(id)
	if !ok {
		return nil, false, nil
	}
	var want bool
	switch task {
	case engine.TaskChat:
		_, want = eng.(engine.Chatter)
	case engine.TaskEmbeddings:
		_, want = eng.(engine.Embedder)
	case engine.TaskImageGeneration:
		_, want = eng.(engine.ImageGenerator)
	case engine.TaskTextToSpeech:
		_, want = eng.(engine.Speaker)
	}
	if !want {
		return nil, true, fmt.Errorf("model %s does not serve %s: %w", eng.ID(), task, api.ErrWrongTask)
	}
	return eng, true, nil
}

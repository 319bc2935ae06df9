package node

import (
	"log/slog"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// --memory-arena reaches the node's ONNX Runtime handle, from which every
// model's sessions take their default.
func TestMemoryArenaReachesTheRuntime(t *testing.T) {
	for arena, want := range map[string]struct {
		keeps bool
		idle  time.Duration
	}{"on": {true, 0}, "off": {false, 0}, "5m": {true, 5 * time.Minute}} {
		cfg := Defaults()
		cfg.MemoryArena, cfg.ORTLibrary = arena, onnxtest.LibraryPath(t)
		e := newEngines(cfg, slog.New(slog.DiscardHandler), nil)
		rt, err := e.runtime()
		if err != nil {
			t.Fatal(err)
		}
		if rt.KeepsArena() != want.keeps || rt.ArenaIdle() != want.idle {
			t.Errorf("--memory-arena %s: runtime keeps arena %v, idle %v", arena, rt.KeepsArena(), rt.ArenaIdle())
		}
		e.close()
	}
}

package node

import (
	"log/slog"
	"testing"

	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// --memory-arena reaches the node's ONNX Runtime handle, from which every
// model's sessions take their default.
func TestMemoryArenaReachesTheRuntime(t *testing.T) {
	for arena, keeps := range map[string]bool{"on": true, "off": false} {
		cfg := Defaults()
		cfg.MemoryArena, cfg.ORTLibrary = arena, onnxtest.LibraryPath(t)
		e := newEngines(cfg, slog.New(slog.DiscardHandler), nil)
		rt, err := e.runtime()
		if err != nil {
			t.Fatal(err)
		}
		if rt.KeepsArena() != keeps {
			t.Errorf("--memory-arena %s: runtime keeps arena %v", arena, rt.KeepsArena())
		}
		e.close()
	}
}

package node_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
	"github.com/infermesh/infermesh/node/models"
)

// runNode starts an in-process node on loopback ports with the named cached
// models installed; configure, when set, adjusts the configuration (whose
// logger discards by default) before the node is built. The node stops
// when the test ends.
func runNode(tb testing.TB, id string, modelNames []string, configure func(*node.Config)) *node.Node {
	tb.Helper()
	dir := tb.TempDir()
	store, err := models.Open(filepath.Join(dir, "models"), slog.New(slog.DiscardHandler), time.Now)
	if err != nil {
		tb.Fatal(err)
	}
	for _, m := range modelNames {
		if _, err := store.Import(onnxtest.AssetDir(tb, m, "manifest.json")); err != nil {
			tb.Fatal(err)
		}
	}
	cfg := node.Defaults()
	cfg.NodeID, cfg.DataDir, cfg.Logger = id, dir, slog.New(slog.DiscardHandler)
	cfg.Listen, cfg.GossipListen, cfg.RPCListen = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.ClusterSecret, cfg.FastTimers = "test-secret", true
	cfg.ORTLibrary = onnxtest.LibraryPath(tb)
	if configure != nil {
		configure(&cfg)
	}
	n, err := node.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { n.Close() })
	return n
}

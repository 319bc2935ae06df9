package consensus

import (
	"log/slog"
	"os"
)

// discardLogger logs to stderr when INFERMESH_TEST_LOG is set.
func discardLogger() *slog.Logger {
	if os.Getenv("INFERMESH_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

package main

import (
	"fmt"
	"io"
	"log/slog"
)

// newLogger builds the serve logger: --log-format text (logfmt-style
// key=value lines, the default) or json (one JSON object per line), at
// --log-level.
func newLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}

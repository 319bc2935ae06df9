package consensus

import (
	"context"
	"io"
	"log"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter sends raft's hclog output to the node's slog.Logger.
type hclogAdapter struct {
	l       *slog.Logger
	name    string
	implied []any
}

func newHCLog(l *slog.Logger, name string) hclog.Logger {
	return &hclogAdapter{l: l.With("component", name), name: name}
}

func slogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace, hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Log forwards one record at the mapped level.
func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	a.l.Log(context.Background(), slogLevel(level), msg, args...)
}

// Trace logs at debug level.
func (a *hclogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }

// Debug logs at debug level.
func (a *hclogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }

// Info logs at info level.
func (a *hclogAdapter) Info(msg string, args ...any) { a.Log(hclog.Info, msg, args...) }

// Warn logs at warn level.
func (a *hclogAdapter) Warn(msg string, args ...any) { a.Log(hclog.Warn, msg, args...) }

// Error logs at error level.
func (a *hclogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) enabled(l slog.Level) bool { return a.l.Enabled(context.Background(), l) }

// IsTrace reports whether debug records are kept.
func (a *hclogAdapter) IsTrace() bool { return a.enabled(slog.LevelDebug) }

// IsDebug reports whether debug records are kept.
func (a *hclogAdapter) IsDebug() bool { return a.enabled(slog.LevelDebug) }

// IsInfo reports whether info records are kept.
func (a *hclogAdapter) IsInfo() bool { return a.enabled(slog.LevelInfo) }

// IsWarn reports whether warn records are kept.
func (a *hclogAdapter) IsWarn() bool { return a.enabled(slog.LevelWarn) }

// IsError reports whether error records are kept.
func (a *hclogAdapter) IsError() bool { return a.enabled(slog.LevelError) }

// ImpliedArgs returns the arguments added with With.
func (a *hclogAdapter) ImpliedArgs() []any { return a.implied }

// With returns a logger that adds args to every record.
func (a *hclogAdapter) With(args ...any) hclog.Logger {
	return &hclogAdapter{l: a.l.With(args...), name: a.name, implied: append(append([]any{}, a.implied...), args...)}
}

// Name is the logger name.
func (a *hclogAdapter) Name() string { return a.name }

// Named returns a sub-logger.
func (a *hclogAdapter) Named(name string) hclog.Logger {
	if a.name != "" {
		name = a.name + "." + name
	}
	return a.ResetNamed(name)
}

// ResetNamed returns a logger with the given name.
func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	return &hclogAdapter{l: a.l.With("component", name), name: name, implied: a.implied}
}

// SetLevel is a no-op: the slog handler decides what is kept.
func (a *hclogAdapter) SetLevel(hclog.Level) {}

// GetLevel reports the most verbose level the handler keeps.
func (a *hclogAdapter) GetLevel() hclog.Level {
	switch {
	case a.IsDebug():
		return hclog.Debug
	case a.IsInfo():
		return hclog.Info
	case a.IsWarn():
		return hclog.Warn
	}
	return hclog.Error
}

// StandardLogger returns a log.Logger writing through the adapter.
func (a *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(a.StandardWriter(opts), "", 0)
}

// StandardWriter returns a writer logging each line.
func (a *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return lineWriter{a}
}

type lineWriter struct{ a *hclogAdapter }

// Write logs each line, taking the level from an "[ERR]"-style prefix.
func (w lineWriter) Write(p []byte) (int, error) {
	for line := range strings.SplitSeq(strings.TrimRight(string(p), "\n"), "\n") {
		level := hclog.Info
		switch {
		case strings.Contains(line, "[ERR"):
			level = hclog.Error
		case strings.Contains(line, "[WARN"):
			level = hclog.Warn
		case strings.Contains(line, "[DEBUG"), strings.Contains(line, "[TRACE"):
			level = hclog.Debug
		}
		w.a.Log(level, line)
	}
	return len(p), nil
}

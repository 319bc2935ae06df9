package consensus

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter sends raft's hclog output to the node's slog.Logger.
type hclogAdapter struct {
	base    *slog.Logger // the node's logger, without component
	l       *slog.Logger // base with component and the implied args
	name    string
	implied []any
}

func newHCLog(l *slog.Logger, name string) hclog.Logger {
	return &hclogAdapter{base: l, l: l.With("component", name), name: name}
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

// Log forwards one record at the mapped level, with hclog's argument
// conventions turned into plain values.
func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	l := slogLevel(level)
	if l == slog.LevelWarn && startupElection(msg, args) {
		l = slog.LevelInfo
	}
	if !a.l.Enabled(context.Background(), l) {
		return
	}
	a.l.Log(context.Background(), l, msg, hclogArgs(args)...)
}

// startupElection reports raft's "heartbeat timeout reached, starting
// election" warning when the node has never known a leader: every node
// logs it once on start-up (a lone node elects itself this way), so it
// is news, not a warning. Losing a known leader stays a warning.
func startupElection(msg string, args []any) bool {
	if msg != "heartbeat timeout reached, starting election" {
		return false
	}
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == "last-leader-id" {
			return fmt.Sprint(args[i+1]) == ""
		}
	}
	return false
}

// hclogArgs converts hclog's key/value arguments for slog: hclog.Fmt
// values are formatted (raft logs its configuration as
// hclog.Fmt("%+v", servers)), Hex, Octal, Binary and Quote are rendered
// as hclog renders them, and a value without a key is kept under
// EXTRA_VALUE_AT_END as hclog does.
func hclogArgs(args []any) []any {
	out := make([]any, 0, len(args)+1)
	for i := 0; i < len(args); i += 2 {
		if i+1 == len(args) {
			out = append(out, "EXTRA_VALUE_AT_END", hclogValue(args[i]))
			break
		}
		key, ok := args[i].(string)
		if !ok {
			key = fmt.Sprint(args[i])
		}
		out = append(out, key, hclogValue(args[i+1]))
	}
	return out
}

func hclogValue(v any) any {
	switch x := v.(type) {
	case hclog.Format:
		if len(x) == 0 {
			return ""
		}
		if f, ok := x[0].(string); ok {
			return fmt.Sprintf(f, x[1:]...)
		}
		return fmt.Sprint(x...)
	case hclog.Hex:
		return fmt.Sprintf("0x%x", int(x))
	case hclog.Octal:
		return fmt.Sprintf("0%o", int(x))
	case hclog.Binary:
		return fmt.Sprintf("0b%b", int(x))
	case hclog.Quote:
		return fmt.Sprintf("%q", string(x))
	case hclog.CapturedStacktrace:
		return string(x)
	}
	return v
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
	return &hclogAdapter{base: a.base, l: a.l.With(hclogArgs(args)...), name: a.name, implied: append(append([]any{}, a.implied...), args...)}
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
	return &hclogAdapter{base: a.base, l: a.base.With(append([]any{"component", name}, hclogArgs(a.implied)...)...), name: name, implied: a.implied}
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

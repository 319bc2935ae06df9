package mesh

import (
	"bytes"
	"context"
	"log"
	"log/slog"
)

// logBridge turns memberlist's "[LEVEL] memberlist: message" lines into
// slog records at the matching level.
type logBridge struct {
	log *slog.Logger
}

// newStdLogger returns a *log.Logger for memberlist that writes to l.
func newStdLogger(l *slog.Logger) *log.Logger {
	return log.New(logBridge{log: l}, "", 0)
}

// Write implements io.Writer; each call carries one log line.
func (b logBridge) Write(p []byte) (int, error) {
	n := len(p)
	line := bytes.TrimSpace(p)
	level := slog.LevelInfo
	if len(line) > 0 && line[0] == '[' {
		if end := bytes.IndexByte(line, ']'); end > 0 {
			switch string(line[1:end]) {
			case "DEBUG", "TRACE":
				level = slog.LevelDebug
			case "WARN":
				level = slog.LevelWarn
			case "ERR", "ERROR":
				level = slog.LevelError
			}
			line = bytes.TrimSpace(line[end+1:])
		}
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	if b.log.Enabled(context.Background(), level) {
		b.log.Log(context.Background(), level, string(line), "component", "memberlist")
	}
	return n, nil
}

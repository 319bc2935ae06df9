package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

// TestLogFormat checks --log-format: json writes one JSON object per line,
// text key=value lines, anything else is refused.
func TestLogFormat(t *testing.T) {
	var buf bytes.Buffer
	l, err := newLogger(&buf, "json", slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	l.With("node", "n1").Info("node listening", "addr", "127.0.0.1:8080")
	l.Debug("dropped below the level")
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil || rec["msg"] != "node listening" || rec["node"] != "n1" || rec["level"] != "INFO" {
		t.Fatalf("json line %q: %v", buf.String(), err)
	}
	if strings.Count(buf.String(), "\n") != 1 {
		t.Fatalf("want one line, got %q", buf.String())
	}
	buf.Reset()
	if l, err = newLogger(&buf, "text", slog.LevelInfo); err != nil {
		t.Fatal(err)
	}
	l.Info("node listening", "addr", "x")
	if !strings.Contains(buf.String(), `msg="node listening" addr=x`) {
		t.Fatalf("text line %q", buf.String())
	}
	if _, err := newLogger(&buf, "xml", slog.LevelInfo); err == nil || !strings.Contains(err.Error(), "text or json") {
		t.Fatalf("xml accepted: %v", err)
	}
}

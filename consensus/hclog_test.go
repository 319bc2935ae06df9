package consensus

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// TestHCLogBridge checks how raft's hclog records reach slog: hclog.Fmt
// values are formatted, a sub-logger names one component, the start-up
// election is not a warning while losing a known leader still is.
func TestHCLogBridge(t *testing.T) {
	var buf bytes.Buffer
	l := newHCLog(slog.New(slog.NewTextHandler(&buf, nil)), "raft")
	l.Info("initial configuration", "index", 1, "servers", hclog.Fmt("%+v", []struct{ ID string }{{"a"}}), "mode", hclog.Hex(255), "odd")
	l.Named("snapshot").Info("hi")
	l.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "", "last-leader-id", "")
	l.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "10.0.0.1:7947", "last-leader-id", "n2")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("want 4 lines, got:\n%s", buf.String())
	}
	for i, want := range []string{
		`level=INFO msg="initial configuration" component=raft index=1 servers=[{ID:a}] mode=0xff EXTRA_VALUE_AT_END=odd`,
		`level=INFO msg=hi component=raft.snapshot`,
		`level=INFO msg="heartbeat timeout reached, starting election" component=raft last-leader-addr="" last-leader-id=""`,
		`level=WARN msg="heartbeat timeout reached, starting election" component=raft last-leader-addr=10.0.0.1:7947 last-leader-id=n2`,
	} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d:\n got %s\nwant …%s", i, lines[i], want)
		}
	}
}

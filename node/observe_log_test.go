package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a goroutine-safe log sink.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// duplicateKeys returns the keys that occur more than once among the
// top-level members of one JSON object.
func duplicateKeys(line string) ([]string, error) {
	dec := json.NewDecoder(strings.NewReader(line))
	if _, err := dec.Token(); err != nil { // {
		return nil, err
	}
	seen := map[string]bool{}
	var dups []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key := tok.(string)
		if seen[key] {
			dups = append(dups, key)
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, err
		}
	}
	return dups, nil
}

// TestStartupLogIsQuiet starts a lone node with JSON logs (as
// --log-format json does), waits until it leads raft, drains it and checks
// the whole log: every line is one JSON object without repeated keys,
// nothing is logged at WARN or above, no hclog format string is left
// unformatted, and every node line names the node once.
func TestStartupLogIsQuiet(t *testing.T) {
	var out lockedBuffer
	log := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo}))
	n := observedNode(t, "quiet", nil, log)
	waitFor(t, "a raft leader", 20*time.Second, func() bool {
		_, body := call(t, http.MethodGet, "http://"+n.Addr()+"/v1/server/state-digest", "")
		return strings.Contains(body, `"is_leader":true`)
	})
	// The bootstrap admin key is written once the node leads.
	waitFor(t, "the bootstrap admin key", 10*time.Second, func() bool {
		return strings.Contains(out.String(), "bootstrap admin key created")
	})
	// Stop as `infermesh serve` does on SIGTERM: a drain with time left.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Drain(ctx); err != nil {
		t.Fatalf("drain: %v", err)
	}

	text := out.String()
	sc := bufio.NewScanner(strings.NewReader(text))
	lines := 0
	for sc.Scan() {
		line := sc.Text()
		lines++
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("not a JSON line: %v: %s", err, line)
			continue
		}
		dups, err := duplicateKeys(line)
		if err != nil || len(dups) > 0 {
			t.Errorf("repeated keys %v (%v): %s", dups, err, line)
		}
		if lvl, _ := rec["level"].(string); lvl != "INFO" && lvl != "DEBUG" {
			t.Errorf("start-up or shutdown logged at %s: %s", lvl, line)
		}
		if strings.Contains(line, "%+v") || strings.Contains(line, "%v") || strings.Contains(line, "%!") {
			t.Errorf("unformatted or broken format string: %s", line)
		}
		if rec["node"] != "quiet" {
			t.Errorf("line without node=quiet: %s", line)
		}
	}
	// The log covers start-up, the election and shutdown.
	for _, want := range []string{`"msg":"node listening"`, `"msg":"initial configuration"`, `"msg":"became raft leader"`, `"msg":"stopped"`} {
		if !strings.Contains(text, want) {
			t.Errorf("log lacks %s", want)
		}
	}
	if lines < 8 {
		t.Errorf("only %d log lines:\n%s", lines, text)
	}
	// raft's configuration is formatted, not left as hclog.Fmt's pieces.
	if !strings.Contains(text, `"servers":"[{Suffrage:Voter ID:quiet Address:`) {
		t.Errorf("raft's initial configuration is not formatted:\n%s", text)
	}
}

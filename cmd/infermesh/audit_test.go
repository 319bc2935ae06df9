package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/audit"
)

// auditNode is an in-process stand-in for a node's audit admin routes,
// served by the real node/audit log and handlers behind a bearer key.
func auditNode(t *testing.T, node string, records int) (*httptest.Server, *audit.Log) {
	t.Helper()
	seed := sha256.Sum256([]byte("cli test " + node))
	l, err := audit.Open(t.TempDir(), audit.Options{NodeID: node, Key: ed25519.NewKeyFromSeed(seed[:])})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	base := time.Now().Add(-time.Duration(records) * time.Minute)
	for i := range records {
		l.Append(audit.Record{
			Time: base.Add(time.Duration(i) * time.Minute), Endpoint: "/v1/embeddings", Model: "tiny-bert",
			KeyID: "k1", App: "notes", Worker: node, Status: 200, Duration: time.Millisecond,
			RequestID: fmt.Sprintf("r%d", i),
		})
	}
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/server/audit", audit.ExportHandler(func(ctx context.Context, q audit.Query, w io.Writer) error {
		return l.ExportContext(ctx, q.Since, w)
	}))
	mux.Handle("/v1/server/audit/keys", audit.KeysHandler(staticAuditKeys{node: l.PublicKey()}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer admin-k" {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":{"message":"bad admin key"}}`))
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, l
}

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestAuditCLIExportAndVerify(t *testing.T) {
	srv, l := auditNode(t, "node-a", 20)
	dir := t.TempDir()

	code, out, stderr := runCLI("audit", "export", "--since", "10m30s", "--format", "jsonl", "--node", srv.URL, "--admin-key", "admin-k")
	if code != 0 {
		t.Fatalf("export: %d %s", code, stderr)
	}
	if n := strings.Count(out, "\n"); n != 10 {
		t.Fatalf("export --since 10m30s: %d records, want 10", n)
	}
	code, out, stderr = runCLI("audit", "export", "--node", srv.URL, "--admin-key", "admin-k")
	if code != 0 || strings.Count(out, "\n") != 20 {
		t.Fatalf("export all: %d, %d lines, %s", code, strings.Count(out, "\n"), stderr)
	}
	file := filepath.Join(dir, "audit.jsonl")
	os.WriteFile(file, []byte(out), 0o600)
	keys := filepath.Join(dir, "keys.json")
	os.WriteFile(keys, audit.MarshalKeys(map[string]ed25519.PublicKey{"node-a": l.PublicKey()}), 0o600)

	// With a keys file, and with keys fetched from the node.
	if code, out, stderr := runCLI("audit", "verify", file, "--keys", keys); code != 0 || !strings.Contains(out, "OK, 20 records verified") {
		t.Fatalf("verify --keys: %d %s %s", code, out, stderr)
	}
	if code, out, stderr := runCLI("audit", "verify", "--node", srv.URL, "--admin-key", "admin-k", file); code != 0 || !strings.Contains(out, "from genesis") {
		t.Fatalf("verify with node keys: %d %s %s", code, out, stderr)
	}

	// One flipped byte in record 13: exit 1 naming line 13.
	lines := bytes.SplitAfter(mustRead(t, file), []byte("\n"))
	lines[12][40] ^= 0x01
	os.WriteFile(file, bytes.Join(lines, nil), 0o600)
	code, _, stderr = runCLI("audit", "verify", file, "--keys", keys)
	if code != 1 || !strings.Contains(stderr, "line 13") {
		t.Fatalf("flipped byte: exit %d, %s", code, stderr)
	}
}

func TestAuditCLIErrors(t *testing.T) {
	srv, _ := auditNode(t, "node-a", 2)
	if code, _, stderr := runCLI("audit", "export", "--node", srv.URL, "--admin-key", "wrong"); code != 1 || !strings.Contains(stderr, "401 bad admin key") {
		t.Fatalf("wrong admin key: %d %s", code, stderr)
	}
	if code, _, _ := runCLI("audit", "export", "--format", "csv"); code != 2 {
		t.Fatalf("--format csv: exit %d", code)
	}
	if code, _, _ := runCLI("audit", "export", "--since", "last week"); code != 2 {
		t.Fatalf("bad --since: exit %d", code)
	}
	if code, _, _ := runCLI("audit", "verify"); code != 2 {
		t.Fatalf("verify without FILE: exit %d", code)
	}
	if code, _, _ := runCLI("audit", "frobnicate"); code != 2 {
		t.Fatalf("unknown subcommand: exit %d", code)
	}
	// Keys for another node: the first record fails.
	file := filepath.Join(t.TempDir(), "a.jsonl")
	_, out, _ := runCLI("audit", "export", "--node", srv.URL, "--admin-key", "admin-k")
	os.WriteFile(file, []byte(out), 0o600)
	keys := filepath.Join(t.TempDir(), "keys.json")
	os.WriteFile(keys, []byte(`{"keys":{"node-b":"`+strings.Repeat("A", 43)+`="}}`), 0o600)
	if code, _, stderr := runCLI("audit", "verify", file, "--keys", keys); code != 1 || !strings.Contains(stderr, `line 1 (node node-a seq 1): no public key for node "node-a"`) {
		t.Fatalf("unknown node: %d %s", code, stderr)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// staticAuditKeys is a fixed audit.KeyDirectory.
type staticAuditKeys map[string]ed25519.PublicKey

// AuditKeys returns the map itself.
func (s staticAuditKeys) AuditKeys() map[string]ed25519.PublicKey { return s }

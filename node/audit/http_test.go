package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestAuditExportHandler(t *testing.T) {
	l := openLog(t, t.TempDir(), "a", Options{})
	appendN(t, l, 0, 10)
	var gotLocal bool
	srv := httptest.NewServer(ExportHandler(func(ctx context.Context, q Query, w io.Writer) error {
		gotLocal = q.Local
		return l.ExportContext(ctx, q.Since, w)
	}))
	defer srv.Close()
	get := func(query string) (int, string, []byte) {
		resp, err := http.Get(srv.URL + "/v1/server/audit" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), b
	}
	keys := map[string]ed25519.PublicKey{"a": l.PublicKey()}
	code, ctype, body := get("")
	if code != 200 || ctype != ContentType {
		t.Fatalf("GET: %d %s %s", code, ctype, body)
	}
	if rep := mustVerify(t, body, keys); rep.Records != 10 {
		t.Fatalf("report: %v", rep)
	}
	code, _, body = get("?since=" + rec(7).Time.Format(time.RFC3339) + "&local=1")
	if rep := mustVerify(t, body, keys); code != 200 || rep.Records != 3 || !gotLocal {
		t.Fatalf("since: %d, %v, local %v", code, rep, gotLocal)
	}
	// Records are from 2026-01-31; a one-hour window from now holds none
	// of them unless the clock is that date.
	if code, _, body = get("?since=1h"); code != 200 {
		t.Fatalf("since=1h: %d %s", code, body)
	}
	for _, q := range []string{"?since=yesterday", "?since=-5m", "?local=maybe"} {
		if code, _, body := get(q); code != 400 || !strings.Contains(string(body), `"invalid_value"`) {
			t.Fatalf("%s: %d %s", q, code, body)
		}
	}
	resp, _ := http.Post(srv.URL, "text/plain", nil)
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") == "" {
		t.Fatalf("POST: %d Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

func TestAuditExportHandlerFailures(t *testing.T) {
	fail := errors.New("disk gone")
	srv := httptest.NewServer(ExportHandler(func(ctx context.Context, q Query, w io.Writer) error { return fail }))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 || ErrorMessage(b) != "audit export failed: disk gone" {
		t.Fatalf("early failure: %d %s", resp.StatusCode, b)
	}
	// A failure after the first byte breaks the transfer.
	srv2 := httptest.NewServer(ExportHandler(func(ctx context.Context, q Query, w io.Writer) error {
		w.Write(bytes.Repeat([]byte("x"), 100))
		return fail
	}))
	defer srv2.Close()
	resp, err = http.Get(srv2.URL)
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Fatal("mid-stream failure read as a complete export")
	}
}

func TestAuditKeysHandler(t *testing.T) {
	keys := StaticKeys{"a": pubOf(testKey("a")), "b": pubOf(testKey("b"))}
	srv := httptest.NewServer(KeysHandler(keys))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	got, err := ParseKeys(b)
	if err != nil || len(got) != 2 || !got["b"].Equal(keys["b"]) {
		t.Fatalf("keys: %v %v (%s)", got, err, b)
	}
}

func TestAuditParseSince(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                     {},
		"24h":                  now.Add(-24 * time.Hour),
		"2026-02-01T00:00:00Z": time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC),
	} {
		got, err := ParseSince(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseSince("0s", now); err == nil {
		t.Error("accepted 0s")
	}
}

// StaticKeys is a fixed KeyDirectory.
type StaticKeys map[string]ed25519.PublicKey

// AuditKeys returns the map itself.
func (s StaticKeys) AuditKeys() map[string]ed25519.PublicKey { return s }

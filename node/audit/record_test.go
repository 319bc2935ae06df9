package audit

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestAuditRecordRoundTrip(t *testing.T) {
	key := testKey("a")
	odd := Record{
		Time:      time.Date(2026, 2, 1, 0, 0, 0, 123456000, time.UTC),
		Endpoint:  "/v1/embeddings",
		Model:     `quote" back\slash` + "\n\r\t\x01\x7f é 漢 \u2028",
		KeyID:     "k1",
		Status:    429,
		Duration:  1500 * time.Millisecond,
		RequestID: "r",
	}.normalize(time.Now())
	for _, r := range []Record{rec(1).normalize(time.Now()), odd, {Time: time.Unix(0, 0).UTC(), Status: 0}} {
		e := Entry{Record: r, Node: "node-a", Seq: 42, Prev: Genesis("node-a")}
		line := e.Sign(key, nil)
		got, err := ParseEntry(line)
		if err != nil {
			t.Fatalf("ParseEntry(%s): %v", line, err)
		}
		if !got.Time.Equal(r.Time) || got.Duration != r.Duration || got.Model != r.Model ||
			got.Endpoint != r.Endpoint || got.Status != r.Status || got.Seq != 42 || got.Node != "node-a" ||
			got.Prev != e.Prev || got.KeyID != r.KeyID || got.RequestID != r.RequestID {
			t.Fatalf("round trip changed the record:\n in  %+v\n out %+v", e, got)
		}
		if !got.VerifySig(pubOf(key)) {
			t.Fatalf("signature does not verify: %s", line)
		}
		if got.VerifySig(pubOf(testKey("other"))) {
			t.Fatal("signature verifies with another key")
		}
		if !bytes.Equal(got.AppendLine(nil), line) {
			t.Fatal("re-encoding differs")
		}
	}
}

func TestAuditCanonicalOnly(t *testing.T) {
	e := Entry{Record: rec(3).normalize(time.Now()), Node: "a", Seq: 1, Prev: Genesis("a")}
	line := string(e.Sign(testKey("a"), nil))
	for name, bad := range map[string]string{
		"space":         strings.Replace(line, `"seq":1`, `"seq": 1`, 1),
		"field order":   strings.Replace(line, `"v":1,"node":"a"`, `"node":"a","v":1`, 1),
		"empty string":  strings.Replace(line, `,"status"`, `,"worker":"","status"`, 1),
		"unknown field": strings.Replace(line, `{"v":1`, `{"v":1,"x":1`, 1),
		"escaped ascii": strings.Replace(line, `"model":"tiny`, `"model":"\u0074iny`, 1),
		"upper hex":     strings.Replace(line, hex.EncodeToString(e.Prev[:]), strings.ToUpper(hex.EncodeToString(e.Prev[:])), 1),
		"time offset":   strings.Replace(line, `Z"`, `+00:00"`, 1),
		"duration":      strings.Replace(line, `.250`, `.25`, 1),
		"version":       strings.Replace(line, `{"v":1`, `{"v":2`, 1),
		"case":          strings.Replace(line, `"node"`, `"NODE"`, 1),
		"duplicate":     strings.Replace(line, `{"v":1`, `{"v":1,"v":1`, 1),
		"trailing":      line + " ",
	} {
		if _, err := ParseEntry([]byte(bad)); err == nil {
			t.Errorf("%s: ParseEntry accepted %s", name, bad)
		}
	}
	if _, err := ParseEntry([]byte(strings.Replace(line, `"seq":1`, `"seq": 1`, 1))); !errors.Is(err, ErrNotCanonical) {
		t.Errorf("want ErrNotCanonical, got %v", err)
	}
}

func TestAuditVisionRecordsHoldOnlyEndpointModelStatusTiming(t *testing.T) {
	r := rec(1)
	r.Endpoint = "/v1/vision/background"
	n := r.normalize(time.Now())
	if n.KeyID != "" || n.App != "" || n.Worker != "" || n.RequestID != "" {
		t.Fatalf("vision record keeps caller fields: %+v", n)
	}
	if n.Endpoint != r.Endpoint || n.Model != r.Model || n.Status != r.Status || n.Duration != r.Duration || !n.Time.Equal(r.Time) {
		t.Fatalf("vision record lost endpoint, model, status or timing: %+v", n)
	}
	line := string((&Entry{Record: n, Node: "a", Seq: 1}).Sign(testKey("a"), nil))
	for _, f := range []string{"key_id", "app", "worker", "request_id"} {
		if strings.Contains(line, `"`+f+`"`) {
			t.Fatalf("vision line has %s: %s", f, line)
		}
	}
	if IsVision("/v1/visionary") || !IsVision("/v1/vision") || !IsVision("/v1/vision/detections") {
		t.Fatal("IsVision boundary")
	}
}

func TestAuditFieldLimits(t *testing.T) {
	r := Record{Model: strings.Repeat("漢", 200), KeyID: "a\xffb"}.normalize(time.Now())
	if len(r.Model) > MaxFieldBytes || !utf8.ValidString(r.Model) || !strings.HasPrefix(strings.Repeat("漢", 200), r.Model) {
		t.Fatalf("model cut badly: %d bytes, valid %v", len(r.Model), utf8.ValidString(r.Model))
	}
	if r.KeyID != "a\uFFFDb" {
		t.Fatalf("invalid UTF-8 kept: %q", r.KeyID)
	}
	// The worst case (every byte escaped as \u00XX) fits a line.
	worst := strings.Repeat("\x01", MaxFieldBytes)
	w := Record{Endpoint: worst, Model: worst, KeyID: worst, App: worst, Worker: worst, RequestID: worst, Duration: 1 << 62}
	e := Entry{Record: w.normalize(time.Now()), Node: strings.Repeat("n", MaxFieldBytes), Seq: 1<<64 - 1}
	line := e.Sign(testKey("a"), nil)
	if len(line) > MaxLineBytes {
		t.Fatalf("worst-case line is %d bytes", len(line))
	}
	if _, err := ParseEntry(line); err != nil {
		t.Fatalf("worst-case line: %v", err)
	}
}

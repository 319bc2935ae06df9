package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/infermesh/infermesh/node/apierr"
)

// ContentType is the media type of an export.
const ContentType = "application/jsonl"

// Query is an export request: GET /v1/server/audit?since=...&local=1.
type Query struct {
	// Since keeps records at or after this time (zero: all).
	Since time.Time
	// Local asks for this node's records only; a node that merges its
	// peers' records calls them with local=1.
	Local bool
}

// ExportFunc writes the records an export request asks for to w as JSON
// Lines: for one node, (*Log).ExportContext; for a mesh, the node's own
// records followed by each peer's (asked with Query.Local), which Verify
// accepts since every node's chain is checked on its own.
type ExportFunc func(ctx context.Context, q Query, w io.Writer) error

// ParseSince reads a since value: an RFC 3339 time, or a positive
// duration (24h, 90m) meaning that long before now; "" means all records.
func ParseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("since %q: want a positive duration", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("since %q: want an RFC 3339 time (2026-01-31T00:00:00Z) or a duration (24h)", s)
	}
	return t, nil
}

// ExportHandler serves GET ?since=<RFC 3339 or duration>&local=1 as a
// JSON Lines stream (ContentType) from fn. The caller mounts it behind
// admin authentication. A bad query is 400; a failure before the first
// byte is 500; a failure mid-stream aborts the response, so the client
// sees a broken transfer, never a silently short export.
func ExportHandler(fn ExportFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, apierr.CodeMethodNotAllowed, "", "Use GET.")
			return
		}
		q := r.URL.Query()
		since, err := ParseSince(q.Get("since"), time.Now())
		if err != nil {
			writeError(w, http.StatusBadRequest, apierr.CodeInvalidValue, "since", err.Error())
			return
		}
		local := false
		switch q.Get("local") {
		case "", "0", "false":
		case "1", "true":
			local = true
		default:
			writeError(w, http.StatusBadRequest, apierr.CodeInvalidValue, "local", "local: want 1 or 0")
			return
		}
		w.Header().Set("Content-Type", ContentType)
		w.Header().Set("Cache-Control", "no-store")
		if r.Method == http.MethodHead {
			return
		}
		sw := &startWriter{w: w}
		if err := fn(r.Context(), Query{Since: since, Local: local}, sw); err != nil {
			if !sw.started {
				writeError(w, http.StatusInternalServerError, apierr.CodeInternal, "", "audit export failed: "+err.Error())
				return
			}
			panic(http.ErrAbortHandler)
		}
	}
}

// startWriter notes whether anything was written.
type startWriter struct {
	w       http.ResponseWriter
	started bool
}

func (s *startWriter) Write(p []byte) (int, error) {
	if len(p) > 0 {
		s.started = true
	}
	return s.w.Write(p)
}

// KeysHandler serves the audit public keys of every node in MarshalKeys's
// format (the file `infermesh audit verify --keys` reads).
func KeysHandler(dir KeyDirectory) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, apierr.CodeMethodNotAllowed, "", "Use GET.")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if r.Method == http.MethodGet {
			w.Write(MarshalKeys(dir.AuditKeys()))
		}
	}
}

// writeError writes the OpenAI-style error body the API uses everywhere:
// invalid_request_error, or server_error for a 5xx status.
func writeError(w http.ResponseWriter, status int, code, param, msg string) {
	typ := apierr.TypeInvalidRequest
	if status >= 500 {
		typ = apierr.TypeServer
	}
	apierr.Write(w, apierr.New(status, typ, code, param, msg))
}

// ErrorMessage extracts the message of an error body, for clients.
func ErrorMessage(b []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return string(b)
}

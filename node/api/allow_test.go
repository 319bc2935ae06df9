package api

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Test405HasAllow: a 405 names the methods the path serves in Allow.
func Test405HasAllow(t *testing.T) {
	s := New(Options{Backend: nil, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	for path, want := range map[string]string{
		"/v1/embeddings":       "POST",
		"/v1/models":           "GET",
		"/v1/models/installed": "GET, DELETE", // also matches /v1/models/{id}
		"/readyz":              "GET",
	} {
		req := httptest.NewRequest(http.MethodPatch, path, nil)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != want {
			t.Errorf("PATCH %s: %d Allow %q, want 405 Allow %q", path, rec.Code, rec.Header().Get("Allow"), want)
		}
	}
}

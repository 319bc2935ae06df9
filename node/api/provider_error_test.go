package api

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

// An upstream provider's error is written with its own status and fields,
// also when wrapped.
func TestWriteErrProviderError(t *testing.T) {
	cases := []struct {
		err        error
		status     int
		code       any
		param      any
		retryAfter string
	}{
		{&engine.ProviderError{Provider: "p", Status: 400, Type: "invalid_request_error", Code: "invalid_value", Param: "temperature", Message: "too hot"}, 400, "invalid_value", "temperature", ""},
		{fmt.Errorf("chat: %w", &engine.ProviderError{Provider: "p", Status: 503, Type: "server_error", Code: "upstream_unavailable", Message: "down", RetryAfter: 4}), 503, "upstream_unavailable", nil, "4"},
		{&engine.ProviderError{Provider: "p", Status: 404, Type: "invalid_request_error", Message: "no such model"}, 404, nil, nil, ""},
	}
	for _, c := range cases {
		w := httptest.NewRecorder()
		writeErr(w, c.err)
		var body struct {
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if w.Code != c.status || body.Error["code"] != c.code || body.Error["param"] != c.param || w.Header().Get("Retry-After") != c.retryAfter {
			t.Errorf("%v: got %d %v Retry-After %q", c.err, w.Code, body.Error, w.Header().Get("Retry-After"))
		}
		if _, ok := body.Error["message"].(string); !ok || body.Error["type"] == "" {
			t.Errorf("%v: body %v", c.err, body.Error)
		}
	}
}

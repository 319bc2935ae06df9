package apierr

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// The body is OpenAI's shape; empty code and param go out as null, and
// the headers carry Retry-After and the upgrade hint.
func TestWrite(t *testing.T) {
	rec := httptest.NewRecorder()
	e := New(http.StatusTooManyRequests, TypeRateLimit, CodeFreeRate, "", "slow down")
	e.RetryAfter, e.Upgrade = 7, true
	Write(rec, e)
	want := `{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":"free_plan_rate_limit_exceeded"}}` + "\n"
	if rec.Code != 429 || rec.Body.String() != want || rec.Header().Get("Retry-After") != "7" ||
		rec.Header().Get(UpgradeHeader) != "1" || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("%d %v %q", rec.Code, rec.Header(), rec.Body.String())
	}
	rec = httptest.NewRecorder()
	Write(rec, BadRequest("", "model", "no"))
	if want := `{"error":{"message":"no","type":"invalid_request_error","param":"model","code":null}}` + "\n"; rec.Code != 400 || rec.Body.String() != want {
		t.Fatalf("%d %q", rec.Code, rec.Body.String())
	}
}

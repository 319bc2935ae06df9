package legacy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// clock is a settable test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// do sends one request through the legacy handler from remote.
func do(s *Server, method, path, body, remote string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.RemoteAddr = remote
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	return w
}

func errorOf(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error == "" {
		t.Fatalf("body %q is not Ollama's error shape (%v)", w.Body.String(), err)
	}
	return e.Error
}

// After its end date every call answers 410 naming its replacement. The
// calls that reach no /v1 handler (HEAD /, /api/pull without a model) show
// the API is open before it.
func TestEndDate(t *testing.T) {
	c := &clock{t: time.Date(2026, 12, 31, 23, 59, 59, 0, time.UTC)}
	s := New(Options{Clock: c.now, V1Base: "http://127.0.0.1:11436"})
	if !s.EndDate().Equal(DefaultEndDate()) || DefaultEndDate().Format(time.DateOnly) != "2026-12-31" {
		t.Fatalf("end date %s", s.EndDate())
	}
	if s.Ended(c.t) {
		t.Fatal("ended during its last day")
	}
	if w := do(s, http.MethodHead, "/", "", "127.0.0.1:5000"); w.Code != 200 {
		t.Fatalf("HEAD / before the end: %d", w.Code)
	}
	if w := do(s, http.MethodPost, "/api/pull", `{}`, "127.0.0.1:5000"); w.Code != http.StatusBadRequest || !strings.Contains(errorOf(t, w), "model is required") {
		t.Fatalf("pull before the end: %d %s", w.Code, w.Body)
	}

	c.t = time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	if !s.Ended(c.t) {
		t.Fatal("not ended the day after")
	}
	cases := []struct{ method, path, want string }{
		{"POST", "/api/chat", "POST /v1/chat/completions"},
		{"POST", "/api/generate", "POST /v1/chat/completions with one user message"},
		{"POST", "/api/embed", "POST /v1/embeddings"},
		{"POST", "/api/embeddings", "POST /v1/embeddings"},
		{"GET", "/api/tags", "GET /v1/models"},
		{"GET", "/api/models", "GET /v1/models"},
		{"POST", "/api/show", "GET /v1/models/{id}"},
		{"POST", "/api/pull", "POST /v1/models/pull"},
		{"HEAD", "/", "the /v1 API"},
	}
	for _, tc := range cases {
		w := do(s, tc.method, tc.path, `{"model":"tiny-llama:test"}`, "127.0.0.1:5000")
		if w.Code != http.StatusGone {
			t.Errorf("%s %s: %d", tc.method, tc.path, w.Code)
			continue
		}
		if tc.method == "HEAD" {
			continue
		}
		msg := errorOf(t, w)
		if !strings.Contains(msg, "ended on 2026-12-31") || !strings.Contains(msg, "Use "+tc.want+" at http://127.0.0.1:11436") {
			t.Errorf("%s %s: %q", tc.method, tc.path, msg)
		}
	}

	// A configured end date moves the boundary.
	s = New(Options{Clock: c.now, EndDate: time.Date(2027, 6, 30, 0, 0, 0, 0, time.UTC)})
	if s.Ended(c.t) || !s.Ended(time.Date(2027, 7, 1, 0, 0, 0, 0, time.UTC)) || s.Ended(time.Date(2027, 6, 30, 23, 0, 0, 0, time.UTC)) {
		t.Error("configured end date not honoured")
	}
}

func TestLoopbackOnly(t *testing.T) {
	s := New(Options{})
	for _, remote := range []string{"192.0.2.7:4000", "[2001:db8::1]:4000", "10.0.0.1:1"} {
		if w := do(s, http.MethodPost, "/api/pull", `{}`, remote); w.Code != http.StatusForbidden || !strings.Contains(errorOf(t, w), "this computer only") {
			t.Errorf("%s: %d %s", remote, w.Code, w.Body)
		}
	}
	for _, remote := range []string{"127.0.0.1:4000", "[::1]:4000", "127.0.14.1:9", "[::ffff:127.0.0.1]:3"} {
		if w := do(s, http.MethodPost, "/api/pull", `{}`, remote); w.Code != http.StatusBadRequest {
			t.Errorf("%s: %d", remote, w.Code)
		}
	}
	s = New(Options{AllowRemote: true})
	if w := do(s, http.MethodPost, "/api/pull", `{}`, "192.0.2.7:4000"); w.Code != http.StatusBadRequest {
		t.Errorf("allow remote: %d", w.Code)
	}
	if w := do(s, http.MethodDelete, "/api/delete", `{}`, "127.0.0.1:1"); w.Code != http.StatusNotFound {
		t.Errorf("unknown path: %d", w.Code)
	}
}

func TestMapRequest(t *testing.T) {
	body, err := v1Chat("m:latest", nil, json.RawMessage(`"json"`),
		map[string]any{"temperature": 0.0, "seed": 7.0, "num_predict": 12.0, "stop": []any{"\n", "END"}, "top_k": 40.0, "num_ctx": 4096.0}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"temperature": 0.0, "seed": int64(7), "max_tokens": 12, "stop": []string{"\n", "END"},
		"response_format": map[string]any{"type": "json_object"}}
	for k, v := range want {
		if !reflect.DeepEqual(body[k], v) {
			t.Errorf("%s = %#v, want %#v", k, body[k], v)
		}
	}
	if _, ok := body["top_k"]; ok || body["stream"] != true {
		t.Errorf("body %v", body)
	}
	body, _ = v1Chat("m", nil, json.RawMessage(`{"type":"object"}`), map[string]any{"seed": -1.0, "num_predict": -1.0}, nil, false)
	if _, ok := body["seed"]; ok {
		t.Error("seed -1 (random) was sent")
	}
	if _, ok := body["max_tokens"]; ok {
		t.Error("num_predict -1 (no limit) was sent")
	}
	if rf := body["response_format"].(map[string]any); rf["type"] != "json_schema" {
		t.Errorf("schema format %v", rf)
	}
	for _, bad := range []map[string]any{{"temperature": "hot"}, {"stop": 3.0}} {
		if _, err := v1Chat("m", nil, nil, bad, nil, false); err == nil {
			t.Errorf("options %v accepted", bad)
		}
	}
	if _, err := v1Chat("m", nil, json.RawMessage(`"yaml"`), nil, nil, false); err == nil {
		t.Error("format yaml accepted")
	}

	var msgs []message
	json.Unmarshal([]byte(`[{"role":"user","content":"weather in Oslo and Rome?","images":["iVBORw0KGgo="]},
		{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Oslo"}}},{"function":{"name":"get_time","arguments":{"city":"Rome"}}}]},
		{"role":"tool","tool_name":"get_time","content":"noon"},{"role":"tool","content":"rain"}]`), &msgs)
	out, err := v1Messages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	parts := out[0]["content"].([]any)
	if img := parts[1].(map[string]any)["image_url"].(map[string]any)["url"]; img != "data:image/png;base64,iVBORw0KGgo=" {
		t.Errorf("image part %v", img)
	}
	calls := out[1]["tool_calls"].([]map[string]any)
	if out[1]["content"] != nil || calls[0]["id"] != "call_1_0" || calls[0]["function"].(map[string]any)["arguments"] != `{"city":"Oslo"}` {
		t.Errorf("assistant %v", out[1])
	}
	if out[2]["tool_call_id"] != "call_1_1" || out[3]["tool_call_id"] != "call_1_0" {
		t.Errorf("tool answers matched to %v and %v", out[2]["tool_call_id"], out[3]["tool_call_id"])
	}
	if _, err := v1Messages([]message{{Role: "tool", Content: "orphan"}}); err == nil {
		t.Error("a tool message without a call was accepted")
	}
}

func TestMapResponse(t *testing.T) {
	c, err := ollamaCall(1, "call_9", "get_weather", `{"city":"Oslo"}`)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(c)
	if string(b) != `{"function":{"arguments":{"city":"Oslo"},"index":1,"name":"get_weather"},"id":"call_9"}` {
		t.Errorf("tool call %s", b)
	}
	if _, err := ollamaCall(0, "x", "f", `[1,2]`); err == nil {
		t.Error("non-object arguments accepted")
	}
	for in, want := range map[string]string{"stop": "stop", "length": "length", "tool_calls": "stop", "": "stop"} {
		if doneReason(in) != want {
			t.Errorf("doneReason(%q) = %q", in, doneReason(in))
		}
	}
	for in, want := range map[string]string{"llama3": "llama3:latest", "tiny-llama:test": "tiny-llama:test", "onnx/tiny-bert/test-128": "onnx/tiny-bert/test-128"} {
		if modelName(in) != want {
			t.Errorf("modelName(%q) = %q", in, modelName(in))
		}
	}
}

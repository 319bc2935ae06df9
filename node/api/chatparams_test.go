package api

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/prefix"
)

// TestParseChatCurrentParams: the parameters current SDKs send are
// accepted (each was an "Unrecognized request argument" before) and bad
// values of each are a 400 naming it.
func TestParseChatCurrentParams(t *testing.T) {
	const msgs = `"model":"m","messages":[{"role":"user","content":"hi"}]`
	for _, extra := range []string{
		`"reasoning_effort":"low"`, `"reasoning_effort":"minimal"`, `"reasoning_effort":null`,
		`"prompt_cache_key":"user-42-session"`, `"safety_identifier":"hash-of-user"`,
		`"verbosity":"high"`, `"modalities":["text"]`,
		`"prediction":{"type":"content","content":"the old file"}`,
		`"prediction":{"type":"content","content":[{"type":"text","text":"old"}]}`,
		`"web_search_options":{}`,
		`"web_search_options":{"search_context_size":"low","user_location":{"type":"approximate","approximate":{"city":"Oslo","country":"NO"}}}`,
		`"functions":[{"name":"f","parameters":{"type":"object"}}],"function_call":"auto"`,
	} {
		if _, err := parseChat([]byte(`{` + msgs + `,` + extra + `}`)); err != nil {
			t.Errorf("%s: %v", extra, err)
		}
	}
	for _, c := range []struct{ extra, param string }{
		{`"reasoning_effort":"huge"`, "reasoning_effort"},
		{`"reasoning_effort":3`, "reasoning_effort"},
		{`"verbosity":"loud"`, "verbosity"},
		{`"prompt_cache_key":7`, "prompt_cache_key"},
		{`"safety_identifier":"` + strings.Repeat("s", 65) + `"`, "safety_identifier"},
		{`"modalities":["text","audio"]`, "modalities[1]"},
		{`"modalities":"text"`, "modalities"},
		{`"prediction":{"type":"diff","content":"x"}`, "prediction.type"},
		{`"prediction":{"type":"content","content":5}`, "prediction.content"},
		{`"prediction":"x"`, "prediction"},
		{`"web_search_options":{"search_context_size":"huge"}`, "web_search_options.search_context_size"},
		{`"web_search_options":{"user_location":{"type":"exact"}}`, "web_search_options.user_location.type"},
		{`"web_search_options":{"colour":1}`, "web_search_options"},
		{`"function_call":"auto"`, "function_call"},
		{`"functions":[{"name":"f"}],"function_call":"required"`, "function_call"},
		{`"functions":[{"name":"f"}],"function_call":{"nom":"f"}`, "function_call"},
		{`"functions":[{"description":"no name"}]`, "functions[0].name"},
		{`"functions":[{"name":"f"}],"tools":[{"type":"function","function":{"name":"g"}}]`, "functions"},
		{`"functions":5`, "functions"},
	} {
		_, err := parseChat([]byte(`{` + msgs + `,` + c.extra + `}`))
		var ae *apierr.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Param != c.param {
			t.Errorf("%s: %v; want a 400 naming %s", c.extra, err, c.param)
		}
	}
	if p, err := parseChat([]byte(`{` + msgs + `,"prompt_cache_key":"k1"}`)); err != nil || p.Req.CacheKey != "k1" {
		t.Errorf("prompt_cache_key does not reach the request: %v", err)
	}
	if _, err := parseChat([]byte(`{` + msgs + `,"unheard_of":1}`)); err == nil {
		t.Error("an unknown parameter was accepted")
	}
}

// TestParseChatLegacyFunctions: functions and function_call become tools
// and tool_choice with one call per answer, and legacy messages become
// tool calls and their answers.
func TestParseChatLegacyFunctions(t *testing.T) {
	p, err := parseChat([]byte(`{"model":"m","messages":[
		{"role":"user","content":"weather?"},
		{"role":"assistant","content":null,"function_call":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}},
		{"role":"function","name":"get_weather","content":"3 C"},
		{"role":"assistant","function_call":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}},
		{"role":"function","name":"get_weather","content":"19 C"}],
		"functions":[{"name":"get_weather","description":"d","parameters":{"type":"object"}}],
		"function_call":{"name":"get_weather"}}`))
	if err != nil {
		t.Fatal(err)
	}
	r := p.Req
	if !p.Legacy || len(r.Tools) != 1 || r.Tools[0].Name != "get_weather" || r.Tools[0].Description != "d" ||
		r.ToolChoice != (engine.ToolChoice{Mode: engine.ToolChoiceFunction, Name: "get_weather"}) ||
		r.ParallelToolCalls == nil || *r.ParallelToolCalls {
		t.Fatalf("mapped to %+v legacy=%v", r, p.Legacy)
	}
	m := r.Messages
	if len(m[1].ToolCalls) != 1 || m[1].ToolCalls[0].Arguments != `{"city":"Oslo"}` || m[2].Role != engine.RoleTool ||
		m[2].ToolCallID != m[1].ToolCalls[0].ID || m[4].ToolCallID != m[3].ToolCalls[0].ID || m[2].ToolCallID == m[4].ToolCallID {
		t.Fatalf("messages mapped to %+v", m)
	}
	p, err = parseChat([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}],"function_call":"none"}`))
	if err != nil || p.Req.ToolChoice.Mode != "none" {
		t.Fatalf("function_call none: %+v %v", p, err)
	}
	p, err = parseChat([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`))
	if err != nil || p.Legacy {
		t.Fatal("a request with tools is answered in the legacy shape")
	}
	for _, c := range []struct{ body, param string }{
		{`{"model":"m","messages":[{"role":"user","content":"x"},{"role":"function","name":"f","content":"1"}]}`, "messages[1].name"},
		{`{"model":"m","messages":[{"role":"user","content":"x","function_call":{"name":"f"}}]}`, "messages[0].function_call"},
		{`{"model":"m","messages":[{"role":"assistant","function_call":{"arguments":"{}"}}]}`, "messages[0].function_call.name"},
	} {
		_, err := parseChat([]byte(c.body))
		var ae *apierr.Error
		if !errors.As(err, &ae) || ae.Param != c.param {
			t.Errorf("%s: %v; want a 400 naming %s", c.body, err, c.param)
		}
	}
	// The answer's shape.
	msg := map[string]any{"role": "assistant", "tool_calls": "x"}
	legacyMessage(msg, []engine.ToolCall{{ID: "c", Name: "f", Arguments: "{}"}})
	if _, ok := msg["tool_calls"]; ok || msg["function_call"].(map[string]string)["name"] != "f" {
		t.Fatalf("legacy answer %v", msg)
	}
	if legacyFinish("tool_calls") != "function_call" || legacyFinish("stop") != "stop" {
		t.Fatal("legacy finish reasons")
	}
}

// TestLegacyPrefixHashesMatch: the prefix hashes the entry node computes
// from a legacy body (node/prefix) are those of the request the API
// converted, so prefix-aware routing finds legacy conversations too.
func TestLegacyPrefixHashesMatch(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"weather?"},
			{"role":"assistant","content":null,"function_call":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}},
			{"role":"function","name":"get_weather","content":"3 C"},{"role":"user","content":"and Rome?"}],
			"functions":[{"name":"get_weather","description":"d","parameters":{"type":"object"}}],"function_call":"auto"}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
	} {
		p, err := parseChat([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		tools, msgs := prefix.FromEngine(p.Req)
		want := prefix.Hashes("onnx/m/x", tools, msgs)
		if got := prefix.RequestHashes("onnx/m/x", []byte(body)); !slices.Equal(got, want) || len(want) != len(p.Req.Messages) {
			t.Errorf("%s:\n entry hashes  %x\n served hashes %x", body, got, want)
		}
	}
}

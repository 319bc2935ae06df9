package api

import (
	"errors"
	"testing"
)

func TestParseChat(t *testing.T) {
	p, err := parseChat([]byte(`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
		"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":9,"stop":"END","seed":4,"temperature":0,
		"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":{"type":"function","function":{"name":"f"}},
		"response_format":{"type":"json_object"}}`))
	if err != nil {
		t.Fatal(err)
	}
	r := p.Req
	if !p.Stream || !p.IncludeUsage || r.MaxTokens != 9 || len(r.Stop) != 1 || *r.Seed != 4 || *r.Temperature != 0 ||
		r.Messages[1].Content != "hi there" || r.ToolChoice.Name != "f" || r.ResponseFormat.Type != "json_object" || len(r.Tools) != 1 {
		t.Fatalf("parsed %+v", p)
	}
	bad := map[string]string{
		`{"messages":[{"role":"user","content":"x"}]}`: "model",
		`{"model":"m"}`:               "messages",
		`{"model":"m","messages":[]}`: "messages",
		`{"model":"m","messages":[{"role":"wizard","content":"x"}]}`:                                        "messages[0].role",
		`{"model":"m","messages":[{"role":"user"}]}`:                                                        "messages[0].content",
		`{"model":"m","messages":[{"role":"user","content":5}]}`:                                            "messages[0].content",
		`{"model":"m","messages":[{"role":"user","content":[{"type":"audio"}]}]}`:                           "messages[0].content[0].type",
		`{"model":"m","messages":[{"role":"tool","content":"x"}]}`:                                          "messages[0].tool_call_id",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"n":3}`:                                    "n",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true}`:                          "logprobs",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":70000}`:                       "max_tokens",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":0}`:                "max_completion_tokens",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]}`:             "stop",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stop":7}`:                                 "stop",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"required"}`:                 "tool_choice",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"}`:                "tool_choice",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval"}]}`:           "tools[0].type",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}}`:         "response_format.type",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}}`: "response_format.json_schema",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`:  "stream_options",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"}`:                      "temperature",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"bogus":1}`:                                "bogus",
	}
	for body, param := range bad {
		_, err := parseChat([]byte(body))
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != 400 || ae.Param != param {
			t.Errorf("%s: got %v, want 400 param %q", body, err, param)
		}
	}
}

// FuzzParseChat: no body may panic the chat decoder; rejections are 400s.
func FuzzParseChat(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a"],"tool_choice":"auto"}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := parseChat(body)
		if err != nil {
			var ae *APIError
			if !errors.As(err, &ae) || ae.Status != 400 || ae.Message == "" {
				t.Fatalf("bad rejection %#v", err)
			}
			return
		}
		if p.Model == "" || len(p.Req.Messages) == 0 {
			t.Fatalf("accepted %+v", p)
		}
	})
}

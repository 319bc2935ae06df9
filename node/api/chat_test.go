package api

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/apierr"
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
		`{"model":"m","messages":[{"role":"wizard","content":"x"}]}`:                                                                       "messages[0].role",
		`{"model":"m","messages":[{"role":"user"}]}`:                                                                                       "messages[0].content",
		`{"model":"m","messages":[{"role":"user","content":5}]}`:                                                                           "messages[0].content",
		`{"model":"m","messages":[{"role":"user","content":[{"type":"audio"}]}]}`:                                                          "messages[0].content[0].type",
		`{"model":"m","messages":[{"role":"tool","content":"x"}]}`:                                                                         "messages[0].tool_call_id",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"n":3}`:                                                                   "n",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true}`:                                                         "logprobs",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":70000}`:                                                      "max_tokens",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":0}`:                                               "max_completion_tokens",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]}`:                                            "stop",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stop":7}`:                                                                "stop",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"required"}`:                                                "tool_choice",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"}`:                                               "tool_choice",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval"}]}`:                                          "tools[0].type",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}}`:                                        "response_format.type",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}}`:                                "response_format.json_schema",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`:                                 "stream_options",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"}`:                                                     "temperature",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"bogus":1}`:                                                               "bogus",
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"file:///etc/passwd"}}]}]}`:             "messages[0].content[0].image_url.url",
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}`:                                       "messages[0].content[0].image_url",
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/a.png","detail":"max"}}]}]}`: "messages[0].content[0].image_url.detail",
	}
	wantBadParams(t, parseChat, bad)
}

// wantBadParams checks that parse refuses each body with a 400 naming the
// param it maps to.
func wantBadParams[T any](t *testing.T, parse func([]byte) (T, error), bad map[string]string) {
	t.Helper()
	for body, param := range bad {
		_, err := parse([]byte(body))
		var ae *apierr.Error
		if !errors.As(err, &ae) || ae.Status != 400 || ae.Param != param {
			t.Errorf("%.80s: got %v, want 400 param %q", body, err, param)
		}
	}
}

// fuzzRejection fails a fuzz case whose decoder error is not a 400
// apierr.Error with a message; it reports whether err was a rejection.
func fuzzRejection(t *testing.T, err error) bool {
	t.Helper()
	if err == nil {
		return false
	}
	var ae *apierr.Error
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Message == "" {
		t.Fatalf("bad rejection %#v", err)
	}
	return true
}

// FuzzParseChat: no body may panic the chat decoder; rejections are 400s.
func FuzzParseChat(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a"],"tool_choice":"auto"}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := parseChat(body)
		if fuzzRejection(t, err) {
			return
		}
		if p.Model == "" || len(p.Req.Messages) == 0 {
			t.Fatalf("accepted %+v", p)
		}
	})
}

// TestParseChatImageParts: image parts are kept in order with the text
// parts; a text-only parts message keeps no parts.
func TestParseChatImageParts(t *testing.T) {
	p, err := parseChat([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
		{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"https://img.invalid/x.png","detail":"high"}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	m0, m1 := p.Req.Messages[0], p.Req.Messages[1]
	if m0.Parts != nil || m0.Content != "ab" {
		t.Fatalf("text-only message %+v", m0)
	}
	if !p.HasImages || p.ImageParam != "messages[1].content" || m1.Content != "look" || len(m1.Parts) != 2 ||
		m1.Parts[0].Text != "look" || m1.Parts[1].ImageURL != "https://img.invalid/x.png" || m1.Parts[1].Detail != "high" {
		t.Fatalf("image message %+v (%v %q)", m1, p.HasImages, p.ImageParam)
	}
}

// TestParseImages: an image generation body with the spec's defaults, the
// operations it names, and each refusal with its param.
func TestParseImages(t *testing.T) {
	p, err := parseImages([]byte(`{"model":"m","prompt":"a fox","n":3,"size":"512x768","seed":9,"response_format":"b64_json","quality":"hd","user":"u"}`))
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Req; p.Model != "m" || r.Prompt != "a fox" || r.N != 3 || r.Size != "512x768" || *r.Seed != 9 || r.ResponseFormat != "b64_json" ||
		r.Quality != "hd" || r.User != "u" || p.Operation != "" {
		t.Fatalf("parsed %+v", p)
	}
	if p, _ := parseImages([]byte(`{"model":"m","prompt":"x"}`)); p.Req.N != 1 || p.Req.Size != "1024x1024" || p.Req.ResponseFormat != "b64_json" {
		t.Fatalf("defaults %+v", p.Req)
	}
	for body, want := range map[string][2]string{
		`{"model":"m","prompt":"x","operation":"upscale","upscale_factor":2}`: {"upscale", "operation"},
		`{"model":"m","prompt":"x","image":"aGk=","mask":"aGk="}`:             {"inpaint", "mask"},
		`{"model":"m","prompt":"x","image":"aGk=","strength":0.5}`:            {"img2img", "image"},
		`{"model":"m","prompt":"x","control_type":"canny"}`:                   {"controlnet guidance", "control_image"},
		`{"model":"m","prompt":"x","reference_images":["aGk="]}`:              {"edit", "reference_images"},
		`{"model":"m","prompt":"x","safety_check":true}`:                      {"the safety filter", "safety_check"},
		`{"model":"m","prompt":"x","safety_check":false}`:                     {"", ""},
	} {
		p, err := parseImages([]byte(body))
		if err != nil || p.Operation != want[0] || p.OperationParam != want[1] {
			t.Errorf("%s: %+v %v, want operation %q from %q", body, p, err, want[0], want[1])
		}
	}
	bad := map[string]string{
		`{"prompt":"x"}`:                                                         "model",
		`{"model":"m"}`:                                                          "prompt",
		`{"model":"m","prompt":""}`:                                              "prompt",
		`{"model":"m","prompt":7}`:                                               "prompt",
		`{"model":"m","prompt":"x","n":0}`:                                       "n",
		`{"model":"m","prompt":"x","n":5}`:                                       "n",
		`{"model":"m","prompt":"x","size":"big"}`:                                "size",
		`{"model":"m","prompt":"x","size":"32x32"}`:                              "size",
		`{"model":"m","prompt":"x","size":"8192x1024"}`:                          "size",
		`{"model":"m","prompt":"x","size":"512x512x3"}`:                          "size",
		`{"model":"m","prompt":"x","size":"0512x512"}`:                           "size",
		`{"model":"m","prompt":"x","response_format":"url"}`:                     "response_format",
		`{"model":"m","prompt":"x","response_format":"png"}`:                     "response_format",
		`{"model":"m","prompt":"x","strength":1.5}`:                              "strength",
		`{"model":"m","prompt":"x","upscale_factor":3}`:                          "upscale_factor",
		`{"model":"m","prompt":"x","control_type":"edges"}`:                      "control_type",
		`{"model":"m","prompt":"x","layer_count":0}`:                             "layer_count",
		`{"model":"m","prompt":"x","operation":"dream"}`:                         "operation",
		`{"model":"m","prompt":"x","quality":"` + strings.Repeat("q", 65) + `"}`: "quality",
		`{"model":"m","prompt":"` + strings.Repeat("x", MaxImagePrompt+1) + `"}`: "prompt",
		`{"model":"m","prompt":"x","colour":"red"}`:                              "colour",
	}
	wantBadParams(t, parseImages, bad)
}

// FuzzParseImages: no body may panic the image generation decoder;
// rejections are 400s, and what it accepts is within the spec's ranges.
func FuzzParseImages(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":"a fox","n":2,"size":"512x512","seed":3}`))
	f.Add([]byte(`{"model":"m","prompt":"x","operation":"inpaint","image":"aGk=","mask":"aGk="}`))
	f.Add([]byte(`{"model":"m","prompt":"x","size":"4096x64","response_format":"b64_json","reference_images":[]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := parseImages(body)
		if fuzzRejection(t, err) {
			return
		}
		var w, h int
		fmt.Sscanf(p.Req.Size, "%dx%d", &w, &h)
		if p.Model == "" || p.Req.Prompt == "" || p.Req.N < 1 || p.Req.N > MaxImagesPerRequest ||
			w < 64 || h < 64 || w > 4096 || h > 4096 || p.Req.ResponseFormat != "b64_json" {
			t.Fatalf("accepted %+v", p)
		}
	})
}

// parseImages is parseImageBody for a generation body (prompt required).
func parseImages(body []byte) (*parsedImages, error) {
	return parseImageBody(body, false)
}

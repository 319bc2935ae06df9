package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// parityClock is the fixed "now" both renderers use for strftime_now.
var parityClock = time.Date(2024, 9, 5, 13, 7, 0, 0, time.UTC)

// realTemplates are the real chat templates in testdata/templates (see
// SOURCES.md there) with their tokenizers' bos and eos tokens.
var realTemplates = []struct{ file, bos, eos string }{
	{"qwen2.5.jinja", "", "<|im_end|>"},
	{"qwen3.jinja", "", "<|im_end|>"},
	{"qwq.jinja", "", "<|im_end|>"},
	{"llama3.1.jinja", "<|begin_of_text|>", "<|eot_id|>"},
	{"llama3.2.jinja", "<|begin_of_text|>", "<|eot_id|>"},
	{"mistral-v0.3.jinja", "<s>", "</s>"},
	{"gemma2.jinja", "<bos>", "<eos>"},
	{"gemma3.jinja", "<bos>", "<eos>"},
	{"phi3.5.jinja", "<s>", "<|endoftext|>"},
	{"phi4.jinja", "<|endoftext|>", "<|im_end|>"},
	{"smollm2.jinja", "<|im_start|>", "<|im_end|>"},
	{"deepseek-r1-distill.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"},
	{"deepseek-r1.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"},
	{"smollm3.jinja", "", "<|im_end|>"},
	{"jamba-1.6.jinja", "<|startoftext|>", "<|endoftext|>"},
}

var parityTools = []engine.Tool{
	{Name: "get_weather", Description: "Current weather for a city, in °C or °F.", Parameters: []byte(
		`{"type":"object","properties":{"city":{"type":"string","description":"City name, e.g. \"Paris\""},` +
			`"unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":7},` +
			`"ratio":{"type":"number","default":0.5}},"required":["city"]}`)},
	{Name: "get_time", Description: "The time now."},
}

// parityConversations cover system prompts, tools, assistant tool calls,
// tool results, reasoning text and multiple turns.
var parityConversations = []struct {
	name  string
	msgs  []engine.ChatMessage
	tools []engine.Tool
}{
	{"user", []engine.ChatMessage{{Role: "user", Content: "Hello, who are you?"}}, nil},
	{"system-multi", []engine.ChatMessage{
		{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Hi"},
		{Role: "assistant", Content: "Hello!"}, {Role: "user", Content: "What is 2+2?"},
	}, nil},
	{"multi-whitespace", []engine.ChatMessage{
		{Role: "user", Content: "  Hi\n"}, {Role: "assistant", Content: " Hello! \n"}, {Role: "user", Content: "\tThanks "},
	}, nil},
	{"tools", []engine.ChatMessage{{Role: "system", Content: "You are a helpful assistant."}, {Role: "user", Content: "Weather in Paris?"}}, parityTools},
	{"tools-no-system", []engine.ChatMessage{{Role: "user", Content: "Weather in Paris?"}}, parityTools},
	{"tool-call", []engine.ChatMessage{
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []engine.ToolCall{{ID: "abcDEF123", Name: "get_weather", Arguments: `{"city":"Paris","unit":"celsius"}`}}},
		{Role: "tool", ToolCallID: "abcDEF123", Content: `{"temp": 21}`},
		{Role: "assistant", Content: "It is 21 °C in Paris."},
	}, parityTools},
	{"parallel-calls", []engine.ChatMessage{
		{Role: "system", Content: "Use tools."},
		{Role: "user", Content: "Paris and Rome?"},
		{Role: "assistant", Content: "Let me check.", ToolCalls: []engine.ToolCall{
			{ID: "call00001", Name: "get_weather", Arguments: `{"city":"Paris","days":3,"ratio":0.25,"opts":{"metric":true,"tags":["a","b"]},"note":null}`},
			{ID: "call00002", Name: "get_weather", Arguments: `{"city":"Rome"}`},
		}},
		{Role: "tool", ToolCallID: "call00001", Content: "21C"},
		{Role: "tool", ToolCallID: "call00002", Content: "25C"},
		{Role: "user", Content: "Thanks"},
	}, parityTools},
	{"reasoning", []engine.ChatMessage{
		{Role: "user", Content: "2+2?"},
		{Role: "assistant", Content: "<think>\nAdd them.\n</think>\n\n4"},
		{Role: "user", Content: "3+3?"},
	}, nil},
	{"unicode", []engine.ChatMessage{
		{Role: "developer", Content: "Réponds en français. «guillemets»"},
		{Role: "user", Content: "Ça va? 😀 \"quoted\" \\ back\ttab {{ not jinja }}"},
	}, nil},
}

// TestTemplatesMatchReference renders every real template for every
// conversation, with and without the generation prompt, and compares the
// text byte for byte with Python's jinja2 set up as Hugging Face's
// apply_chat_template sets it up (scripts/tplref/render.py). Where the
// reference fails (a template refusing a conversation), the Go renderer
// must fail too, with the same raise_exception message.
func TestTemplatesMatchReference(t *testing.T) {
	dir := packageDir()
	type goCase struct {
		tpl  *Template
		conv int
		gen  bool
	}
	var cases []refCase
	goCases := map[string]goCase{}
	for _, rt := range realTemplates {
		path := filepath.Join(dir, "testdata", "templates", rt.file)
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		tpl, err := NewTemplate(TokenizerConfig{ChatTemplate: string(src), BOSToken: rt.bos, EOSToken: rt.eos}, "")
		if err != nil {
			t.Fatalf("%s: %v", rt.file, err)
		}
		tpl.now = func() time.Time { return parityClock }
		for ci, c := range parityConversations {
			for _, gen := range []bool{false, true} {
				id := fmt.Sprintf("%s/%s/gen=%v", rt.file, c.name, gen)
				cases = append(cases, refCase{ID: id, Template: path, Vars: plainVars(t, tpl.context(c.msgs, c.tools, gen))})
				goCases[id] = goCase{tpl, ci, gen}
			}
		}
	}
	results := referenceRender(t, cases)
	rendered, refused := 0, 0
	for _, r := range results {
		gc := goCases[r.ID]
		c := parityConversations[gc.conv]
		got, err := gc.tpl.Render(c.msgs, c.tools, gc.gen)
		if r.Out == nil {
			refused++
			var ie *engine.InputError
			switch {
			case err == nil:
				t.Errorf("%s: the reference fails (%s) but Go rendered %q", r.ID, r.Error, got)
			case !errors.As(err, &ie):
				t.Errorf("%s: error %v is not an InputError", r.ID, err)
			case r.Raised && !strings.HasSuffix(ie.Msg, strings.TrimPrefix(r.Error, "Raised: ")):
				t.Errorf("%s: raise_exception message %q, reference %q", r.ID, ie.Msg, r.Error)
			}
			continue
		}
		rendered++
		if err != nil {
			t.Errorf("%s: %v (reference rendered %q)", r.ID, err, *r.Out)
			continue
		}
		if got != *r.Out {
			t.Errorf("%s:\ngo  %q\nref %q", r.ID, got, *r.Out)
		}
	}
	t.Logf("%d templates x %d conversations x 2: %d rendered identically checked, %d refused by both", len(realTemplates), len(parityConversations), rendered, refused)
	if rendered < len(cases)/2 {
		t.Fatalf("only %d of %d cases render in the reference: the conversations do not exercise the templates", rendered, len(cases))
	}
}

// refCase is one render for scripts/tplref/render.py: a template file or
// source text and its context.
type refCase struct {
	ID       string         `json:"id"`
	Template string         `json:"template,omitempty"`
	Source   *string        `json:"source,omitempty"`
	Vars     map[string]any `json:"vars"`
}

// refResult is the reference's output for a case, or its error.
type refResult struct {
	ID     string  `json:"id"`
	Out    *string `json:"out"`
	Error  string  `json:"error"`
	Raised bool    `json:"raised"`
}

func packageDir() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Dir(self)
}

// referenceRender renders cases with Python's jinja2 set up as Hugging
// Face's apply_chat_template sets it up. A missing reference fails.
func referenceRender(t *testing.T, cases []refCase) []refResult {
	t.Helper()
	script := filepath.Join(packageDir(), "..", "..", "..", "scripts", "tplref", "render.py")
	input, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/bin/python3", script, parityClock.Format("2006-01-02T15:04:05"))
	cmd.Stdin = bytes.NewReader(input)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference renderer failed (is python3-jinja2 installed?): %v\n%s", err, stderr.String())
	}
	var results []refResult
	if err := json.Unmarshal(out, &results); err != nil {
		t.Fatal(err)
	}
	if len(results) != len(cases) {
		t.Fatalf("reference rendered %d cases, want %d", len(results), len(cases))
	}
	return results
}

// plainVars turns a template context into JSON-ready values (ordered
// dicts as json.RawMessage written by the Python-compatible encoder).
func plainVars(t *testing.T, vars map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range vars {
		var b strings.Builder
		if err := writePyJSON(&b, v, defaultJSONOpts(), 0); err != nil {
			t.Fatal(err)
		}
		out[k] = json.RawMessage(b.String())
	}
	return out
}

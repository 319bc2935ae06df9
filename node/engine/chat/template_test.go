package chat

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

// qwen25Template is Qwen2.5-Instruct's chat template with the neutral
// default system message gen_tiny_llama.py also uses.
const qwen25Template = `{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
`

// llama3Template is Meta-Llama-3-8B-Instruct's chat template.
const llama3Template = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"

var weatherTool = engine.Tool{
	Name:        "get_weather",
	Description: "Weather for a city.",
	Parameters:  []byte(`{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"]}`),
}

// conversations covers every branch of the ChatML template.
var conversations = []struct {
	name  string
	msgs  []engine.ChatMessage
	tools []engine.Tool
}{
	{"user only", []engine.ChatMessage{{Role: "user", Content: "Hi there"}}, nil},
	{"system and turns", []engine.ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello!"}, {Role: "user", Content: "Weather?"}}, nil},
	{"developer is system", []engine.ChatMessage{{Role: "developer", Content: "Rules."}, {Role: "user", Content: "x"}}, nil},
	{"late system", []engine.ChatMessage{{Role: "user", Content: "a"}, {Role: "system", Content: "b"}}, nil},
	{"tools", []engine.ChatMessage{{Role: "system", Content: "Sys."}, {Role: "user", Content: "Paris?"}}, []engine.Tool{weatherTool}},
	{"tools without system", []engine.ChatMessage{{Role: "user", Content: "Paris?"}}, []engine.Tool{weatherTool, {Name: "noop"}}},
	{"tool calls and responses", []engine.ChatMessage{
		{Role: "user", Content: "Paris and Rome?"},
		{Role: "assistant", ToolCalls: []engine.ToolCall{{ID: "a", Name: "get_weather", Arguments: `{"city":"Paris","unit":"c"}`}, {ID: "b", Name: "get_weather", Arguments: `{"city": "Rome", "n": 1.50}`}}},
		{Role: "tool", ToolCallID: "a", Content: "21C"},
		{Role: "tool", ToolCallID: "b", Content: "25C"},
		{Role: "assistant", Content: "Warm in both."},
	}, []engine.Tool{weatherTool}},
	{"assistant text and call", []engine.ChatMessage{{Role: "user", Content: "q"}, {Role: "assistant", Content: "Let me check.", ToolCalls: []engine.ToolCall{{Name: "noop", Arguments: `{}`}}}, {Role: "tool", Content: "ok"}}, []engine.Tool{{Name: "noop"}}},
	{"unicode and quotes", []engine.ChatMessage{{Role: "user", Content: "«ça» \"q\" \\ é\n"}}, nil},
}

func TestChatMLFallbackMatchesQwenTemplate(t *testing.T) {
	jinja, err := NewTemplate(TokenizerConfig{ChatTemplate: qwen25Template}, "")
	if err != nil {
		t.Fatal(err)
	}
	if jinja.Builtin() != "" {
		t.Fatal("the Qwen template must be rendered by Jinja")
	}
	builtin, err := NewTemplate(TokenizerConfig{}, FormatChatML)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conversations {
		for _, gen := range []bool{false, true} {
			want, err := jinja.Render(c.msgs, c.tools, gen)
			if err != nil {
				t.Fatalf("%s: jinja: %v", c.name, err)
			}
			got, err := builtin.Render(c.msgs, c.tools, gen)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s (gen=%v):\nbuiltin %q\njinja   %q", c.name, gen, got, want)
			}
		}
	}
}

func TestLlama3FallbackMatchesTemplate(t *testing.T) {
	cfg := TokenizerConfig{ChatTemplate: llama3Template, BOSToken: "<|begin_of_text|>"}
	jinja, err := NewTemplate(cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	builtin, err := NewTemplate(TokenizerConfig{BOSToken: cfg.BOSToken}, FormatLlama3)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conversations {
		if c.tools != nil {
			continue // Llama 3's template has no tools
		}
		want, err := jinja.Render(c.msgs, nil, true)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := builtin.Render(c.msgs, nil, true)
		if got != want {
			t.Errorf("%s:\nbuiltin %q\njinja   %q", c.name, got, want)
		}
	}
	got, _ := builtin.Render([]engine.ChatMessage{{Role: "user", Content: " hi "}}, nil, true)
	if want := "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"; got != want {
		t.Fatalf("llama3 = %q, want %q", got, want)
	}
	withTools, _ := builtin.Render([]engine.ChatMessage{{Role: "user", Content: "x"}}, []engine.Tool{weatherTool}, true)
	if !strings.Contains(withTools, "<|start_header_id|>system<|end_header_id|>\n\n# Tools") || !strings.Contains(withTools, `"name": "get_weather"`) {
		t.Fatalf("llama3 with tools = %q", withTools)
	}
}

func TestChatMLExactText(t *testing.T) {
	tpl, _ := NewTemplate(TokenizerConfig{}, FormatChatML)
	got, _ := tpl.Render(conversations[6].msgs[:3], []engine.Tool{weatherTool}, false)
	want := "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
		`{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}` +
		"\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\nParis and Rome?<|im_end|>\n" +
		"<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n" +
		"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"n\": 1.5}}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\n<tool_response>\n21C\n</tool_response><|im_end|>\n"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

func TestTemplateConfigAndErrors(t *testing.T) {
	cfg, err := ParseTokenizerConfig([]byte(`{"chat_template":[{"name":"default","template":"D{{ messages[0].content }}"},{"name":"tool_use","template":"T{{ tools[0].function.name }}"}],"bos_token":{"content":"<s>"},"eos_token":"</s>"}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BOSToken != "<s>" || cfg.EOSToken != "</s>" || cfg.ToolTemplate == "" {
		t.Fatalf("config = %+v", cfg)
	}
	tpl, err := NewTemplate(cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	msgs := []engine.ChatMessage{{Role: "user", Content: "x"}}
	if got, _ := tpl.Render(msgs, nil, true); got != "Dx" {
		t.Fatalf("default template = %q", got)
	}
	if got, _ := tpl.Render(msgs, []engine.Tool{weatherTool}, true); got != "Tget_weather" {
		t.Fatalf("tool_use template = %q", got)
	}
	raising, err := NewTemplate(TokenizerConfig{ChatTemplate: "{% if messages[0].content == 'x' %}{{ raise_exception('need system') }}{% endif %}ok"}, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = raising.Render(msgs, nil, true)
	var ie *engine.InputError
	if !errors.As(err, &ie) || !strings.Contains(ie.Msg, "need system") {
		t.Fatalf("raise_exception gave %v", err)
	}
	if _, err := NewTemplate(TokenizerConfig{ChatTemplate: "{% for %}"}, ""); err == nil {
		t.Fatal("an unparsable template without fallback must fail")
	}
	if _, err := NewTemplate(TokenizerConfig{ChatTemplate: "{% for %}"}, FormatChatML); err == nil || !strings.Contains(err.Error(), "does not parse") {
		t.Fatalf("an unparsable template must fail even with a built-in format: %v", err)
	}
	if _, err := NewTemplate(TokenizerConfig{ChatTemplate: "{{ messages[0].content.nosuch() }}"}, FormatChatML); err == nil || !strings.Contains(err.Error(), "fails on a one-message conversation") {
		t.Fatalf("a template failing the probe must fail at load: %v", err)
	}
	if _, err := NewTemplate(TokenizerConfig{}, ""); err == nil {
		t.Fatal("no template and no fallback must fail")
	}
}

func TestPyJSON(t *testing.T) {
	got, err := pyJSON([]byte(`{"b":[1,2.50,{"x":null}],"a":"é\u0001\"","t":true,"e":{},"l":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"b": [1, 2.5, {"x": null}], "a": "é\u0001\"", "t": true, "e": {}, "l": []}`; got != want {
		t.Fatalf("pyJSON = %s, want %s", got, want)
	}
	tpl, err := NewTemplate(TokenizerConfig{ChatTemplate: "{% if tools %}{{ tools[0].function.parameters | tojson(indent=2) }}{% endif %}"}, "")
	if err != nil {
		t.Fatal(err)
	}
	out, err := tpl.Render(nil, []engine.Tool{{Name: "f", Parameters: []byte(`{"type":"object","properties":{}}`)}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := "{\n  \"type\": \"object\",\n  \"properties\": {}\n}"; out != want {
		t.Fatalf("tojson(indent=2) = %q, want %q", out, want)
	}
}

func TestTemplateConcurrentRenders(t *testing.T) {
	tpl, err := NewTemplate(TokenizerConfig{ChatTemplate: qwen25Template}, "")
	if err != nil {
		t.Fatal(err)
	}
	want, err := tpl.Render(conversations[6].msgs, conversations[6].tools, true)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			for range 20 {
				got, err := tpl.Render(conversations[6].msgs, conversations[6].tools, true)
				if err == nil && got != want {
					err = errors.New("a concurrent render differs")
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// pyJSON is JSON text as Python's json.dumps(json.loads(data),
// ensure_ascii=False) prints it.
func pyJSON(data []byte) (string, error) {
	v, ok := jsonValue(data)
	if !ok {
		return "", fmt.Errorf("chat: invalid JSON")
	}
	var b strings.Builder
	err := writePyJSON(&b, v, defaultJSONOpts(), 0)
	return b.String(), err
}

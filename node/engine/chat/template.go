package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/infermesh/infermesh/node/engine"
)

// TokenizerConfig is the part of a model's tokenizer_config.json the chat
// engine reads.
type TokenizerConfig struct {
	// ChatTemplate is the Jinja source of the default template.
	ChatTemplate string
	// ToolTemplate is the "tool_use" template of a file with named
	// templates, used when a request has tools ("" if none).
	ToolTemplate string
	// BOSToken is the bos_token text, given to the template as bos_token
	// and written by the Llama 3 fallback ("" if unset).
	BOSToken string
	// EOSToken is the eos_token text, given to the template as eos_token;
	// its id also ends generation ("" if unset).
	EOSToken string
}

// LoadTokenizerConfig reads tokenizer_config.json. chat_template may be a
// string or a list of {name, template}; special tokens may be strings or
// {"content": ...} objects.
func LoadTokenizerConfig(path string) (TokenizerConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return TokenizerConfig{}, fmt.Errorf("chat: %w", err)
	}
	return ParseTokenizerConfig(data)
}

// ParseTokenizerConfig parses the contents of a tokenizer_config.json.
func ParseTokenizerConfig(data []byte) (TokenizerConfig, error) {
	var f struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return TokenizerConfig{}, fmt.Errorf("chat: tokenizer_config.json: %w", err)
	}
	var c TokenizerConfig
	if len(f.ChatTemplate) > 0 && !bytes.Equal(f.ChatTemplate, []byte("null")) {
		if err := json.Unmarshal(f.ChatTemplate, &c.ChatTemplate); err != nil {
			var named []struct {
				Name     string `json:"name"`
				Template string `json:"template"`
			}
			if err := json.Unmarshal(f.ChatTemplate, &named); err != nil {
				return c, fmt.Errorf("chat: chat_template is neither a string nor a list of named templates")
			}
			for _, n := range named {
				switch n.Name {
				case "default":
					c.ChatTemplate = n.Template
				case "tool_use":
					c.ToolTemplate = n.Template
				}
			}
		}
	}
	c.BOSToken = tokenContent(f.BOS)
	c.EOSToken = tokenContent(f.EOS)
	return c, nil
}

// tokenContent reads a special token given as a string or an AddedToken object.
func tokenContent(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		return obj.Content
	}
	return ""
}

// Format names a built-in prompt format, used when a model ships no
// Jinja template.
type Format string

// Built-in formats.
const (
	// FormatChatML is <|im_start|>role\n...<|im_end|> as Qwen2.5 lays it
	// out, tools section and <tool_call> blocks included.
	FormatChatML Format = "chatml"
	// FormatLlama3 is Llama 3's <|start_header_id|>role<|end_header_id|>
	// layout.
	FormatLlama3 Format = "llama3"
)

// Template renders a conversation into the prompt text a model was trained
// on: the model's own Jinja chat template when it has one, else a built-in
// format. Jinja templates render as Hugging Face's apply_chat_template
// does (jinja2's sandbox with trim_blocks and lstrip_blocks, its tojson,
// raise_exception and strftime_now). It is safe for concurrent use.
type Template struct {
	jinja     []stmt // nil: use format
	toolJinja []stmt // the tool_use template, if any
	format    Format
	bos, eos  string
	now       func() time.Time // strftime_now's clock
}

// NewTemplate compiles cfg's chat template and renders a probe
// conversation with it. A template that does not parse, or that fails on
// the probe, is an error naming the problem: there is no silent fallback.
// Only a model without any template uses fallback (FormatChatML or
// FormatLlama3); fallback "" makes that an error too.
func NewTemplate(cfg TokenizerConfig, fallback Format) (*Template, error) {
	t := &Template{format: fallback, bos: cfg.BOSToken, eos: cfg.EOSToken, now: time.Now}
	if cfg.ChatTemplate == "" {
		switch fallback {
		case FormatChatML, FormatLlama3:
			return t, nil
		case "":
			return nil, errors.New("chat: the model has no chat template and no built-in format fits its tokenizer")
		}
		return nil, fmt.Errorf("chat: unknown built-in format %q", fallback)
	}
	var err error
	if t.jinja, err = parseTemplate(cfg.ChatTemplate); err != nil {
		return nil, fmt.Errorf("chat: chat template does not parse: %w", err)
	}
	if cfg.ToolTemplate != "" {
		if t.toolJinja, err = parseTemplate(cfg.ToolTemplate); err != nil {
			return nil, fmt.Errorf("chat: tool_use chat template does not parse: %w", err)
		}
	}
	probe := []engine.ChatMessage{{Role: engine.RoleUser, Content: "Hello"}}
	if _, err := t.Render(probe, nil, true); err != nil {
		return nil, fmt.Errorf("chat: chat template fails on a one-message conversation: %w", err)
	}
	if t.toolJinja != nil {
		tool := []engine.Tool{{Name: "probe", Description: "Probe.", Parameters: []byte(`{"type":"object","properties":{}}`)}}
		if _, err := t.Render(probe, tool, true); err != nil {
			return nil, fmt.Errorf("chat: tool_use chat template fails on a one-message conversation: %w", err)
		}
	}
	return t, nil
}

// Builtin reports the built-in format in use, "" when the model's own
// template renders.
func (t *Template) Builtin() Format {
	if t.jinja != nil {
		return ""
	}
	return t.format
}

// Render lays out messages (and tools) as the prompt, ending with the
// assistant's turn opener when addGenerationPrompt is set. A template that
// raises or fails on the conversation gives an *engine.InputError.
func (t *Template) Render(msgs []engine.ChatMessage, tools []engine.Tool, addGenerationPrompt bool) (string, error) {
	prog := t.jinja
	if len(tools) > 0 && t.toolJinja != nil {
		prog = t.toolJinja
	}
	if prog == nil {
		switch t.format {
		case FormatLlama3:
			return renderLlama3(msgs, tools, addGenerationPrompt, t.bos), nil
		default:
			return renderChatML(msgs, tools, addGenerationPrompt), nil
		}
	}
	vars := t.context(msgs, tools, addGenerationPrompt)
	out, err := renderProgram(prog, vars, t.now)
	var raised *raisedError
	switch {
	case errors.As(err, &raised):
		return "", &engine.InputError{Param: "messages", Msg: "the model's chat template refused the conversation: " + raised.msg}
	case err != nil:
		return "", &engine.InputError{Param: "messages", Msg: "the model's chat template failed on the conversation: " + err.Error()}
	}
	return out, nil
}

// context is the template context Hugging Face builds: messages, tools
// (None without tools), documents (None), add_generation_prompt and the
// special tokens the tokenizer defines.
func (t *Template) context(msgs []engine.ChatMessage, tools []engine.Tool, addGenerationPrompt bool) map[string]any {
	vars := map[string]any{
		"messages":              templateMessages(msgs),
		"tools":                 nil,
		"documents":             nil,
		"add_generation_prompt": addGenerationPrompt,
	}
	if len(tools) > 0 {
		vars["tools"] = templateTools(tools)
	}
	if t.bos != "" {
		vars["bos_token"] = t.bos
	}
	if t.eos != "" {
		vars["eos_token"] = t.eos
	}
	return vars
}

// renderProgram runs a parsed template with vars as its context.
func renderProgram(prog []stmt, vars map[string]any, now func() time.Time) (string, error) {
	var b strings.Builder
	ev := &evaluator{out: &b, sc: &scope{vars: vars}, now: now}
	if _, err := ev.execAll(prog); err != nil {
		return "", err
	}
	return b.String(), nil
}

// templateMessages builds the messages as Hugging Face passes them to a
// template: developer becomes system, tool call arguments are objects
// (as vLLM and the Transformers docs have them).
func templateMessages(msgs []engine.ChatMessage) []any {
	out := make([]any, len(msgs))
	for i, m := range msgs {
		role := m.Role
		if role == engine.RoleDeveloper {
			role = engine.RoleSystem
		}
		d := newDict("role", role, "content", m.Content)
		if m.Name != "" {
			_ = d.set("name", m.Name)
		}
		if m.ToolCallID != "" {
			_ = d.set("tool_call_id", m.ToolCallID)
		}
		if len(m.ToolCalls) > 0 {
			calls := make([]any, len(m.ToolCalls))
			for j, c := range m.ToolCalls {
				args, ok := jsonValue([]byte(c.Arguments))
				if !ok {
					args = c.Arguments
				}
				fn := newDict("name", c.Name, "arguments", args)
				calls[j] = newDict("id", c.ID, "type", "function", "function", fn)
			}
			_ = d.set("tool_calls", calls)
		}
		out[i] = d
	}
	return out
}

// templateTools builds the tool list in OpenAI's shape, which templates
// print with tojson.
func templateTools(tools []engine.Tool) []any {
	out := make([]any, len(tools))
	for i, tl := range tools {
		fn := newDict("name", tl.Name)
		if tl.Description != "" {
			_ = fn.set("description", tl.Description)
		}
		params, ok := jsonValue(tl.Parameters)
		if len(bytes.TrimSpace(tl.Parameters)) == 0 || !ok {
			params = newDict("type", "object", "properties", newPyDict())
		}
		_ = fn.set("parameters", params)
		out[i] = newDict("type", "function", "function", fn)
	}
	return out
}

// newDict builds an ordered dict from key, value pairs.
func newDict(kv ...any) *pyDict {
	d := newPyDict()
	for i := 0; i+1 < len(kv); i += 2 {
		_ = d.set(kv[i], kv[i+1])
	}
	return d
}

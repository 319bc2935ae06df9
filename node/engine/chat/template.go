package chat

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"

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
// usable Jinja template.
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
// format. It is safe for concurrent use.
type Template struct {
	jinja     *exec.Template // nil: use format
	toolJinja *exec.Template // the tool_use template, if any
	format    Format
	bos, eos  string
}

// NewTemplate compiles cfg's chat template. With no template, or one the
// Jinja engine cannot parse, it falls back to fallback (FormatChatML or
// FormatLlama3); fallback "" makes that an error.
func NewTemplate(cfg TokenizerConfig, fallback Format) (*Template, error) {
	t := &Template{format: fallback, bos: cfg.BOSToken, eos: cfg.EOSToken}
	var parseErr error
	if cfg.ChatTemplate != "" {
		t.jinja, parseErr = compileJinja(cfg.ChatTemplate)
	}
	if cfg.ToolTemplate != "" && parseErr == nil {
		t.toolJinja, parseErr = compileJinja(cfg.ToolTemplate)
	}
	if parseErr != nil {
		t.jinja, t.toolJinja = nil, nil
	}
	if t.jinja == nil {
		switch fallback {
		case FormatChatML, FormatLlama3:
		case "":
			if parseErr != nil {
				return nil, fmt.Errorf("chat: chat template: %w", parseErr)
			}
			return nil, errors.New("chat: the model has no chat template and no built-in format fits its tokenizer")
		default:
			return nil, fmt.Errorf("chat: unknown built-in format %q", fallback)
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

// compileJinja parses src with an environment of its own: a copy of the
// built-in filters with tojson replaced by a Python-compatible one, so no
// package-level state is touched.
func compileJinja(src string) (*exec.Template, error) {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{})
	filters.Update(builtins.Filters)
	if err := filters.Replace("tojson", filterToJSON); err != nil {
		return nil, err
	}
	ctx := exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables)
	env := &exec.Environment{
		Context:           ctx,
		Filters:           filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           builtins.Methods,
	}
	sum := sha256.Sum256([]byte(src))
	root := fmt.Sprintf("chat-template-%x", sum[:8])
	loader, err := loaders.NewFileSystemLoader("")
	if err != nil {
		return nil, err
	}
	shifted, err := loaders.NewShiftedLoader(root, strings.NewReader(src), loader)
	if err != nil {
		return nil, err
	}
	// Hugging Face renders chat templates with trim_blocks and lstrip_blocks.
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	return exec.NewTemplate(root, cfg, shifted, env)
}

// Render lays out messages (and tools) as the prompt, ending with the
// assistant's turn opener when addGenerationPrompt is set.
func (t *Template) Render(msgs []engine.ChatMessage, tools []engine.Tool, addGenerationPrompt bool) (string, error) {
	tpl := t.jinja
	if len(tools) > 0 && t.toolJinja != nil {
		tpl = t.toolJinja
	}
	if tpl == nil {
		switch t.format {
		case FormatLlama3:
			return renderLlama3(msgs, tools, addGenerationPrompt, t.bos), nil
		default:
			return renderChatML(msgs, tools, addGenerationPrompt), nil
		}
	}
	var raised error
	data := map[string]any{
		"messages":              templateMessages(msgs),
		"add_generation_prompt": addGenerationPrompt,
		"bos_token":             t.bos,
		"eos_token":             t.eos,
		"raise_exception": func(msg string) string {
			raised = errors.New(msg)
			return ""
		},
		"strftime_now": func(format string) string { return strftime(time.Now(), format) },
	}
	if len(tools) > 0 {
		data["tools"] = templateTools(tools)
	}
	out, err := tpl.ExecuteToString(exec.NewContext(data))
	if raised != nil {
		return "", &engine.InputError{Param: "messages", Msg: "the model's chat template refused the conversation: " + raised.Error()}
	}
	if err != nil {
		return "", fmt.Errorf("chat: render template: %w", err)
	}
	return out, nil
}

// templateMessages builds the messages as Hugging Face passes them to a
// template: developer becomes system, tool call arguments are objects.
func templateMessages(msgs []engine.ChatMessage) []any {
	out := make([]any, len(msgs))
	for i, m := range msgs {
		role := m.Role
		if role == engine.RoleDeveloper {
			role = engine.RoleSystem
		}
		d := newDict("role", role, "content", m.Content)
		if m.Name != "" {
			d = dictSet(d, "name", m.Name)
		}
		if m.ToolCallID != "" {
			d = dictSet(d, "tool_call_id", m.ToolCallID)
		}
		if len(m.ToolCalls) > 0 {
			calls := make([]any, len(m.ToolCalls))
			for j, c := range m.ToolCalls {
				fn := newDict("name", c.Name, "arguments", jsonValue([]byte(c.Arguments), c.Arguments))
				calls[j] = newDict("id", c.ID, "type", "function", "function", fn)
			}
			d = dictSet(d, "tool_calls", calls)
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
			fn = dictSet(fn, "description", tl.Description)
		}
		params := tl.Parameters
		if len(bytes.TrimSpace(params)) == 0 {
			params = []byte(`{"type": "object", "properties": {}}`)
		}
		fn = dictSet(fn, "parameters", jsonValue(params, nil))
		out[i] = newDict("type", "function", "function", fn)
	}
	return out
}

// newDict builds an ordered template dict from key, value pairs.
func newDict(kv ...any) *exec.Dict {
	d := exec.NewDict()
	for i := 0; i+1 < len(kv); i += 2 {
		d = dictSet(d, kv[i].(string), kv[i+1])
	}
	return d
}

func dictSet(d *exec.Dict, key string, v any) *exec.Dict {
	d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(key), Value: exec.AsValue(v)})
	return d
}

// jsonValue decodes JSON into template values with object key order kept
// (*exec.Dict) and numbers as their original text (json.Number). Invalid
// JSON gives fallback.
func jsonValue(data []byte, fallback any) any {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeOrdered(dec)
	if err != nil {
		return fallback
	}
	if _, err := dec.Token(); err == nil {
		return fallback // trailing data
	}
	return v
}

func decodeOrdered(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := exec.NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				d = dictSet(d, k.(string), v)
			}
			_, err := dec.Token()
			return d, err
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodeOrdered(dec)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token()
			return list, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	}
	return tok, nil
}

// strftime formats t with the C directives chat templates use.
func strftime(t time.Time, format string) string {
	r := strings.NewReplacer("%d", t.Format("02"), "%b", t.Format("Jan"), "%B", t.Format("January"), "%Y", t.Format("2006"),
		"%m", t.Format("01"), "%H", t.Format("15"), "%M", t.Format("04"), "%S", t.Format("05"), "%a", t.Format("Mon"), "%A", t.Format("Monday"), "%%", "%")
	return r.Replace(format)
}

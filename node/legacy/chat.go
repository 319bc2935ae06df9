package legacy

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Ollama's chat and generate requests: only the fields the legacy API
// maps; others (keep_alive, think, truncate, shift) are accepted and
// ignored, as Ollama ignores what a model does not use.
type chatRequest struct {
	Model     string          `json:"model"`
	Messages  []message       `json:"messages"`
	Stream    *bool           `json:"stream"`
	Format    json.RawMessage `json:"format"`
	Options   map[string]any  `json:"options"`
	Tools     json.RawMessage `json:"tools"`
	Logprobs  bool            `json:"logprobs"`
	KeepAlive any             `json:"keep_alive"`
}

type generateRequest struct {
	Model    string          `json:"model"`
	Prompt   string          `json:"prompt"`
	Suffix   string          `json:"suffix"`
	System   string          `json:"system"`
	Template string          `json:"template"`
	Context  []int           `json:"context"`
	Stream   *bool           `json:"stream"`
	Raw      bool            `json:"raw"`
	Format   json.RawMessage `json:"format"`
	Images   []string        `json:"images"`
	Options  map[string]any  `json:"options"`
	Logprobs bool            `json:"logprobs"`
}

type message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	Images     []string   `json:"images,omitempty"`
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolName   string     `json:"tool_name,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

type toolCall struct {
	ID       string `json:"id,omitempty"`
	Function struct {
		Index     int             `json:"index"`
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// requestError is a caller mistake in a legacy request (400).
type requestError string

// Error is the message shown to the caller.
func (e requestError) Error() string { return string(e) }

// v1Chat builds the /v1 chat completions body shared by chat and
// generate.
func v1Chat(model string, msgs []map[string]any, format json.RawMessage, opts map[string]any, tools json.RawMessage, logprobs bool) (map[string]any, error) {
	body := map[string]any{"model": model, "messages": msgs, "stream": true, "stream_options": map[string]any{"include_usage": true}}
	if err := mapOptions(opts, body); err != nil {
		return nil, err
	}
	if err := mapFormat(format, body); err != nil {
		return nil, err
	}
	if len(tools) > 0 && string(tools) != "null" && string(tools) != "[]" {
		body["tools"] = tools
	}
	if logprobs {
		body["logprobs"] = true // /v1 answers 400: logprobs are not available
	}
	return body, nil
}

// mapOptions maps Ollama's options onto /v1 fields. Options that no /v1
// field carries (num_ctx, top_k, repeat_penalty, ...) are ignored.
func mapOptions(opts map[string]any, body map[string]any) error {
	num := func(name string) (float64, bool, error) {
		v, ok := opts[name]
		if !ok || v == nil {
			return 0, false, nil
		}
		f, ok := v.(float64)
		if !ok {
			return 0, false, requestError(fmt.Sprintf("option %s: want a number", name))
		}
		return f, true, nil
	}
	for _, o := range []struct{ name, field string }{{"temperature", "temperature"}, {"top_p", "top_p"}, {"presence_penalty", "presence_penalty"}, {"frequency_penalty", "frequency_penalty"}} {
		f, ok, err := num(o.name)
		if err != nil {
			return err
		}
		if ok {
			body[o.field] = f
		}
	}
	if f, ok, err := num("seed"); err != nil {
		return err
	} else if ok && f >= 0 {
		body["seed"] = int64(f)
	}
	if f, ok, err := num("num_predict"); err != nil {
		return err
	} else if ok && f > 0 {
		body["max_tokens"] = int(f) // -1 (no limit) and -2 (fill the context) leave the model's maximum
	}
	switch v := opts["stop"].(type) {
	case nil:
	case string:
		body["stop"] = []string{v}
	case []any:
		var stop []string
		for _, s := range v {
			str, ok := s.(string)
			if !ok {
				return requestError("option stop: want strings")
			}
			stop = append(stop, str)
		}
		if len(stop) > 0 {
			body["stop"] = stop
		}
	default:
		return requestError("option stop: want a string or a list of strings")
	}
	return nil
}

// mapFormat maps Ollama's format ("json" or a JSON schema) onto
// response_format.
func mapFormat(format json.RawMessage, body map[string]any) error {
	f := strings.TrimSpace(string(format))
	switch {
	case f == "" || f == "null" || f == `""`:
	case f == `"json"`:
		body["response_format"] = map[string]any{"type": "json_object"}
	case strings.HasPrefix(f, "{"):
		body["response_format"] = map[string]any{"type": "json_schema",
			"json_schema": map[string]any{"name": "format", "schema": json.RawMessage(format), "strict": true}}
	default:
		return requestError(fmt.Sprintf("format %s: want \"json\" or a JSON schema", f))
	}
	return nil
}

// imagePart turns an Ollama image (base64 bytes) into an image_url part.
func imagePart(b64 string) (map[string]any, error) {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, requestError("images: each image must be base64")
	}
	url := "data:" + http.DetectContentType(raw) + ";base64," + b64
	return map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}}, nil
}

// content is a message's /v1 content: the text, or parts when images come
// along.
func content(text string, images []string) (any, error) {
	if len(images) == 0 {
		return text, nil
	}
	parts := []any{map[string]any{"type": "text", "text": text}}
	for _, img := range images {
		p, err := imagePart(img)
		if err != nil {
			return nil, err
		}
		parts = append(parts, p)
	}
	return parts, nil
}

// v1Messages maps Ollama messages. Ollama's tool calls carry arguments as
// an object and may have no id; the ids are made up here and a tool
// message without tool_call_id answers the oldest open call (of its
// tool_name when given).
func v1Messages(in []message) ([]map[string]any, error) {
	out := make([]map[string]any, 0, len(in))
	var open []struct{ id, name string }
	for i, m := range in {
		c, err := content(m.Content, m.Images)
		if err != nil {
			return nil, err
		}
		o := map[string]any{"role": m.Role, "content": c}
		if len(m.ToolCalls) > 0 {
			calls := make([]map[string]any, len(m.ToolCalls))
			for j, tc := range m.ToolCalls {
				id := tc.ID
				if id == "" {
					id = fmt.Sprintf("call_%d_%d", i, j)
				}
				args := strings.TrimSpace(string(tc.Function.Arguments))
				if args == "" || args == "null" {
					args = "{}"
				}
				calls[j] = map[string]any{"id": id, "type": "function", "function": map[string]any{"name": tc.Function.Name, "arguments": args}}
				open = append(open, struct{ id, name string }{id, tc.Function.Name})
			}
			o["tool_calls"] = calls
			if m.Content == "" {
				o["content"] = nil
			}
		}
		if m.Role == "tool" {
			id := m.ToolCallID
			if id == "" {
				for k, c := range open {
					if m.ToolName == "" || c.name == m.ToolName {
						id = c.id
						open = append(open[:k], open[k+1:]...)
						break
					}
				}
			}
			if id == "" {
				return nil, requestError(fmt.Sprintf("messages[%d]: a tool message must answer a tool call of an earlier assistant message", i))
			}
			o["tool_call_id"] = id
		}
		out = append(out, o)
	}
	return out, nil
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Model == "" {
		writeError(w, http.StatusBadRequest, "model is required")
		return
	}
	model := modelName(req.Model)
	if len(req.Messages) == 0 {
		// Ollama loads the model and answers at once.
		s.loaded(w, r, model, true)
		return
	}
	msgs, err := v1Messages(req.Messages)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	body, err := v1Chat(model, msgs, req.Format, req.Options, req.Tools, req.Logprobs)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.complete(w, r, body, model, req.Stream == nil || *req.Stream, true)
}

func (s *Server) generate(w http.ResponseWriter, r *http.Request) {
	var req generateRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Model == "" {
		writeError(w, http.StatusBadRequest, "model is required")
		return
	}
	var unsupported []string
	if req.Suffix != "" {
		unsupported = append(unsupported, "suffix")
	}
	if req.Template != "" {
		unsupported = append(unsupported, "template")
	}
	if req.Raw {
		unsupported = append(unsupported, "raw")
	}
	if len(req.Context) > 0 {
		unsupported = append(unsupported, "context")
	}
	if len(unsupported) > 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s: not supported by the legacy API, which maps generate onto POST /v1/chat/completions with the model's own template; send the conversation as messages instead", strings.Join(unsupported, ", ")))
		return
	}
	model := modelName(req.Model)
	if req.Prompt == "" && len(req.Images) == 0 {
		s.loaded(w, r, model, false)
		return
	}
	var msgs []map[string]any
	if req.System != "" {
		msgs = append(msgs, map[string]any{"role": "system", "content": req.System})
	}
	c, err := content(req.Prompt, req.Images)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	msgs = append(msgs, map[string]any{"role": "user", "content": c})
	body, err := v1Chat(model, msgs, req.Format, req.Options, nil, req.Logprobs)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.complete(w, r, body, model, req.Stream == nil || *req.Stream, false)
}

// loaded answers a chat without messages or a generate without a prompt as
// Ollama does (done, done_reason "load") once the model is known.
func (s *Server) loaded(w http.ResponseWriter, r *http.Request, model string, chat bool) {
	var m struct{}
	if err := s.getJSON(r, "/v1/models/"+escapeID(model), &m); err != nil {
		s.fail(w, err)
		return
	}
	out := map[string]any{"model": model, "created_at": s.opt.Clock().UTC(), "done": true, "done_reason": "load"}
	if chat {
		out["message"] = map[string]any{"role": "assistant", "content": ""}
	} else {
		out["response"] = ""
	}
	writeJSON(w, http.StatusOK, out)
}

// errStreamBroke marks a /v1 stream that ended without [DONE].
var errStreamBroke = errors.New("the answer broke off before it was complete")

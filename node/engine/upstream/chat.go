package upstream

import (
	"context"
	"encoding/json"

	"github.com/infermesh/infermesh/node/engine"
)

// chatEngine serves one provider chat model.
type chatEngine struct{ providerModel }

var _ engine.Chatter = (*chatEngine)(nil)

// ContextWindow is the configured context window.
func (e *chatEngine) ContextWindow() int { return e.m.ContextWindow }

// MaxOutputTokens is the configured output cap.
func (e *chatEngine) MaxOutputTokens() int { return e.m.MaxOutputTokens }

// TakesImages is the model's image_input setting.
func (e *chatEngine) TakesImages() bool { return e.m.ImageInput }

// OpenAI wire types, as the provider speaks them.
type wireFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type wireToolCall struct {
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function wireFunction `json:"function"`
}

type wireMessage struct {
	Role       string         `json:"role"`
	Content    *string        `json:"content"`
	Name       string         `json:"name,omitempty"`
	ToolCalls  []wireToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

// wireOutMessage is a request message: its content is a string, null, or
// a list of parts when the message has images.
type wireOutMessage struct {
	Role       string         `json:"role"`
	Content    any            `json:"content"`
	Name       string         `json:"name,omitempty"`
	ToolCalls  []wireToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

// wirePart is a content part as the provider takes it.
type wirePart struct {
	Type     string        `json:"type"`
	Text     string        `json:"text,omitempty"`
	ImageURL *wireImageURL `json:"image_url,omitempty"`
}

type wireImageURL struct {
	URL    string `json:"url"`
	Detail string `json:"detail,omitempty"`
}

type wireUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

type wireChoice struct {
	Index        int         `json:"index"`
	Message      wireMessage `json:"message"`
	Delta        wireMessage `json:"delta"`
	FinishReason *string     `json:"finish_reason"`
}

type wireCompletion struct {
	Choices []wireChoice    `json:"choices"`
	Usage   *wireUsage      `json:"usage"`
	Error   json.RawMessage `json:"error"`
}

// request builds the provider's chat completions body.
func (e *chatEngine) request(req engine.ChatRequest, stream bool) map[string]any {
	msgs := make([]wireOutMessage, len(req.Messages))
	for i, m := range req.Messages {
		w := wireOutMessage{Role: m.Role, Name: m.Name, ToolCallID: m.ToolCallID}
		content := m.Content
		switch {
		case len(m.Parts) > 0:
			parts := make([]wirePart, len(m.Parts))
			for j, p := range m.Parts {
				if p.ImageURL != "" {
					parts[j] = wirePart{Type: "image_url", ImageURL: &wireImageURL{URL: p.ImageURL, Detail: p.Detail}}
				} else {
					parts[j] = wirePart{Type: "text", Text: p.Text}
				}
			}
			w.Content = parts
		case m.Role != engine.RoleAssistant || content != "" || len(m.ToolCalls) == 0:
			w.Content = &content
		}
		for _, tc := range m.ToolCalls {
			w.ToolCalls = append(w.ToolCalls, wireToolCall{ID: tc.ID, Type: "function", Function: wireFunction{Name: tc.Name, Arguments: tc.Arguments}})
		}
		msgs[i] = w
	}
	body := map[string]any{"model": e.m.Model, "messages": msgs}
	if stream {
		body["stream"] = true
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	if req.MaxTokens > 0 {
		body["max_tokens"] = req.MaxTokens
	}
	if req.Temperature != nil {
		body["temperature"] = *req.Temperature
	}
	if req.TopP != nil {
		body["top_p"] = *req.TopP
	}
	if req.Seed != nil {
		body["seed"] = *req.Seed
	}
	if len(req.Stop) > 0 {
		body["stop"] = req.Stop
	}
	if req.PresencePenalty != 0 {
		body["presence_penalty"] = req.PresencePenalty
	}
	if req.FrequencyPenalty != 0 {
		body["frequency_penalty"] = req.FrequencyPenalty
	}
	if len(req.Tools) > 0 {
		tools := make([]map[string]any, len(req.Tools))
		for i, t := range req.Tools {
			fn := map[string]any{"name": t.Name}
			if t.Description != "" {
				fn["description"] = t.Description
			}
			if len(t.Parameters) > 0 {
				fn["parameters"] = json.RawMessage(t.Parameters)
			}
			if t.Strict {
				fn["strict"] = true
			}
			tools[i] = map[string]any{"type": "function", "function": fn}
		}
		body["tools"] = tools
	}
	switch req.ToolChoice.Mode {
	case engine.ToolChoiceAuto, engine.ToolChoiceNone, engine.ToolChoiceRequired:
		body["tool_choice"] = req.ToolChoice.Mode
	case engine.ToolChoiceFunction:
		body["tool_choice"] = map[string]any{"type": "function", "function": map[string]string{"name": req.ToolChoice.Name}}
	}
	if req.ParallelToolCalls != nil {
		body["parallel_tool_calls"] = *req.ParallelToolCalls
	}
	switch f := req.ResponseFormat; f.Type {
	case engine.FormatText, engine.FormatJSONObject:
		body["response_format"] = map[string]any{"type": f.Type}
	case engine.FormatJSONSchema:
		js := map[string]any{"name": f.Name, "schema": json.RawMessage(f.Schema)}
		if js["name"] == "" {
			js["name"] = "response"
		}
		if f.Strict {
			js["strict"] = true
		}
		body["response_format"] = map[string]any{"type": f.Type, "json_schema": js}
	}
	return body
}

// Chat sends the conversation to the provider, streamed when onDelta is
// given.
func (e *chatEngine) Chat(ctx context.Context, req engine.ChatRequest, onDelta func(engine.ChatDelta) error) (engine.ChatResponse, error) {
	cl, err := e.c.post(ctx, "/chat/completions", e.request(req, onDelta != nil), onDelta != nil)
	if err != nil {
		return engine.ChatResponse{}, err
	}
	defer cl.Close()
	if onDelta != nil {
		return e.stream(ctx, cl, onDelta)
	}
	var out wireCompletion
	if err := e.c.readJSON(ctx, cl, &out); err != nil {
		return engine.ChatResponse{}, err
	}
	if len(out.Choices) == 0 {
		return engine.ChatResponse{}, e.c.badResponse("no choices in the completion")
	}
	ch := out.Choices[0]
	res := engine.ChatResponse{Message: engine.ChatMessage{Role: engine.RoleAssistant}, FinishReason: finishReason(ch.FinishReason)}
	if ch.Message.Content != nil {
		res.Message.Content = *ch.Message.Content
	}
	for _, tc := range ch.Message.ToolCalls {
		res.Message.ToolCalls = append(res.Message.ToolCalls, engine.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	if out.Usage != nil {
		res.Usage = engine.ChatUsage{PromptTokens: out.Usage.PromptTokens, CompletionTokens: out.Usage.CompletionTokens}
	}
	return res, nil
}

// finishReason maps the provider's finish reason (the legacy
// "function_call" is "tool_calls"; none is "stop").
func finishReason(p *string) string {
	if p == nil || *p == "" {
		return engine.FinishStop
	}
	if *p == "function_call" {
		return engine.FinishToolCalls
	}
	return *p
}

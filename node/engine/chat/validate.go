package chat

import (
	"fmt"

	"github.com/infermesh/infermesh/node/engine"
)

// Request limits from the API contract.
const (
	// MaxContextTokens caps any model's context window.
	MaxContextTokens = 131072
	// MaxOutputTokensLimit caps max_tokens.
	MaxOutputTokensLimit = 65536
	// MaxStopSequences is how many stop strings a request may give.
	MaxStopSequences = 4
)

// validToolName is OpenAI's rule for function names: 1-64 of a-z, A-Z,
// 0-9, _ and -.
func validToolName(s string) bool {
	if len(s) == 0 || len(s) > maxToolNameLn {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func inputErr(param, format string, args ...any) error {
	return &engine.InputError{Param: param, Msg: fmt.Sprintf(format, args...)}
}

// Validate checks a request's fields that do not depend on the model.
func Validate(req engine.ChatRequest) error {
	if len(req.Messages) == 0 {
		return inputErr("messages", "messages must not be empty")
	}
	callIDs := map[string]bool{}
	for i, m := range req.Messages {
		switch m.Role {
		case engine.RoleSystem, engine.RoleDeveloper, engine.RoleUser:
		case engine.RoleAssistant:
			for j, c := range m.ToolCalls {
				if c.Name == "" {
					return inputErr(fmt.Sprintf("messages[%d].tool_calls[%d].function.name", i, j), "a tool call needs a function name")
				}
				if c.ID != "" {
					callIDs[c.ID] = true
				}
			}
		case engine.RoleTool:
			if m.ToolCallID == "" {
				return inputErr(fmt.Sprintf("messages[%d].tool_call_id", i), "a tool message needs tool_call_id")
			}
			if !callIDs[m.ToolCallID] {
				return inputErr(fmt.Sprintf("messages[%d].tool_call_id", i), "tool_call_id %q does not match any earlier assistant tool call", m.ToolCallID)
			}
		default:
			return inputErr(fmt.Sprintf("messages[%d].role", i), "unknown role %q (want system, developer, user, assistant or tool)", m.Role)
		}
	}
	names := map[string]bool{}
	for i, t := range req.Tools {
		if !validToolName(t.Name) {
			return inputErr(fmt.Sprintf("tools[%d].function.name", i), "function name %q must be 1-%d letters, digits, _ or -", t.Name, maxToolNameLn)
		}
		if names[t.Name] {
			return inputErr(fmt.Sprintf("tools[%d].function.name", i), "function %q is defined twice", t.Name)
		}
		names[t.Name] = true
	}
	switch req.ToolChoice.Mode {
	case "", engine.ToolChoiceAuto, engine.ToolChoiceNone:
	case engine.ToolChoiceRequired:
		if len(req.Tools) == 0 {
			return inputErr("tool_choice", "tool_choice %q needs tools", req.ToolChoice.Mode)
		}
	case engine.ToolChoiceFunction:
		if !names[req.ToolChoice.Name] {
			return inputErr("tool_choice", "tool_choice names function %q, which is not in tools", req.ToolChoice.Name)
		}
	default:
		return inputErr("tool_choice", "unknown tool_choice %q", req.ToolChoice.Mode)
	}
	switch req.ResponseFormat.Type {
	case "", engine.FormatText, engine.FormatJSONObject:
	case engine.FormatJSONSchema:
		if len(req.ResponseFormat.Schema) == 0 {
			return inputErr("response_format", "response_format json_schema needs a schema")
		}
	default:
		return inputErr("response_format", "unknown response_format type %q", req.ResponseFormat.Type)
	}
	if req.MaxTokens < 0 || req.MaxTokens > MaxOutputTokensLimit {
		return inputErr("max_tokens", "max_tokens must be between 1 and %d", MaxOutputTokensLimit)
	}
	if t := req.Temperature; t != nil && (*t < 0 || *t > 2) {
		return inputErr("temperature", "temperature must be between 0 and 2")
	}
	if p := req.TopP; p != nil && (*p <= 0 || *p > 1) {
		return inputErr("top_p", "top_p must be greater than 0 and at most 1")
	}
	if p := req.PresencePenalty; p < -2 || p > 2 {
		return inputErr("presence_penalty", "presence_penalty must be between -2 and 2")
	}
	if p := req.FrequencyPenalty; p < -2 || p > 2 {
		return inputErr("frequency_penalty", "frequency_penalty must be between -2 and 2")
	}
	if len(req.Stop) > MaxStopSequences {
		return inputErr("stop", "at most %d stop sequences", MaxStopSequences)
	}
	for _, s := range req.Stop {
		if s == "" {
			return inputErr("stop", "stop sequences must not be empty")
		}
	}
	return nil
}

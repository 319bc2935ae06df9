package api

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
)

// Chat parameters current OpenAI SDKs and agents send beyond the core
// ones. Each is checked for its type and values; what it does here:
//
//   - reasoning_effort (none, minimal, low, medium, high, xhigh) and
//     verbosity (low, medium, high): accepted and ignored; the local
//     decoders have no reasoning budget or verbosity control.
//   - prompt_cache_key (string, at most 256 bytes): a routing hint, as at
//     OpenAI. Under a prefix strategy, requests sharing a key go to the
//     node that served one of them (its hash is the request's shortest
//     prefix, node/prefix.KeyHash), behind any node holding a longer
//     prefix of the request itself; other strategies ignore it.
//   - safety_identifier (at most 64 characters): accepted and ignored.
//   - modalities: ["text"] only; "audio" output is a 400.
//   - prediction ({"type":"content","content": string or text parts}):
//     accepted and ignored; predicted outputs only speed OpenAI up, the
//     answer is the same without them.
//   - web_search_options ({"search_context_size", "user_location"}):
//     accepted and ignored; local models do not search the web.
//   - functions and function_call, the legacy form of tools and
//     tool_choice: mapped to them (one call per answer), and the answer
//     uses the legacy shape: message.function_call and finish_reason
//     "function_call" (function_call deltas when streaming). Messages may
//     carry an assistant function_call and role "function" answers.

// Bounds of the parameters above.
const (
	maxPromptCacheKey   = 256
	maxSafetyIdentifier = 64
)

// chatFunctionIn is one entry of the legacy functions.
type chatFunctionIn struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// oneOf checks an optional string against its allowed values.
func oneOf(param string, v *string, allowed ...string) error {
	if v == nil || slices.Contains(allowed, *v) {
		return nil
	}
	return apierr.BadRequest(apierr.CodeInvalidValue, param, fmt.Sprintf("'%s' is not one of %q.", *v, allowed))
}

// checkChatExtras validates the parameters above (all but the legacy
// functions, which mapLegacyFunctions takes).
func checkChatExtras(x *chatRequest) error {
	if err := oneOf("reasoning_effort", x.ReasoningEffort, "none", "minimal", "low", "medium", "high", "xhigh"); err != nil {
		return err
	}
	if err := oneOf("verbosity", x.Verbosity, "low", "medium", "high"); err != nil {
		return err
	}
	if x.PromptCacheKey != nil && len(*x.PromptCacheKey) > maxPromptCacheKey {
		return apierr.BadRequest(apierr.CodeInvalidValue, "prompt_cache_key", fmt.Sprintf("'prompt_cache_key' is longer than %d bytes.", maxPromptCacheKey))
	}
	if x.SafetyIdentifier != nil && len(*x.SafetyIdentifier) > maxSafetyIdentifier {
		return apierr.BadRequest(apierr.CodeInvalidValue, "safety_identifier", fmt.Sprintf("'safety_identifier' is longer than %d characters.", maxSafetyIdentifier))
	}
	for i, m := range x.Modalities {
		if m != "text" {
			return apierr.BadRequest(apierr.CodeInvalidValue, fmt.Sprintf("modalities[%d]", i), fmt.Sprintf("Output modality '%s' is not supported; only 'text'.", m))
		}
	}
	if len(x.Prediction) > 0 && string(x.Prediction) != "null" {
		var p struct {
			Type    string          `json:"type"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(x.Prediction, &p); err != nil {
			return apierr.BadRequest(apierr.CodeInvalidType, "prediction", "'prediction' must be an object {\"type\":\"content\",\"content\":...}.")
		}
		if p.Type != "content" {
			return apierr.BadRequest(apierr.CodeInvalidValue, "prediction.type", fmt.Sprintf("'%s' is not one of ['content'].", p.Type))
		}
		var s string
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(p.Content, &s) != nil {
			if err := json.Unmarshal(p.Content, &parts); err != nil || len(parts) == 0 {
				return apierr.BadRequest(apierr.CodeInvalidType, "prediction.content", "'content' must be a string or an array of text parts.")
			}
			for i, part := range parts {
				if part.Type != "text" {
					return apierr.BadRequest(apierr.CodeInvalidValue, fmt.Sprintf("prediction.content[%d].type", i), "Predicted content parts must be of type 'text'.")
				}
			}
		}
	}
	if len(x.WebSearchOptions) > 0 && string(x.WebSearchOptions) != "null" {
		var o struct {
			SearchContextSize *string `json:"search_context_size"`
			UserLocation      *struct {
				Type        string `json:"type"`
				Approximate *struct {
					City     string `json:"city"`
					Country  string `json:"country"`
					Region   string `json:"region"`
					Timezone string `json:"timezone"`
				} `json:"approximate"`
			} `json:"user_location"`
		}
		if err := decodeStrict(x.WebSearchOptions, &o); err != nil {
			return apierr.BadRequest(apierr.CodeInvalidType, "web_search_options", "'web_search_options' must be an object with 'search_context_size' and 'user_location'.")
		}
		if err := oneOf("web_search_options.search_context_size", o.SearchContextSize, "low", "medium", "high"); err != nil {
			return err
		}
		if l := o.UserLocation; l != nil && l.Type != "approximate" {
			return apierr.BadRequest(apierr.CodeInvalidValue, "web_search_options.user_location.type", fmt.Sprintf("'%s' is not one of ['approximate'].", l.Type))
		}
	}
	return nil
}

// mapLegacyFunctions turns functions and function_call into tools and
// tool_choice (in.Tools and in.ToolChoice), one call per answer, and
// reports whether the request used them (the answer is then in the
// legacy shape).
func mapLegacyFunctions(in *chatRequest) (bool, error) {
	if len(in.Functions) == 0 {
		if len(in.FunctionCall) > 0 && string(in.FunctionCall) != "null" {
			return false, apierr.BadRequest(apierr.CodeInvalidValue, "function_call", "'function_call' needs 'functions'.")
		}
		return false, nil
	}
	if len(in.Tools) > 0 || (len(in.ToolChoice) > 0 && string(in.ToolChoice) != "null") {
		return false, apierr.BadRequest(apierr.CodeInvalidValue, "functions", "Use either 'functions' (legacy) or 'tools', not both.")
	}
	for i, f := range in.Functions {
		if f.Name == "" {
			return false, apierr.BadRequest(apierr.CodeMissingParam, fmt.Sprintf("functions[%d].name", i), "A function needs a name.")
		}
		var t chatToolIn
		t.Type = "function"
		t.Function.Name, t.Function.Description, t.Function.Parameters = f.Name, f.Description, f.Parameters
		in.Tools = append(in.Tools, t)
	}
	if len(in.FunctionCall) > 0 && string(in.FunctionCall) != "null" {
		var mode string
		if json.Unmarshal(in.FunctionCall, &mode) == nil {
			if mode != "none" && mode != "auto" {
				return false, apierr.BadRequest(apierr.CodeInvalidValue, "function_call", fmt.Sprintf("'%s' is not one of ['none', 'auto'] or {\"name\": ...}.", mode))
			}
			in.ToolChoice, _ = json.Marshal(mode)
		} else {
			var named struct {
				Name string `json:"name"`
			}
			if err := json.Unmarshal(in.FunctionCall, &named); err != nil || named.Name == "" {
				return false, apierr.BadRequest(apierr.CodeInvalidValue, "function_call", "'function_call' must be 'none', 'auto' or {\"name\": ...}.")
			}
			in.ToolChoice, _ = json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": named.Name}})
		}
	}
	one := false
	in.ParallelToolCalls = &one // a legacy answer holds one call
	return true, nil
}

// mapLegacyMessages rewrites legacy messages in place: an assistant
// function_call becomes a tool call, a role "function" message the tool
// message answering the latest call of that name.
func mapLegacyMessages(msgs []chatMessageIn) error {
	calls := map[string]string{} // function name → id of its latest call
	k := 0
	for i := range msgs {
		m := &msgs[i]
		if m.FunctionCall != nil {
			if m.Role != engine.RoleAssistant {
				return apierr.BadRequest(apierr.CodeInvalidValue, fmt.Sprintf("messages[%d].function_call", i), "Only assistant messages carry a function_call.")
			}
			if m.FunctionCall.Name == "" {
				return apierr.BadRequest(apierr.CodeMissingParam, fmt.Sprintf("messages[%d].function_call.name", i), "A function_call needs a name.")
			}
			var tc toolCallJSON
			tc.ID, tc.Type = engine.LegacyCallID(k), "function"
			tc.Function.Name, tc.Function.Arguments = m.FunctionCall.Name, m.FunctionCall.Arguments
			m.ToolCalls = append(m.ToolCalls, tc)
			calls[m.FunctionCall.Name] = tc.ID
			k++
		}
		if m.Role == "function" {
			id, ok := calls[m.Name]
			if !ok {
				return apierr.BadRequest(apierr.CodeInvalidValue, fmt.Sprintf("messages[%d].name", i), fmt.Sprintf("No earlier assistant function_call names '%s'.", m.Name))
			}
			m.Role, m.ToolCallID = engine.RoleTool, id
		}
	}
	return nil
}

// legacyMessage rewrites an answer's message for a request that used
// functions: tool_calls become function_call (the first, the only one
// asked for).
func legacyMessage(msg map[string]any, calls []engine.ToolCall) {
	delete(msg, "tool_calls")
	if len(calls) > 0 {
		msg["function_call"] = map[string]string{"name": calls[0].Name, "arguments": calls[0].Arguments}
	}
}

// legacyFinish is finish_reason for a legacy request.
func legacyFinish(reason string) string {
	if reason == "tool_calls" {
		return "function_call"
	}
	return reason
}

package api

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
)

// Chat limits: the spec's caps, plus bounds on what one request may carry.
const (
	MaxOutputTokens  = 65536
	MaxChatMessages  = 4096
	MaxChatTools     = 128
	MaxStopSequences = 4
	MaxStopLen       = 256
)

type chatRequest struct {
	Model               string             `json:"model"`
	Messages            []chatMessageIn    `json:"messages"`
	Temperature         *float64           `json:"temperature,omitempty"`
	TopP                *float64           `json:"top_p,omitempty"`
	Seed                *int64             `json:"seed,omitempty"`
	Stop                json.RawMessage    `json:"stop,omitempty"`
	MaxTokens           *int               `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int               `json:"max_completion_tokens,omitempty"`
	PresencePenalty     *float64           `json:"presence_penalty,omitempty"`
	FrequencyPenalty    *float64           `json:"frequency_penalty,omitempty"`
	Stream              bool               `json:"stream,omitempty"`
	StreamOptions       *streamOptions     `json:"stream_options,omitempty"`
	Tools               []chatToolIn       `json:"tools,omitempty"`
	ToolChoice          json.RawMessage    `json:"tool_choice,omitempty"`
	ParallelToolCalls   *bool              `json:"parallel_tool_calls,omitempty"`
	ResponseFormat      *responseFormatIn  `json:"response_format,omitempty"`
	N                   *int               `json:"n,omitempty"`
	Logprobs            *bool              `json:"logprobs,omitempty"`
	TopLogprobs         *int               `json:"top_logprobs,omitempty"`
	User                string             `json:"user,omitempty"`
	Metadata            map[string]string  `json:"metadata,omitempty"`
	Store               *bool              `json:"store,omitempty"`
	ServiceTier         string             `json:"service_tier,omitempty"`
	LogitBias           map[string]float64 `json:"logit_bias,omitempty"`
	// The parameters of chatparams.go.
	ReasoningEffort  *string          `json:"reasoning_effort,omitempty"`
	PromptCacheKey   *string          `json:"prompt_cache_key,omitempty"`
	SafetyIdentifier *string          `json:"safety_identifier,omitempty"`
	Verbosity        *string          `json:"verbosity,omitempty"`
	Modalities       []string         `json:"modalities,omitempty"`
	Prediction       json.RawMessage  `json:"prediction,omitempty"`
	WebSearchOptions json.RawMessage  `json:"web_search_options,omitempty"`
	Functions        []chatFunctionIn `json:"functions,omitempty"`
	FunctionCall     json.RawMessage  `json:"function_call,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessageIn struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content,omitempty"`
	Name       string          `json:"name,omitempty"`
	ToolCalls  []toolCallJSON  `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	Refusal    *string         `json:"refusal,omitempty"`
	// FunctionCall is the legacy form of one tool call (chatparams.go).
	FunctionCall *struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function_call,omitempty"`
}

type toolCallJSON struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatToolIn struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
		Strict      bool            `json:"strict,omitempty"`
	} `json:"function"`
}

type responseFormatIn struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict bool            `json:"strict"`
	} `json:"json_schema,omitempty"`
}

type contentPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	ImageURL *struct {
		URL    string `json:"url"`
		Detail string `json:"detail"`
	} `json:"image_url,omitempty"`
}

// parsedChat is a validated chat request.
type parsedChat struct {
	Model        string
	Req          engine.ChatRequest
	Stream       bool
	IncludeUsage bool
	HasImages    bool
	ImageParam   string
	// Legacy is set when the request used functions: the answer is in
	// the legacy function_call shape.
	Legacy bool
}

// parseChat validates a chat completions body. Checks that need the model
// (image input) happen in the handler.
func parseChat(body []byte) (*parsedChat, error) {
	var in chatRequest
	if err := decodeStrict(body, &in); err != nil {
		return nil, err
	}
	if in.Model == "" {
		return nil, apierr.BadRequest(apierr.CodeMissingParam, "model", "You must provide a model parameter.")
	}
	if len(in.Messages) == 0 {
		return nil, apierr.BadRequest(apierr.CodeMissingParam, "messages", "'messages' must be a non-empty array.")
	}
	if len(in.Messages) > MaxChatMessages {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "messages", fmt.Sprintf("'messages' has more than %d items.", MaxChatMessages))
	}
	if in.N != nil && *in.N != 1 {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "n", "Only n=1 is supported.")
	}
	if (in.Logprobs != nil && *in.Logprobs) || in.TopLogprobs != nil {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "logprobs", "logprobs are not available.")
	}
	if err := checkChatExtras(&in); err != nil {
		return nil, err
	}
	legacy, err := mapLegacyFunctions(&in)
	if err != nil {
		return nil, err
	}
	if err := mapLegacyMessages(in.Messages); err != nil {
		return nil, err
	}
	p := &parsedChat{Model: in.Model, Stream: in.Stream, Legacy: legacy}
	if in.PromptCacheKey != nil {
		p.Req.CacheKey = *in.PromptCacheKey
	}
	if in.StreamOptions != nil {
		if !in.Stream {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "stream_options", "'stream_options' is only allowed when 'stream' is true.")
		}
		p.IncludeUsage = in.StreamOptions.IncludeUsage
	}
	r := &p.Req
	for i, m := range in.Messages {
		msg, images, err := convertMessage(i, m)
		if err != nil {
			return nil, err
		}
		if images && !p.HasImages {
			p.HasImages, p.ImageParam = true, fmt.Sprintf("messages[%d].content", i)
		}
		r.Messages = append(r.Messages, msg)
	}
	switch {
	case in.MaxCompletionTokens != nil:
		if *in.MaxCompletionTokens < 1 || *in.MaxCompletionTokens > MaxOutputTokens {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "max_completion_tokens", fmt.Sprintf("'max_completion_tokens' must be between 1 and %d.", MaxOutputTokens))
		}
		r.MaxTokens = *in.MaxCompletionTokens
	case in.MaxTokens != nil:
		if *in.MaxTokens < 1 || *in.MaxTokens > MaxOutputTokens {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "max_tokens", fmt.Sprintf("'max_tokens' must be between 1 and %d.", MaxOutputTokens))
		}
		r.MaxTokens = *in.MaxTokens
	}
	r.Temperature, r.TopP, r.Seed, r.ParallelToolCalls = in.Temperature, in.TopP, in.Seed, in.ParallelToolCalls
	if in.PresencePenalty != nil {
		r.PresencePenalty = *in.PresencePenalty
	}
	if in.FrequencyPenalty != nil {
		r.FrequencyPenalty = *in.FrequencyPenalty
	}
	stop, err := parseStop(in.Stop)
	if err != nil {
		return nil, err
	}
	r.Stop = stop
	if len(in.Tools) > MaxChatTools {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "tools", fmt.Sprintf("'tools' has more than %d items.", MaxChatTools))
	}
	for i, t := range in.Tools {
		if t.Type != "function" {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, fmt.Sprintf("tools[%d].type", i), "Only tools of type 'function' are supported.")
		}
		if t.Function.Name == "" {
			return nil, apierr.BadRequest(apierr.CodeMissingParam, fmt.Sprintf("tools[%d].function.name", i), "A tool needs a function name.")
		}
		r.Tools = append(r.Tools, engine.Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: t.Function.Parameters, Strict: t.Function.Strict})
	}
	if r.ToolChoice, err = parseToolChoice(in.ToolChoice, len(in.Tools)); err != nil {
		return nil, err
	}
	if f := in.ResponseFormat; f != nil {
		switch f.Type {
		case "text":
			r.ResponseFormat.Type = engine.FormatText
		case "json_object":
			r.ResponseFormat.Type = engine.FormatJSONObject
		case "json_schema":
			if f.JSONSchema == nil || len(f.JSONSchema.Schema) == 0 {
				return nil, apierr.BadRequest(apierr.CodeMissingParam, "response_format.json_schema", "'json_schema' with a 'schema' is required for type 'json_schema'.")
			}
			r.ResponseFormat = engine.ResponseFormat{Type: engine.FormatJSONSchema, Name: f.JSONSchema.Name, Schema: f.JSONSchema.Schema, Strict: f.JSONSchema.Strict}
		default:
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "response_format.type", fmt.Sprintf("'%s' is not one of ['text', 'json_object', 'json_schema'].", f.Type))
		}
	}
	return p, nil
}

// convertMessage maps one OpenAI message; it reports image parts.
func convertMessage(i int, m chatMessageIn) (engine.ChatMessage, bool, error) {
	param := fmt.Sprintf("messages[%d]", i)
	switch m.Role {
	case engine.RoleSystem, engine.RoleDeveloper, engine.RoleUser, engine.RoleAssistant, engine.RoleTool:
	case "":
		return engine.ChatMessage{}, false, apierr.BadRequest(apierr.CodeMissingParam, param+".role", "Each message needs a role.")
	default:
		return engine.ChatMessage{}, false, apierr.BadRequest(apierr.CodeInvalidValue, param+".role", fmt.Sprintf("'%s' is not one of ['system', 'developer', 'user', 'assistant', 'tool'].", m.Role))
	}
	out := engine.ChatMessage{Role: m.Role, Name: m.Name, ToolCallID: m.ToolCallID}
	images := false
	if len(m.Content) > 0 && string(m.Content) != "null" {
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			out.Content = s
		} else {
			var parts []contentPart
			if err := json.Unmarshal(m.Content, &parts); err != nil {
				return out, false, apierr.BadRequest(apierr.CodeInvalidType, param+".content", "'content' must be a string or an array of content parts.")
			}
			var b strings.Builder
			out.Parts = make([]engine.ContentPart, 0, len(parts))
			for j, part := range parts {
				switch part.Type {
				case "text":
					b.WriteString(part.Text)
					out.Parts = append(out.Parts, engine.ContentPart{Text: part.Text})
				case "image_url":
					if part.ImageURL == nil || part.ImageURL.URL == "" {
						return out, false, apierr.BadRequest(apierr.CodeMissingParam, fmt.Sprintf("%s.content[%d].image_url", param, j), "An image_url part needs a url.")
					}
					u, d := part.ImageURL.URL, part.ImageURL.Detail
					if !strings.HasPrefix(u, "https://") && !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "data:image/") {
						return out, false, apierr.BadRequest(apierr.CodeInvalidValue, fmt.Sprintf("%s.content[%d].image_url.url", param, j), "An image URL must be http(s) or a data:image/ URL.")
					}
					if d != "" && d != "auto" && d != "low" && d != "high" {
						return out, false, apierr.BadRequest(apierr.CodeInvalidValue, fmt.Sprintf("%s.content[%d].image_url.detail", param, j), fmt.Sprintf("'%s' is not one of ['auto', 'low', 'high'].", d))
					}
					out.Parts = append(out.Parts, engine.ContentPart{ImageURL: u, Detail: d})
					images = true
				default:
					return out, false, apierr.BadRequest(apierr.CodeInvalidValue, fmt.Sprintf("%s.content[%d].type", param, j), fmt.Sprintf("Content part type '%s' is not supported.", part.Type))
				}
			}
			out.Content = b.String()
			if !images {
				out.Parts = nil // text only: Content says it all
			}
		}
	} else if m.Role != engine.RoleAssistant {
		return out, false, apierr.BadRequest(apierr.CodeMissingParam, param+".content", "This message needs content.")
	}
	if m.Role == engine.RoleTool && m.ToolCallID == "" {
		return out, false, apierr.BadRequest(apierr.CodeMissingParam, param+".tool_call_id", "A tool message needs a tool_call_id.")
	}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, engine.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	return out, images, nil
}

func parseStop(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	var many []string
	if json.Unmarshal(raw, &one) == nil {
		many = []string{one}
	} else if err := json.Unmarshal(raw, &many); err != nil {
		return nil, apierr.BadRequest(apierr.CodeInvalidType, "stop", "'stop' must be a string or an array of strings.")
	}
	if len(many) > MaxStopSequences {
		return nil, apierr.BadRequest(apierr.CodeInvalidValue, "stop", fmt.Sprintf("At most %d stop sequences are allowed.", MaxStopSequences))
	}
	for _, s := range many {
		if s == "" || len(s) > MaxStopLen {
			return nil, apierr.BadRequest(apierr.CodeInvalidValue, "stop", fmt.Sprintf("Stop sequences must be 1 to %d bytes.", MaxStopLen))
		}
	}
	return many, nil
}

func parseToolChoice(raw json.RawMessage, tools int) (engine.ToolChoice, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return engine.ToolChoice{}, nil
	}
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		switch mode {
		case "auto", "none", "required":
			if mode == "required" && tools == 0 {
				return engine.ToolChoice{}, apierr.BadRequest(apierr.CodeInvalidValue, "tool_choice", "tool_choice 'required' needs tools.")
			}
			return engine.ToolChoice{Mode: mode}, nil
		}
		return engine.ToolChoice{}, apierr.BadRequest(apierr.CodeInvalidValue, "tool_choice", fmt.Sprintf("'%s' is not one of ['none', 'auto', 'required'] or a function.", mode))
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Type != "function" || named.Function.Name == "" {
		return engine.ToolChoice{}, apierr.BadRequest(apierr.CodeInvalidValue, "tool_choice", "tool_choice must be 'none', 'auto', 'required' or {\"type\":\"function\",\"function\":{\"name\":...}}.")
	}
	return engine.ToolChoice{Mode: engine.ToolChoiceFunction, Name: named.Function.Name}, nil
}

func newCompletionID() string {
	var b [12]byte
	rand.Read(b[:])
	return "chatcmpl-" + hex.EncodeToString(b[:])
}

func toolCallsJSON(calls []engine.ToolCall) []map[string]any {
	out := make([]map[string]any, len(calls))
	for i, c := range calls {
		out[i] = map[string]any{"id": c.ID, "type": "function", "function": map[string]string{"name": c.Name, "arguments": c.Arguments}}
	}
	return out
}

func usageJSON(u engine.ChatUsage) map[string]int {
	return map[string]int{"prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens, "total_tokens": u.TotalTokens()}
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	p, ok := decodeRequest(w, r, MaxImageBody, parseChat)
	if !ok {
		return
	}
	m, eng, ok := modelEngine(s, w, r, p.Model, s.opt.Backend.Chatter)
	if !ok {
		return
	}
	if ii, ok := eng.(engine.ImageInput); p.HasImages && (!ok || !ii.TakesImages()) {
		apierr.Write(w, apierr.BadRequest(apierr.CodeInvalidValue, p.ImageParam, fmt.Sprintf("Model %s does not take image input.", m.ID)))
		return
	}
	id, created := newCompletionID(), s.opt.Clock().Unix()
	if !p.Stream {
		res, err := eng.Chat(r.Context(), p.Req, nil)
		if err != nil {
			writeErr(w, err)
			return
		}
		if s.opt.ChatServed != nil {
			s.opt.ChatServed(m.ID, p.Req, res.Message)
		}
		reportUsage(w, int64(res.Usage.PromptTokens), int64(res.Usage.CompletionTokens))
		msg := map[string]any{"role": "assistant", "content": nil, "refusal": nil}
		if res.Message.Content != "" || len(res.Message.ToolCalls) == 0 {
			msg["content"] = res.Message.Content
		}
		if len(res.Message.ToolCalls) > 0 {
			msg["tool_calls"] = toolCallsJSON(res.Message.ToolCalls)
		}
		finish := res.FinishReason
		if p.Legacy {
			legacyMessage(msg, res.Message.ToolCalls)
			finish = legacyFinish(finish)
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": id, "object": "chat.completion", "created": created, "model": m.ID,
			"choices":            []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish, "logprobs": nil}},
			"usage":              usageJSON(res.Usage),
			"system_fingerprint": nil,
		})
		return
	}
	sse := newSSE(w)
	chunk := func(delta map[string]any, finish any) map[string]any {
		return map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": m.ID,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": nil}}}
	}
	res, err := eng.Chat(r.Context(), p.Req, func(d engine.ChatDelta) error {
		delta := map[string]any{}
		if d.Role != "" {
			delta["role"] = d.Role
		}
		if d.Content != "" || d.Role != "" {
			delta["content"] = d.Content
		}
		if len(d.ToolCalls) > 0 && p.Legacy {
			fc := map[string]string{"arguments": d.ToolCalls[0].Arguments}
			if d.ToolCalls[0].Name != "" {
				fc["name"] = d.ToolCalls[0].Name
			}
			delta["function_call"] = fc
		} else if len(d.ToolCalls) > 0 {
			calls := make([]map[string]any, len(d.ToolCalls))
			for i, tc := range d.ToolCalls {
				calls[i] = map[string]any{"index": tc.Index, "id": tc.ID, "type": "function",
					"function": map[string]string{"name": tc.Name, "arguments": tc.Arguments}}
			}
			delta["tool_calls"] = calls
		}
		var finish any
		if d.FinishReason != "" {
			finish = d.FinishReason
			if p.Legacy {
				finish = legacyFinish(d.FinishReason)
			}
		}
		return sse.data(chunk(delta, finish))
	})
	if err != nil {
		if !sse.started {
			writeErr(w, err)
			return
		}
		// The head is out: report the failure as an error event and end
		// without [DONE], as OpenAI does.
		sse.data(map[string]any{"error": map[string]any{"message": err.Error(), "type": apierr.TypeServer, "code": apierr.CodeInternal, "param": nil}})
		return
	}
	reportUsage(w, int64(res.Usage.PromptTokens), int64(res.Usage.CompletionTokens))
	if s.opt.ChatServed != nil {
		s.opt.ChatServed(m.ID, p.Req, res.Message)
	}
	if p.IncludeUsage {
		sse.data(map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": m.ID,
			"choices": []any{}, "usage": usageJSON(res.Usage)})
	}
	sse.done()
}

// sse writes a text/event-stream response, flushing after every event.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

func newSSE(w http.ResponseWriter) *sse { return &sse{w: w, rc: http.NewResponseController(w)} }

func (s *sse) head() {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
}

func (s *sse) data(v any) error {
	s.head()
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "data: %s\n\n", b); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sse) done() {
	s.head()
	fmt.Fprint(s.w, "data: [DONE]\n\n")
	s.rc.Flush()
}

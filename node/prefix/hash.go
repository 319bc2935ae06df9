// Package prefix identifies chat conversations by the hashes of their
// message prefixes, remembers the ones this node served, and summarises
// them in the digest the mesh gossips for prefix-aware routing (see
// mesh/route's prefix strategies).
//
// A request's prefix hashes are computed from the request alone, so the
// node where a request enters can compute them without the model or its
// tokenizer: hash k (k = 1..n) covers the canonical model id, the tools and
// messages[0..k). The serving node records the conversation it served
// together with the answer it generated, so the next turn of the
// conversation, which repeats that answer, has a prefix hash the serving
// node's digest holds. Fields that do not change the prompt (stream,
// temperature, max_tokens, ...) are not hashed.
package prefix

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/infermesh/infermesh/node/engine"
)

// domain starts every hash chain, so these hashes never collide with other
// uses of SHA-256 over similar bytes; bump the version when the canonical
// form changes (nodes of both versions then simply miss each other's
// prefixes).
const domain = "infermesh/prefix/v1\n"

// Message is one chat message in the form that is hashed. It mirrors
// engine.ChatMessage: Content holds the text (text parts joined) and Parts
// is set only when the content had an image part.
type Message struct {
	// Role is system, developer, user, assistant or tool.
	Role string `json:"role"`
	// Content is the message text.
	Content string `json:"content,omitempty"`
	// Parts are all content parts in order, only when one is an image.
	Parts []Part `json:"parts,omitempty"`
	// Name is OpenAI's optional participant name.
	Name string `json:"name,omitempty"`
	// ToolCallID is, in a tool message, the call it answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// ToolCalls are an assistant message's function calls.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// Part is one content part: text, or an image URL with its detail level.
type Part struct {
	// Text is a text part's text.
	Text string `json:"text,omitempty"`
	// ImageURL is an image part's URL.
	ImageURL string `json:"image_url,omitempty"`
	// Detail is an image part's detail level, "" when not given.
	Detail string `json:"detail,omitempty"`
}

// ToolCall is one function call of an assistant message.
type ToolCall struct {
	// ID identifies the call.
	ID string `json:"id,omitempty"`
	// Name is the function called.
	Name string `json:"name"`
	// Arguments is the arguments object as JSON text, hashed as given.
	Arguments string `json:"arguments,omitempty"`
}

// Tool is one function the request offers the model; tools are part of
// the prompt, so they are part of every prefix hash.
type Tool struct {
	// Name is the function's name.
	Name string `json:"name"`
	// Description tells the model what the function does.
	Description string `json:"description,omitempty"`
	// Parameters is the arguments' JSON schema, compacted.
	Parameters json.RawMessage `json:"parameters,omitempty"`
	// Strict is OpenAI's function.strict flag.
	Strict bool `json:"strict,omitempty"`
}

// Hashes returns the prefix hashes of a conversation: element k-1 hashes
// model, tools and msgs[0..k). It is a chain, so the hashes of a longer
// conversation start with those of every conversation it extends, and the
// cost is linear in the conversation's size.
func Hashes(model string, tools []Tool, msgs []Message) []uint64 {
	out := make([]uint64, len(msgs))
	h := seed(model, tools)
	for i := range msgs {
		h = step(h, &msgs[i])
		out[i] = binary.BigEndian.Uint64(h[:8])
	}
	return out
}

// KeyHash is the prefix hash of a prompt cache key (OpenAI's
// prompt_cache_key) for model. Every request carrying the key holds it, as
// the shortest of its prefixes, so the node that served one such request
// is preferred for the others, behind a node holding a longer prefix of
// the request itself. Its input differs in form from every chain's seed.
func KeyHash(model, key string) uint64 {
	h := sha256.Sum256([]byte(domain + "prompt_cache_key\n" + model + "\n" + key))
	return binary.BigEndian.Uint64(h[:8])
}

// seed hashes what precedes the messages: the model and the tools.
func seed(model string, tools []Tool) [sha256.Size]byte {
	s := sha256.New()
	s.Write([]byte(domain))
	s.Write(canonical(struct {
		Model string `json:"model"`
		Tools []Tool `json:"tools,omitempty"`
	}{model, normTools(tools)}))
	var h [sha256.Size]byte
	s.Sum(h[:0])
	return h
}

// step extends the chain by one message.
func step(prev [sha256.Size]byte, m *Message) [sha256.Size]byte {
	s := sha256.New()
	s.Write(prev[:])
	s.Write(canonical(m))
	var h [sha256.Size]byte
	s.Sum(h[:0])
	return h
}

// canonical is the JSON of v: struct fields in declaration order, empty
// ones left out, so equal messages give equal bytes.
func canonical(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only strings, bools and compacted raw JSON are marshalled.
		panic(err)
	}
	return b
}

// normTools compacts each tool's parameters, so whitespace in a schema
// does not change the hash; "null" counts as no parameters.
func normTools(tools []Tool) []Tool {
	if len(tools) == 0 {
		return nil
	}
	out := make([]Tool, len(tools))
	for i, t := range tools {
		out[i] = t
		out[i].Parameters = compact(t.Parameters)
	}
	return out
}

func compact(raw []byte) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		// Not JSON: hash the bytes as a JSON string instead.
		s, _ := json.Marshal(string(raw))
		return s
	}
	return b.Bytes()
}

// request is the part of a chat completions body that is hashed.
type request struct {
	Messages []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		Name       string          `json:"name"`
		ToolCallID string          `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
		// FunctionCall is the legacy form of one tool call.
		FunctionCall *struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function_call"`
	} `json:"messages"`
	Tools []struct {
		Function struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      bool            `json:"strict"`
		} `json:"function"`
	} `json:"tools"`
	// PromptCacheKey is OpenAI's cache key (KeyHash).
	PromptCacheKey string `json:"prompt_cache_key"`
	// Functions are the legacy form of tools (used when tools are not).
	Functions []struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"functions"`
}

// ErrNotChat is returned for a body that is not a chat completions request
// with messages.
var ErrNotChat = errors.New("prefix: not a chat request with messages")

// parseRequest reads the tools, messages and prompt cache key of a chat
// completions request body (OpenAI's format) the way the API layer
// converts them into an engine.ChatRequest, so that FromEngine of the
// converted request gives the same hashes; that includes the legacy
// functions (tools when there are none), an assistant function_call (a
// tool call named by engine.LegacyCallID) and role "function" answers
// (tool messages). Unknown and unhashed fields are ignored.
func parseRequest(body []byte) ([]Tool, []Message, string, error) {
	var in request
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, nil, "", fmt.Errorf("%w: %v", ErrNotChat, err)
	}
	if len(in.Messages) == 0 {
		return nil, nil, "", ErrNotChat
	}
	var tools []Tool
	for _, t := range in.Tools {
		tools = append(tools, Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: t.Function.Parameters, Strict: t.Function.Strict})
	}
	if len(in.Tools) == 0 {
		for _, f := range in.Functions {
			tools = append(tools, Tool{Name: f.Name, Description: f.Description, Parameters: f.Parameters})
		}
	}
	msgs := make([]Message, len(in.Messages))
	calls := map[string]string{} // legacy: function name → id of its latest call
	k := 0
	for i, m := range in.Messages {
		out := Message{Role: m.Role, Name: m.Name, ToolCallID: m.ToolCallID}
		if err := content(m.Content, &out); err != nil {
			return nil, nil, "", fmt.Errorf("%w: messages[%d].content: %v", ErrNotChat, i, err)
		}
		for _, tc := range m.ToolCalls {
			out.ToolCalls = append(out.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		// The legacy forms, mapped as the API maps them.
		if fc := m.FunctionCall; fc != nil {
			id := engine.LegacyCallID(k)
			k++
			out.ToolCalls = append(out.ToolCalls, ToolCall{ID: id, Name: fc.Name, Arguments: fc.Arguments})
			calls[fc.Name] = id
		}
		if m.Role == "function" {
			out.Role, out.ToolCallID = engine.RoleTool, calls[m.Name]
		}
		msgs[i] = out
	}
	return tools, msgs, in.PromptCacheKey, nil
}

// content fills m.Content (and m.Parts) from a string, null or an array of
// content parts.
func content(raw json.RawMessage, m *Message) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if json.Unmarshal(raw, &m.Content) == nil {
		return nil
	}
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL *struct {
			URL    string `json:"url"`
			Detail string `json:"detail"`
		} `json:"image_url"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return err
	}
	var text bytes.Buffer
	images := false
	for _, p := range parts {
		switch {
		case p.Type == "text":
			text.WriteString(p.Text)
			m.Parts = append(m.Parts, Part{Text: p.Text})
		case p.Type == "image_url" && p.ImageURL != nil:
			m.Parts = append(m.Parts, Part{ImageURL: p.ImageURL.URL, Detail: p.ImageURL.Detail})
			images = true
		}
	}
	m.Content = text.String()
	if !images {
		m.Parts = nil
	}
	return nil
}

// RequestHashes returns the prefix hashes of a chat completions body for
// the canonical model id (route.Facts.Prefixes), shortest first: the
// cache key's (KeyHash) when the body has a prompt_cache_key, then one per
// message; nil when the body is not a chat request.
func RequestHashes(model string, body []byte) []uint64 {
	tools, msgs, key, err := parseRequest(body)
	if err != nil {
		return nil
	}
	if key != "" {
		return append([]uint64{KeyHash(model, key)}, Hashes(model, tools, msgs)...)
	}
	return Hashes(model, tools, msgs)
}

// FromEngine converts an engine chat request's tools and messages.
func FromEngine(req engine.ChatRequest) ([]Tool, []Message) {
	var tools []Tool
	for _, t := range req.Tools {
		tools = append(tools, Tool{Name: t.Name, Description: t.Description, Parameters: t.Parameters, Strict: t.Strict})
	}
	msgs := make([]Message, len(req.Messages))
	for i, m := range req.Messages {
		msgs[i] = fromEngineMessage(m)
	}
	return tools, msgs
}

func fromEngineMessage(m engine.ChatMessage) Message {
	out := Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
	for _, p := range m.Parts {
		out.Parts = append(out.Parts, Part{Text: p.Text, ImageURL: p.ImageURL, Detail: p.Detail})
	}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments})
	}
	return out
}

// Served returns the hashes to record after this node answered req with
// answer: the prompt (all of req's messages) and the conversation
// including the answer, which is what the next turn's request starts with.
// An answer without a role counts as the assistant's. Record them in that
// order (the answer's hash last, as the most recent).
func Served(model string, req engine.ChatRequest, answer engine.ChatMessage) []uint64 {
	if len(req.Messages) == 0 {
		return nil
	}
	tools, msgs := FromEngine(req)
	if answer.Role == "" {
		answer.Role = engine.RoleAssistant
	}
	all := Hashes(model, tools, append(msgs, fromEngineMessage(answer)))
	if req.CacheKey != "" {
		return append(all[len(all)-2:], KeyHash(model, req.CacheKey))
	}
	return all[len(all)-2:]
}

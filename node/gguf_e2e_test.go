package node_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/infermesh/infermesh/node"
	"github.com/infermesh/infermesh/node/engine/llama/llamatest"
)

const ggufWire = "tiny-gguf:test"

// ggufNode starts an in-process node with the tiny GGUF chat model (or
// none) on the real llama.cpp library.
func ggufNode(t *testing.T, id string, join []string, modelNames ...string) *node.Node {
	t.Helper()
	dir := llamatest.LibDir(t)
	return runNode(t, id, modelNames, func(c *node.Config) {
		c.Join, c.LlamaDir, c.LlamaThreads = join, dir, 1
	})
}

// TestGGUFChatThroughMesh: the official OpenAI Go SDK against a 2-node
// mesh whose GGUF model sits on the other node: plain, streamed (equal to
// plain), greedy, json_schema and a forced tool call, all served by the
// holder through the node the client talks to.
func TestGGUFChatThroughMesh(t *testing.T) {
	a := ggufNode(t, "gguf-a", nil, "tiny-gguf")
	b := ggufNode(t, "gguf-b", []string{a.GossipAddr()})
	waitForModel(t, b, ggufWire)
	c := openai.NewClient(option.WithBaseURL("http://"+b.Addr()+"/v1"), option.WithAPIKey("none"))
	ctx := context.Background()
	user := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me about the weather today.")}

	var resp *http.Response
	plain, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: ggufWire, Messages: user, Seed: openai.Int(7), MaxTokens: openai.Int(24)},
		option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get("X-Service-Backend"); got != "gguf-a" {
		t.Errorf("served by %q, want gguf-a", got)
	}
	if len(plain.Choices) != 1 || plain.Choices[0].Message.Content == "" || plain.Usage.PromptTokens == 0 || plain.Usage.CompletionTokens == 0 {
		t.Fatalf("plain: %+v", plain)
	}
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: ggufWire, Messages: user, Seed: openai.Int(7), MaxTokens: openai.Int(24),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 3 || acc.Choices[0].Message.Content != plain.Choices[0].Message.Content || acc.Usage.CompletionTokens != plain.Usage.CompletionTokens {
		t.Errorf("stream (%d chunks) %q %+v; plain %q %+v", chunks, acc.Choices[0].Message.Content, acc.Usage, plain.Choices[0].Message.Content, plain.Usage)
	}

	schema := map[string]any{"type": "object", "properties": map[string]any{
		"city": map[string]any{"type": "string", "maxLength": 10}, "rain": map[string]any{"type": "boolean"}},
		"required": []string{"city", "rain"}, "additionalProperties": false}
	js, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: ggufWire, Messages: user, Seed: openai.Int(11), MaxTokens: openai.Int(80),
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "weather", Schema: schema, Strict: openai.Bool(true)}}}})
	if err != nil {
		t.Fatal(err)
	}
	var w struct {
		City *string `json:"city"`
		Rain *bool   `json:"rain"`
	}
	if err := jsonUnmarshalStrict(js.Choices[0].Message.Content, &w); err != nil || w.City == nil || w.Rain == nil || utf8.RuneCountInString(*w.City) > 10 {
		t.Fatalf("json_schema answer %q: %v", js.Choices[0].Message.Content, err)
	}

	params := map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}}
	tc, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: ggufWire, Messages: user, Seed: openai.Int(5), MaxTokens: openai.Int(120),
		Tools:      []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_weather", Parameters: params})},
		ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}})
	if err != nil {
		t.Fatal(err)
	}
	if tc.Choices[0].FinishReason != "tool_calls" || len(tc.Choices[0].Message.ToolCalls) != 1 || tc.Choices[0].Message.ToolCalls[0].Function.Name != "get_weather" {
		t.Fatalf("tool call: %+v", tc.Choices[0])
	}
}

// jsonUnmarshalStrict decodes s into v, refusing unknown fields.
func jsonUnmarshalStrict(s string, v any) error {
	d := json.NewDecoder(strings.NewReader(s))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

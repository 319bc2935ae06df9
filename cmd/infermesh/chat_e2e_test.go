package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// TestChatThroughMesh runs chat completions through a node that does not
// hold the model; every answer is forwarded from the node that does.
func TestChatThroughMesh(t *testing.T) {
	a := startMeshNode(t, meshNode{"chat-a", "127.0.12.1", []string{"tiny-llama"}}, "")
	b := startMeshNode(t, meshNode{"chat-b", "127.0.12.2", nil}, "127.0.12.1:17946")
	waitMembers(t, []*proc{a, b}, 2)
	c := b.client()
	ctx := context.Background()
	const model = "tiny-llama:test"
	user := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me about the weather today.")}

	// A plain chat, served by chat-a.
	var resp *http.Response
	plain, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: model, Messages: user, Seed: openai.Int(7), MaxTokens: openai.Int(24),
	}, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("X-Service-Backend") != "chat-a" {
		t.Errorf("served by %q", resp.Header.Get("X-Service-Backend"))
	}
	if len(plain.Choices) != 1 || plain.Choices[0].Message.Content == "" || plain.Usage.PromptTokens == 0 || plain.Usage.CompletionTokens == 0 || plain.Object != "chat.completion" {
		t.Fatalf("plain chat: %+v", plain)
	}

	// A streamed chat through the forwarding node equals the plain one.
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: model, Messages: user, Seed: openai.Int(7), MaxTokens: openai.Int(24),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 3 {
		t.Errorf("only %d chunks: the stream was not streamed", chunks)
	}
	if got, want := acc.Choices[0].Message.Content, plain.Choices[0].Message.Content; got != want {
		t.Errorf("streamed %q, plain %q", got, want)
	}
	if acc.Choices[0].FinishReason != plain.Choices[0].FinishReason || acc.Usage.CompletionTokens != plain.Usage.CompletionTokens {
		t.Errorf("stream finish %q usage %+v; plain %q %+v", acc.Choices[0].FinishReason, acc.Usage, plain.Choices[0].FinishReason, plain.Usage)
	}

	// max_tokens gives finish_reason length.
	short, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: user, Seed: openai.Int(3), MaxTokens: openai.Int(4)})
	if err != nil {
		t.Fatal(err)
	}
	if short.Choices[0].FinishReason != "length" || short.Usage.CompletionTokens != 4 {
		t.Errorf("max_tokens 4: finish %q, %d tokens", short.Choices[0].FinishReason, short.Usage.CompletionTokens)
	}

	// A stop sequence taken from the greedy answer cuts it there.
	greedy, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: user, Temperature: openai.Float(0), MaxTokens: openai.Int(40)})
	if err != nil {
		t.Fatal(err)
	}
	text := greedy.Choices[0].Message.Content
	if len(text) < 12 {
		t.Fatalf("greedy answer too short for a stop test: %q", text)
	}
	stopAt := text[len(text)/2 : len(text)/2+3]
	stopped, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: user, Temperature: openai.Float(0), MaxTokens: openai.Int(40),
		Stop: openai.ChatCompletionNewParamsStopUnion{OfString: openai.String(stopAt)}})
	if err != nil {
		t.Fatal(err)
	}
	if want := text[:strings.Index(text, stopAt)]; stopped.Choices[0].Message.Content != want || stopped.Choices[0].FinishReason != "stop" {
		t.Errorf("stop %q: got %q (%s), want %q", stopAt, stopped.Choices[0].Message.Content, stopped.Choices[0].FinishReason, want)
	}

	// json_schema output validates against its schema.
	schema := map[string]any{"type": "object", "properties": map[string]any{
		"city": map[string]any{"type": "string", "maxLength": 10}, "rain": map[string]any{"type": "boolean"},
		"days": map[string]any{"type": "array", "items": map[string]any{"type": "integer"}, "maxItems": 3}},
		"required": []string{"city", "rain", "days"}, "additionalProperties": false}
	js, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: user, Seed: openai.Int(11), MaxTokens: openai.Int(80),
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "weather", Schema: schema, Strict: openai.Bool(true)}}}})
	if err != nil {
		t.Fatalf("json_schema: %v (%s)", err, rawOf(err))
	}
	validate(t, schema, js.Choices[0].Message.Content)

	// A required tool call's arguments validate against the parameters.
	params := map[string]any{"type": "object", "properties": map[string]any{
		"city": map[string]any{"type": "string"}, "unit": map[string]any{"type": "string", "enum": []string{"celsius", "fahrenheit"}}},
		"required": []string{"city", "unit"}}
	tc, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model, Messages: user, Seed: openai.Int(5), MaxTokens: openai.Int(160),
		Tools:      []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_weather", Parameters: params})},
		ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}})
	if err != nil {
		t.Fatalf("tool call: %v (%s)", err, rawOf(err))
	}
	if tc.Choices[0].FinishReason != "tool_calls" || len(tc.Choices[0].Message.ToolCalls) != 1 {
		t.Fatalf("tool call: %+v", tc.Choices[0])
	}
	call := tc.Choices[0].Message.ToolCalls[0]
	if call.Function.Name != "get_weather" || call.ID == "" {
		t.Fatalf("tool call %+v", call)
	}
	validate(t, params, call.Function.Arguments)

	// The 400s, each naming its parameter.
	bad := []struct {
		name   string
		params openai.ChatCompletionNewParams
		opts   []option.RequestOption
		param  string
	}{
		{"n>1", openai.ChatCompletionNewParams{Model: model, Messages: user, N: openai.Int(2)}, nil, "n"},
		{"logprobs", openai.ChatCompletionNewParams{Model: model, Messages: user, Logprobs: openai.Bool(true)}, nil, "logprobs"},
		{"output cap", openai.ChatCompletionNewParams{Model: model, Messages: user, MaxTokens: openai.Int(65537)}, nil, "max_tokens"},
		{"context cap", openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{
			openai.UserMessage(strings.Repeat("zq ", 3000))}}, nil, "messages"},
		{"image to a text model", openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{
			openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: "data:image/png;base64,iVBORw0KGgo="})})}}, nil, "messages[0].content"},
		{"unknown tool call id", openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{
			openai.UserMessage("hi"), openai.ToolMessage("21 degrees", "call_missing")}}, nil, "messages[1].tool_call_id"},
	}
	for _, tt := range bad {
		_, err := c.Chat.Completions.New(ctx, tt.params, tt.opts...)
		var apierr *openai.Error
		if !errors.As(err, &apierr) || apierr.StatusCode != 400 || apierr.Param != tt.param {
			t.Errorf("%s: %v (param %q)", tt.name, err, paramOf(apierr))
		}
	}
}

func paramOf(e *openai.Error) string {
	if e == nil {
		return ""
	}
	return e.Param
}

func validate(t *testing.T, schema map[string]any, text string) {
	t.Helper()
	c := jsonschema.NewCompiler()
	raw, _ := json.Marshal(schema)
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource("s.json", doc); err != nil {
		t.Fatal(err)
	}
	v, err := c.Compile("s.json")
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("%q is not JSON: %v", text, err)
	}
	if err := v.Validate(inst); err != nil {
		t.Fatalf("%q does not validate: %v", text, err)
	}
}

// rawOf returns the error body of an API error, for failure messages.
func rawOf(err error) string {
	var apierr *openai.Error
	if errors.As(err, &apierr) {
		return apierr.RawJSON()
	}
	return ""
}

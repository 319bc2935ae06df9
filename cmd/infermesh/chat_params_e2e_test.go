//lint:file-ignore SA1019 the legacy functions and function_call are deprecated in the SDK; this file tests that we serve them

package main

import (
	"context"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
)

// The chat parameters current SDKs send, through a node without the model
// to the one that holds it, and the legacy functions answered in their
// own shape. Loopback prefix 127.0.94.x is this file's.
func TestChatCurrentParamsThroughMesh(t *testing.T) {
	a := startMeshNode(t, meshNode{"params-a", "127.0.94.1", []string{"tiny-llama"}}, "")
	b := startMeshNode(t, meshNode{"params-b", "127.0.94.2", nil}, "127.0.94.1:17946")
	waitMembers(t, []*proc{a, b}, 2)
	c := b.client()
	ctx := context.Background()
	const model = "tiny-llama:test"
	user := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Oslo?")}

	// Every current parameter at once.
	res, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: model, Messages: user, Seed: openai.Int(3), MaxCompletionTokens: openai.Int(8),
		ReasoningEffort: shared.ReasoningEffortLow, PromptCacheKey: openai.String("session-42"),
		SafetyIdentifier: openai.String("user-hash"), Verbosity: openai.ChatCompletionNewParamsVerbosityLow,
		Modalities: []string{"text"},
		Prediction: openai.ChatCompletionPredictionContentParam{Content: openai.ChatCompletionPredictionContentContentUnionParam{OfString: openai.String("It is cold.")}},
		WebSearchOptions: openai.ChatCompletionNewParamsWebSearchOptions{SearchContextSize: "low",
			UserLocation: openai.ChatCompletionNewParamsWebSearchOptionsUserLocation{
				Approximate: openai.ChatCompletionNewParamsWebSearchOptionsUserLocationApproximate{City: openai.String("Oslo")}}},
	})
	if err != nil {
		t.Fatalf("current parameters: %v (%s)", err, rawOf(err))
	}
	if res.Choices[0].Message.Content == "" {
		t.Fatalf("empty answer: %+v", res.Choices[0])
	}

	// The legacy functions: the answer is a function_call.
	params := map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}}
	legacy := openai.ChatCompletionNewParams{
		Model: model, Messages: user, Seed: openai.Int(5), MaxTokens: openai.Int(120),
		Functions:    []openai.ChatCompletionNewParamsFunction{{Name: "get_weather", Parameters: params}},
		FunctionCall: openai.ChatCompletionNewParamsFunctionCallUnion{OfFunctionCallOption: &openai.ChatCompletionFunctionCallOptionParam{Name: "get_weather"}},
	}
	fc, err := c.Chat.Completions.New(ctx, legacy)
	if err != nil {
		t.Fatalf("functions: %v (%s)", err, rawOf(err))
	}
	ch := fc.Choices[0]
	if ch.FinishReason != "function_call" || ch.Message.FunctionCall.Name != "get_weather" || len(ch.Message.ToolCalls) != 0 {
		t.Fatalf("functions answered %q with %+v", ch.FinishReason, ch.Message)
	}
	validate(t, params, ch.Message.FunctionCall.Arguments)

	// Streamed, the call arrives as function_call deltas.
	stream := c.Chat.Completions.NewStreaming(ctx, legacy)
	var name, args, finish string
	for stream.Next() {
		for _, sc := range stream.Current().Choices {
			name += sc.Delta.FunctionCall.Name
			args += sc.Delta.FunctionCall.Arguments
			if sc.FinishReason != "" {
				finish = sc.FinishReason
			}
			if len(sc.Delta.ToolCalls) > 0 {
				t.Fatal("a legacy stream carries tool_calls")
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if name != "get_weather" || args != ch.Message.FunctionCall.Arguments || finish != "function_call" {
		t.Fatalf("streamed function_call %q(%s) finish %q; want %q(%s)", name, args, finish, "get_weather", ch.Message.FunctionCall.Arguments)
	}

	// The conversation continues with the function's answer.
	next, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: model, Seed: openai.Int(5), MaxTokens: openai.Int(8),
		Messages: append(user,
			openai.ChatCompletionMessageParamUnion{OfAssistant: &openai.ChatCompletionAssistantMessageParam{
				FunctionCall: openai.ChatCompletionAssistantMessageParamFunctionCall{Name: "get_weather", Arguments: ch.Message.FunctionCall.Arguments}}},
			openai.ChatCompletionMessageParamUnion{OfFunction: &openai.ChatCompletionFunctionMessageParam{Name: "get_weather", Content: openai.String("3 C, snow")}}),
		Functions:    []openai.ChatCompletionNewParamsFunction{{Name: "get_weather", Parameters: params}},
		FunctionCall: openai.ChatCompletionNewParamsFunctionCallUnion{OfFunctionCallMode: openai.String("none")},
	})
	if err != nil {
		t.Fatalf("function answer: %v (%s)", err, rawOf(err))
	}
	if next.Choices[0].Message.Content == "" || next.Choices[0].FinishReason == "function_call" {
		t.Fatalf("after the function's answer: %+v", next.Choices[0])
	}
}

package main

import (
	"context"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
)

// TestChatPrefixCacheThroughAPI: the second turn of a conversation with a
// long system prompt is prefilled from the prefix cache, and the node's
// metrics say so (infermesh_engine_prefix_cache_tokens_total{result="hit"}).
func TestChatPrefixCacheThroughAPI(t *testing.T) {
	p := startNode(t, "chat-cache", "tiny-llama")
	c := p.client()
	ctx := context.Background()
	system := strings.Repeat("You are a careful assistant who answers about the weather in short sentences. ", 8)
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage("What is the weather like?")}
	first, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "tiny-llama:test", Messages: msgs, Seed: openai.Int(1), MaxTokens: openai.Int(8)})
	if err != nil {
		t.Fatal(err)
	}
	msgs = append(msgs, openai.AssistantMessage(first.Choices[0].Message.Content), openai.UserMessage("And tomorrow?"))
	second, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "tiny-llama:test", Messages: msgs, Seed: openai.Int(1), MaxTokens: openai.Int(8)})
	if err != nil {
		t.Fatal(err)
	}
	hits, err := metricSum(p, "infermesh_engine_prefix_cache_tokens_total", `result="hit"`)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second turn: %d prompt tokens, %.0f of them from the prefix cache", second.Usage.PromptTokens, hits)
	if hits < 64 || int64(hits) >= second.Usage.PromptTokens {
		t.Fatalf("prefix cache hit tokens %.0f for a %d-token second turn: want at least one 64-token block and fewer than the prompt", hits, second.Usage.PromptTokens)
	}
}

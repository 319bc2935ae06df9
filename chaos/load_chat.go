package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// chatParams is a short chat request: a few tokens keep the CPU cost low.
func (l *Load) chatParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     openai.ChatModel(l.cfg.ChatModel),
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("chaos " + strconv.FormatInt(l.seq.Add(1), 10) + ": say hello")},
		MaxTokens: openai.Int(int64(l.cfg.ChatTokens)),
	}
}

// chatSDK sends a non-streamed chat completion through the SDK.
func (l *Load) chatSDK(ctx context.Context, entry string) (Response, error) {
	var httpRes *http.Response
	c := l.sdk[entry]
	out, err := c.Chat.Completions.New(ctx, l.chatParams(), option.WithResponseInto(&httpRes))
	res, err := sdkResponse(httpRes, err)
	if err == nil && res.Status/100 == 2 && (out == nil || len(out.Choices) == 0) {
		return res, errors.New("chat answer without choices")
	}
	return res, err
}

// chatStream sends a streamed chat completion and reads it to the end; a
// stream that breaks, or ends without a finish reason, is an error.
func (l *Load) chatStream(ctx context.Context, entry string) (Response, error) {
	var httpRes *http.Response
	c := l.sdk[entry]
	stream := c.Chat.Completions.NewStreaming(ctx, l.chatParams(), option.WithResponseInto(&httpRes))
	defer stream.Close()
	chunks, finished := 0, false
	for stream.Next() {
		chunks++
		for _, ch := range stream.Current().Choices {
			if ch.FinishReason != "" {
				finished = true
			}
		}
	}
	res, err := sdkResponse(httpRes, stream.Err())
	if err == nil && res.Status/100 == 2 && !finished {
		return res, fmt.Errorf("stream ended after %d chunks without a finish reason", chunks)
	}
	return res, err
}

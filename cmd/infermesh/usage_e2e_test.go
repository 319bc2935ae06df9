package main

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// usageTotals is one worker's row of GET /v1/server/usage?by=worker.
type usageTotals struct {
	Requests, Prompt, Completion int64
}

func usageByWorker(p *proc) (map[string]usageTotals, error) {
	var u struct {
		Data []struct {
			Group            string `json:"group"`
			Requests         int64  `json:"requests"`
			PromptTokens     int64  `json:"prompt_tokens"`
			CompletionTokens int64  `json:"completion_tokens"`
		} `json:"data"`
	}
	if code, _, err := adminReq(p, "GET", "/v1/server/usage?by=worker", nil, &u); err != nil || code != 200 {
		return nil, fmt.Errorf("usage: %d %v", code, err)
	}
	out := map[string]usageTotals{}
	for _, r := range u.Data {
		out[r.Group] = usageTotals{r.Requests, r.PromptTokens, r.CompletionTokens}
	}
	return out, nil
}

// TestUsageIsTrueAndNamesTheWorker: chats and embeddings sent to every
// node of a 3-node mesh, where one node holds the chat model, another the
// embedder and the third nothing, are counted with the token usage the
// responses reported, credited to the node that served them, and every
// node's replica shows the same totals.
func TestUsageIsTrueAndNamesTheWorker(t *testing.T) {
	a := startMeshNode(t, meshNode{"use-a", "127.0.70.1", nil}, "")
	b := startMeshNode(t, meshNode{"use-b", "127.0.70.2", []string{"tiny-llama"}}, "127.0.70.1:17946")
	c := startMeshNode(t, meshNode{"use-c", "127.0.70.3", []string{"tiny-bert"}}, "127.0.70.1:17946")
	procs := []*proc{a, b, c}
	waitMembers(t, procs, 3)
	ctx := context.Background()

	want := map[string]usageTotals{}
	count := func(resp *http.Response, prompt, completion int64) {
		w := resp.Header.Get("X-Service-Backend")
		tot := want[w]
		tot.Requests++
		tot.Prompt += prompt
		tot.Completion += completion
		want[w] = tot
	}
	for i, p := range procs {
		cl := p.client()
		for j := range 3 {
			var resp *http.Response
			res, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model:    "tiny-llama:test",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("Question %d from node %d: what is the weather?", j, i))},
				Seed:     openai.Int(int64(i*10 + j)), MaxTokens: openai.Int(int64(5 + 3*j)),
			}, option.WithResponseInto(&resp))
			if err != nil {
				t.Fatal(err)
			}
			count(resp, res.Usage.PromptTokens, res.Usage.CompletionTokens)
		}
		// A stream reports its usage in the last chunk.
		var resp *http.Response
		stream := cl.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:    "tiny-llama:test",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Stream me a short answer.")},
			Seed:     openai.Int(int64(i)), MaxTokens: openai.Int(9),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		}, option.WithResponseInto(&resp))
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		count(resp, acc.Usage.PromptTokens, acc.Usage.CompletionTokens)
		for j := range 2 {
			var resp *http.Response
			res, err := cl.Embeddings.New(ctx, openai.EmbeddingNewParams{
				Model: "tiny-bert:test-128",
				Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"first text", fmt.Sprintf("a longer second text number %d", j)}},
			}, option.WithResponseInto(&resp))
			if err != nil {
				t.Fatal(err)
			}
			count(resp, res.Usage.PromptTokens, 0)
		}
	}
	if len(want) != 2 || want["use-b"].Completion == 0 || want["use-c"].Prompt == 0 {
		t.Fatalf("requests were not served by use-b and use-c: %+v", want)
	}
	t.Logf("sum of the responses' usage by serving node: %+v", want)
	for _, p := range procs {
		eventually(t, 20*time.Second, "usage by worker on "+p.addr, func() error {
			got, err := usageByWorker(p)
			if err != nil {
				return err
			}
			for w, tot := range want {
				if got[w] != tot {
					return fmt.Errorf("worker %s: usage %+v, the responses sum to %+v (all rows %+v)", w, got[w], tot, got)
				}
			}
			if r, ok := got["use-a"]; ok {
				return fmt.Errorf("use-a served nothing but is credited %+v", r)
			}
			return nil
		})
	}
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	ollama "github.com/ollama/ollama/api"
	"github.com/openai/openai-go/v3"

	"github.com/infermesh/infermesh/node/engine/upstream/upstreamtest"
)

// legacyClient is Ollama's official client for a node's legacy port.
func legacyClient(addr string) *ollama.Client {
	return ollama.NewClient(&url.URL{Scheme: "http", Host: addr}, &http.Client{})
}

func expectStatus(t *testing.T, err error, status int, contains string) {
	t.Helper()
	var se ollama.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("want an Ollama status error %d, got %v", status, err)
	}
	if se.StatusCode != status || !strings.Contains(se.ErrorMessage, contains) {
		t.Fatalf("got %d %q; want %d with %q", se.StatusCode, se.ErrorMessage, status, contains)
	}
}

// TestLegacyOllamaClient drives the legacy port with Ollama's Go client
// and checks each answer against the /v1 call it maps onto.
func TestLegacyOllamaClient(t *testing.T) {
	const legacyAddr = "127.0.21.1:11434"
	p := startNodeArgs(t, "legacy", []string{"tiny-llama", "tiny-bert"}, "--listen", "127.0.21.1:0", "--gossip-listen", "127.0.21.1:0",
		"--rpc-listen", "127.0.21.1:0", "--legacy-listen", legacyAddr, "--legacy-end-date", "2999-12-31", "--legacy-allow-pull")
	cl := legacyClient(legacyAddr)
	v1 := p.client()
	ctx := context.Background()
	if err := cl.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}

	// tags (and /api/models) list the node's models by wire id.
	tags, err := cl.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range tags.Models {
		names = append(names, m.Name)
		if m.Model != m.Name || m.Size <= 0 || m.Details.Format != "onnx" || m.ModifiedAt.IsZero() || len(m.Digest) != 64 {
			t.Errorf("tag %+v", m)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"tiny-bert:test-128", "tiny-llama:test"}) {
		t.Fatalf("tags %v", names)
	}
	resp, err := http.Get("http://" + legacyAddr + "/api/models")
	if err != nil {
		t.Fatal(err)
	}
	var models ollama.ListResponse
	json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if len(models.Models) != 2 {
		t.Errorf("/api/models: %+v", models)
	}

	// show
	show, err := cl.Show(ctx, &ollama.ShowRequest{Model: "tiny-llama:test"})
	if err != nil {
		t.Fatal(err)
	}
	if show.Details.Family != "tiny-llama" || show.ModelInfo["infermesh.id"] != "onnx/tiny-llama/test" || !slices.Contains(show.Capabilities, "completion") {
		t.Errorf("show %+v", show)
	}
	_, err = cl.Show(ctx, &ollama.ShowRequest{Model: "no-such-model"})
	expectStatus(t, err, 404, "no-such-model:latest")

	// chat, streamed, equals the /v1 answer for the same seed.
	const prompt = "Tell me about the weather today."
	opts := map[string]any{"seed": 7, "num_predict": 24, "temperature": 0.7}
	var pieces []string
	var last ollama.ChatResponse
	err = cl.Chat(ctx, &ollama.ChatRequest{Model: "tiny-llama:test", Messages: []ollama.Message{{Role: "user", Content: prompt}}, Options: opts},
		func(r ollama.ChatResponse) error {
			if !r.Done {
				pieces = append(pieces, r.Message.Content)
			}
			last = r
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	want, err := v1.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "tiny-llama:test", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		Seed: openai.Int(7), MaxTokens: openai.Int(24), Temperature: openai.Float(0.7)})
	if err != nil {
		t.Fatal(err)
	}
	if len(pieces) < 3 {
		t.Errorf("chat came in %d pieces: not streamed", len(pieces))
	}
	if got := strings.Join(pieces, ""); got != want.Choices[0].Message.Content || got == "" {
		t.Errorf("streamed chat %q, /v1 %q", got, want.Choices[0].Message.Content)
	}
	if !last.Done || last.DoneReason != want.Choices[0].FinishReason || last.EvalCount != int(want.Usage.CompletionTokens) ||
		last.PromptEvalCount != int(want.Usage.PromptTokens) || last.Model != "tiny-llama:test" || last.TotalDuration <= 0 {
		t.Errorf("final chunk %+v", last)
	}

	// generate (one user message), streamed and not.
	var gen strings.Builder
	var gdone ollama.GenerateResponse
	err = cl.Generate(ctx, &ollama.GenerateRequest{Model: "tiny-llama:test", Prompt: prompt, Options: opts}, func(r ollama.GenerateResponse) error {
		gen.WriteString(r.Response)
		gdone = r
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if gen.String() != want.Choices[0].Message.Content || !gdone.Done {
		t.Errorf("generate %q, /v1 %q", gen.String(), want.Choices[0].Message.Content)
	}
	short := 0
	err = cl.Generate(ctx, &ollama.GenerateRequest{Model: "tiny-llama:test", Prompt: prompt, Stream: new(bool), Options: map[string]any{"seed": 3, "num_predict": 4}},
		func(r ollama.GenerateResponse) error {
			short++
			if !r.Done || r.DoneReason != "length" || r.EvalCount != 4 || r.Response == "" {
				t.Errorf("num_predict 4: %+v", r)
			}
			return nil
		})
	if err != nil || short != 1 {
		t.Fatalf("unstreamed generate: %d answers, %v", short, err)
	}

	// A JSON schema as format is enforced.
	schema := map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string", "maxLength": 10},
		"rain": map[string]any{"type": "boolean"}}, "required": []string{"city", "rain"}, "additionalProperties": false}
	raw, _ := json.Marshal(schema)
	err = cl.Chat(ctx, &ollama.ChatRequest{Model: "tiny-llama:test", Messages: []ollama.Message{{Role: "user", Content: prompt}}, Stream: new(bool),
		Format: raw, Options: map[string]any{"seed": 11, "num_predict": 80}}, func(r ollama.ChatResponse) error {
		validate(t, schema, r.Message.Content)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// embed and embeddings equal /v1 embeddings.
	texts := []string{"hello world", "another text"}
	emb, err := cl.Embed(ctx, &ollama.EmbedRequest{Model: "tiny-bert:test-128", Input: texts})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := v1.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "tiny-bert:test-128", Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: texts}})
	if err != nil {
		t.Fatal(err)
	}
	if len(emb.Embeddings) != 2 || emb.Model != "tiny-bert:test-128" || emb.PromptEvalCount != int(ref.Usage.PromptTokens) {
		t.Fatalf("embed %d vectors, model %q, prompt %d", len(emb.Embeddings), emb.Model, emb.PromptEvalCount)
	}
	for i := range texts {
		if len(emb.Embeddings[i]) != 128 {
			t.Fatalf("vector %d has %d dimensions", i, len(emb.Embeddings[i]))
		}
		for j, x := range emb.Embeddings[i] {
			if float64(x) != float64(float32(ref.Data[i].Embedding[j])) {
				t.Fatalf("embed vector %d differs from /v1 at %d", i, j)
			}
		}
	}
	cut, err := cl.Embed(ctx, &ollama.EmbedRequest{Model: "tiny-bert:test-128", Input: "hello world", Dimensions: 32})
	if err != nil || len(cut.Embeddings) != 1 || len(cut.Embeddings[0]) != 32 {
		t.Fatalf("embed with dimensions: %v %v", cut, err)
	}
	old, err := cl.Embeddings(ctx, &ollama.EmbeddingRequest{Model: "tiny-bert:test-128", Prompt: "hello world"})
	if err != nil || len(old.Embedding) != 128 || old.Embedding[5] != ref.Data[0].Embedding[5] {
		t.Fatalf("embeddings: %d dims, %v", len(old.Embedding), err)
	}

	// pull maps onto POST /v1/models/pull: an installed model streams its
	// status lines to success; a model nobody knows is 404.
	var statuses []string
	err = cl.Pull(ctx, &ollama.PullRequest{Model: "tiny-llama:test"}, func(p ollama.ProgressResponse) error {
		statuses = append(statuses, p.Status)
		return nil
	})
	if err != nil || len(statuses) < 2 || statuses[0] != "pulling onnx/tiny-llama/test" || statuses[len(statuses)-1] != "success" {
		t.Fatalf("pull: %v %q", err, statuses)
	}
	err = cl.Pull(ctx, &ollama.PullRequest{Model: "nope:1b"}, func(ollama.ProgressResponse) error { return nil })
	expectStatus(t, err, 404, "nope:1b")
	err = cl.Chat(ctx, &ollama.ChatRequest{Model: "nope:1b", Messages: []ollama.Message{{Role: "user", Content: "hi"}}}, func(ollama.ChatResponse) error { return nil })
	expectStatus(t, err, 404, "nope:1b")
}

// TestLegacyToolsAndEndDate runs tool calls through the legacy port to an
// upstream provider, and checks a node past its legacy end date.
func TestLegacyToolsAndEndDate(t *testing.T) {
	prov := upstreamtest.NewProvider(t, "")
	providers := writeProviders(t, map[string]any{"providers": []any{map[string]any{"name": "acme", "base_url": prov.URL(),
		"models": []any{map[string]any{"model": "Echo-Chat"}}}}})
	const open, ended = "127.0.21.2:11434", "127.0.21.3:11434"
	startNodeArgs(t, "legacy-tools", nil, "--listen", "127.0.21.2:0", "--gossip-listen", "127.0.21.2:0", "--rpc-listen", "127.0.21.2:0",
		"--providers", providers, "--legacy-listen", open, "--legacy-end-date", "2999-12-31")
	startNodeArgs(t, "legacy-ended", nil, "--listen", "127.0.21.3:0", "--gossip-listen", "127.0.21.3:0", "--rpc-listen", "127.0.21.3:0",
		"--legacy-listen="+ended, "--legacy-end-date", "2020-01-01")
	ctx := context.Background()

	// Without --legacy-allow-pull a keyless legacy caller cannot make the
	// node download anything.
	perr := legacyClient(open).Pull(ctx, &ollama.PullRequest{Model: "tiny-llama:test"}, func(ollama.ProgressResponse) error { return nil })
	var serr ollama.StatusError
	if !errors.As(perr, &serr) || serr.StatusCode != http.StatusForbidden {
		t.Fatalf("legacy pull without --legacy-allow-pull: %v, want 403", perr)
	}

	var tools ollama.Tools
	json.Unmarshal([]byte(`[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},
		{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`), &tools)
	msgs := []ollama.Message{{Role: "user", Content: "weather?"}}
	for _, stream := range []bool{true, false} {
		var calls []ollama.ToolCall
		var last ollama.ChatResponse
		err := legacyClient(open).Chat(ctx, &ollama.ChatRequest{Model: "acme:Echo-Chat", Messages: msgs, Tools: tools, Stream: &stream},
			func(r ollama.ChatResponse) error {
				calls = append(calls, r.Message.ToolCalls...)
				last = r
				return nil
			})
		if err != nil {
			t.Fatal(err)
		}
		if !last.Done || last.DoneReason != "stop" {
			t.Errorf("stream=%v: final %+v", stream, last)
		}
		if len(calls) != 2 || calls[1].Function.Name != "get_time" {
			t.Fatalf("stream=%v: %d tool calls %+v", stream, len(calls), calls)
		}
		if city, _ := calls[0].Function.Arguments.Get("city"); calls[0].Function.Name != "get_weather" || city != "Oslo" {
			t.Errorf("stream=%v: call %+v", stream, calls[0])
		}
	}
	if body, _ := prov.Last(); body["model"] != "Echo-Chat" || len(body["tools"].([]any)) != 2 {
		t.Errorf("provider request %v", body)
	}

	// A tool answer goes back with the id of the call it answers.
	args := ollama.NewToolCallFunctionArguments()
	args.Set("city", "Oslo")
	history := append(msgs, ollama.Message{Role: "assistant", ToolCalls: []ollama.ToolCall{{Function: ollama.ToolCallFunction{Name: "get_weather", Arguments: args}}}},
		ollama.Message{Role: "tool", ToolName: "get_weather", Content: "rain"}, ollama.Message{Role: "user", Content: "thanks"})
	var answer string
	err := legacyClient(open).Chat(ctx, &ollama.ChatRequest{Model: "acme:Echo-Chat", Messages: history}, func(r ollama.ChatResponse) error {
		answer += r.Message.Content
		return nil
	})
	if err != nil || answer != "echo: thanks" {
		t.Fatalf("answer %q, %v", answer, err)
	}
	body, _ := prov.Last()
	sent := body["messages"].([]any)
	call := sent[1].(map[string]any)["tool_calls"].([]any)[0].(map[string]any)
	if sent[2].(map[string]any)["tool_call_id"] != call["id"] || call["function"].(map[string]any)["arguments"] != `{"city":"Oslo"}` {
		t.Errorf("history sent as %v", sent)
	}

	// Past the end date every call is 410 and names its replacement.
	err = legacyClient(ended).Chat(ctx, &ollama.ChatRequest{Model: "x:y", Messages: msgs}, func(ollama.ChatResponse) error { return nil })
	expectStatus(t, err, http.StatusGone, "POST /v1/chat/completions")
	_, err = legacyClient(ended).List(ctx)
	expectStatus(t, err, http.StatusGone, "GET /v1/models")
	_, err = legacyClient(ended).Embed(ctx, &ollama.EmbedRequest{Model: "x:y", Input: "a"})
	expectStatus(t, err, http.StatusGone, "POST /v1/embeddings")
}

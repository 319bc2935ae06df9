package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/infermesh/infermesh/node/engine/upstream/upstreamtest"
)

// writeProviders writes a providers file for the test and returns its path.
func writeProviders(t *testing.T, cfg map[string]any) string {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "providers.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// waitModel polls a node's /v1/models until it lists id, owned by owner
// (the runtime: "upstream", "onnx").
func waitModel(t *testing.T, p *proc, id, owner string) {
	t.Helper()
	c := p.client()
	deadline := time.Now().Add(30 * time.Second)
	for {
		page, err := c.Models.List(context.Background())
		if err == nil {
			for _, m := range page.Data {
				if m.ID == id {
					if m.OwnedBy != owner {
						t.Fatalf("%s owned by %q", id, m.OwnedBy)
					}
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never lists %s (last error %v)", p.id, id, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestUpstreamProviderThroughMesh configures a provider on one node and
// calls its models through the other with the OpenAI SDK.
func TestUpstreamProviderThroughMesh(t *testing.T) {
	const key = "sk-e2e-provider-key-42"
	prov := upstreamtest.NewProvider(t, key)
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	providers := writeProviders(t, map[string]any{"providers": []any{
		map[string]any{"name": "acme", "base_url": prov.URL(), "api_key_file": keyFile, "timeout": "60s", "models": []any{
			map[string]any{"model": "Echo-Chat"},
			map[string]any{"model": "eyes", "image_input": true},
			map[string]any{"model": "painter", "task": "image-generation"},
			map[string]any{"model": "embed-8", "task": "embeddings", "dimensions": 8, "truncatable_dimensions": true},
			map[string]any{"model": "bad-params"},
			map[string]any{"model": "broken"},
		}},
		map[string]any{"name": "gone", "base_url": "http://" + closedAddr(t) + "/v1", "models": []any{map[string]any{"model": "m"}}},
	}})
	a := startMeshNode(t, meshNode{"up-a", "127.0.20.1", nil}, "", "--providers", providers)
	b := startMeshNode(t, meshNode{"up-b", "127.0.20.2", nil}, "127.0.20.1:17946")
	waitMembers(t, []*proc{a, b}, 2)
	for _, id := range []string{"upstream/acme/echo-chat", "upstream/acme/embed-8", "upstream/acme/eyes", "upstream/acme/painter", "upstream/gone/m"} {
		waitModel(t, b, id, "upstream")
	}
	c := b.client()
	ctx := context.Background()
	user := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello through the mesh")}

	// A plain chat by wire id, served by up-a from the provider.
	var resp *http.Response
	plain, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "acme:Echo-Chat", Messages: user, Temperature: openai.Float(0.2)},
		option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get("X-Service-Backend"); got != "up-a" {
		t.Errorf("served by %q", got)
	}
	if plain.Model != "upstream/acme/echo-chat" || plain.Choices[0].Message.Content != "echo: hello through the mesh" ||
		plain.Choices[0].FinishReason != "stop" || plain.Usage.CompletionTokens != 5 || plain.Usage.PromptTokens != 4 {
		t.Fatalf("plain chat %+v", plain)
	}
	body, auth := prov.Last()
	if body["model"] != "Echo-Chat" || body["temperature"] != 0.2 || auth != "Bearer "+key {
		t.Errorf("the provider got model %v temperature %v auth %q", body["model"], body["temperature"], auth)
	}

	// A streamed chat by canonical id, chunk by chunk through the mesh.
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "upstream/acme/echo-chat", Messages: user,
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
	if chunks < 5 || acc.Choices[0].Message.Content != plain.Choices[0].Message.Content || acc.Choices[0].FinishReason != "stop" || acc.Usage.CompletionTokens != 5 {
		t.Errorf("stream: %d chunks, %q, finish %q, usage %+v", chunks, acc.Choices[0].Message.Content, acc.Choices[0].FinishReason, acc.Usage)
	}
	if body, _ := prov.Last(); body["stream"] != true {
		t.Errorf("the provider was not asked to stream: %v", body)
	}

	// Embeddings, in input order, with and without dimensions.
	texts := []string{"one", "two words", "and three words"}
	for _, dims := range []int64{0, 4} {
		params := openai.EmbeddingNewParams{Model: "acme:embed-8", Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: texts}}
		want := 8
		if dims > 0 {
			params.Dimensions, want = openai.Int(dims), int(dims)
		}
		emb, err := c.Embeddings.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if emb.Model != "upstream/acme/embed-8" || len(emb.Data) != len(texts) || emb.Usage.PromptTokens != 6 {
			t.Fatalf("embeddings %+v", emb)
		}
		for i, d := range emb.Data {
			v := upstreamtest.Vector(texts[i], want)
			if len(d.Embedding) != want {
				t.Fatalf("vector %d has %d dimensions, want %d", i, len(d.Embedding), want)
			}
			for j := range v {
				if d.Embedding[j] != float64(v[j]) {
					t.Fatalf("vector %d = %v, want %v", i, d.Embedding, v)
				}
			}
		}
	}
	_, err = c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "acme:embed-8", Dimensions: openai.Int(9),
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}})
	expectAPIError(t, err, 400, "invalid_value", "dimensions")

	// Image requests pass through: images generated by the provider's image
	// model, as base64 PNGs or URLs, and a chat with an image part to a
	// model configured for image input (a model without it refuses).
	imgs, err := c.Images.Generate(ctx, openai.ImageGenerateParams{Model: "acme:painter", Prompt: "a lighthouse at dusk", N: openai.Int(2),
		Size: openai.ImageGenerateParamsSize("256x256"), ResponseFormat: openai.ImageGenerateParamsResponseFormatB64JSON}, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	wantPNG := base64.StdEncoding.EncodeToString(upstreamtest.Image("a lighthouse at dusk"))
	if len(imgs.Data) != 2 || imgs.Data[0].B64JSON != wantPNG || imgs.Data[1].RevisedPrompt != "revised: a lighthouse at dusk" || resp.Header.Get("X-Service-Backend") != "up-a" {
		t.Fatalf("images %+v from %q", imgs, resp.Header.Get("X-Service-Backend"))
	}
	if png, err := base64.StdEncoding.DecodeString(imgs.Data[1].B64JSON); err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("image 1 is not a PNG: %v", err)
	}
	if body, _ := prov.Last(); body["model"] != "painter" || body["size"] != "256x256" || body["n"] != 2.0 {
		t.Errorf("the provider got %v", body)
	}
	_, err = c.Images.Generate(ctx, openai.ImageGenerateParams{Model: "upstream/acme/painter", Prompt: "x", ResponseFormat: openai.ImageGenerateParamsResponseFormatURL})
	expectAPIError(t, err, 400, "invalid_value", "response_format")
	_, err = c.Images.Generate(ctx, openai.ImageGenerateParams{Model: "acme:painter", Prompt: "x", N: openai.Int(5)})
	expectAPIError(t, err, 400, "invalid_value", "n")
	_, err = c.Images.Generate(ctx, openai.ImageGenerateParams{Model: "acme:Echo-Chat", Prompt: "x"})
	expectAPIError(t, err, 400, "model_not_supported", "model")
	// Operations beyond text to image are refused with the reason; the
	// provider never sees them.
	const pixel = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
	before := prov.Requests()
	_, err = c.Images.Generate(ctx, openai.ImageGenerateParams{Model: "acme:painter", Prompt: "x"},
		option.WithJSONSet("operation", "upscale"), option.WithJSONSet("upscale_factor", 2), option.WithJSONSet("image", pixel))
	t.Logf("upscale on a provider image model: %v", err)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 {
		t.Fatalf("upscale on a provider image model: %v, want a 400", err)
	}
	if prov.Requests() != before {
		t.Error("an unsupported operation reached the provider")
	}
	seeing := []openai.ChatCompletionMessageParamUnion{openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{
		openai.TextContentPart("what is in"),
		openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: pixel, Detail: "low"}),
	})}
	seen, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "acme:eyes", Messages: seeing})
	if err != nil {
		t.Fatal(err)
	}
	if seen.Choices[0].Message.Content != "echo: what is in [image]" {
		t.Errorf("image chat answer %q", seen.Choices[0].Message.Content)
	}
	if body, _ := prov.Last(); body["model"] != "eyes" {
		t.Errorf("the provider got %v", body)
	} else if parts, _ := body["messages"].([]any)[0].(map[string]any)["content"].([]any); len(parts) != 2 ||
		parts[1].(map[string]any)["image_url"].(map[string]any)["url"] != pixel {
		t.Errorf("the provider got parts %v", parts)
	}
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "acme:Echo-Chat", Messages: seeing})
	expectAPIError(t, err, 400, "invalid_value", "messages[0].content")

	// The provider's 4xx passes through with its message, param and code,
	// streamed or not.
	n := prov.Requests()
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "acme:bad-params", Messages: user})
	expectAPIError(t, err, 400, "invalid_value", "temperature")
	var apierr *openai.Error
	if errors.As(err, &apierr) && apierr.Message != "temperature is out of range for this model" {
		t.Errorf("message %q", apierr.Message)
	}
	st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "acme:bad-params", Messages: user})
	for st.Next() {
	}
	expectAPIError(t, st.Err(), 400, "invalid_value", "temperature")
	if got := prov.Requests() - n; got != 2 {
		t.Errorf("the provider got %d requests for two 4xx calls; a 4xx must not be retried", got)
	}

	// Its outages are retryable statuses: a 500 from the provider, and a
	// provider nobody listens for.
	for _, tc := range []struct{ model, code string }{{"acme:broken", "upstream_unavailable"}, {"gone:m", "upstream_unavailable"}} {
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: tc.model, Messages: user})
		if !errors.As(err, &apierr) {
			t.Fatalf("%s: %v", tc.model, err)
		}
		if s := apierr.StatusCode; (s != 502 && s != 503 && s != 504) || apierr.Code != tc.code {
			t.Errorf("%s: %d %q (%s); want a retryable status", tc.model, s, apierr.Code, apierr.Message)
		}
	}
}

package upstream

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/upstream/upstreamtest"
)

const testKey = "sk-test-secret-0123456789"

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// registry builds a registry for one provider at url with the given models.
func registry(t *testing.T, url string, timeout string, models ...ModelConfig) *Registry {
	t.Helper()
	r, err := New(Config{Providers: []ProviderConfig{{Name: "acme", BaseURL: url, APIKeyEnv: "ACME_KEY", Timeout: timeout, Models: models}}},
		Options{Getenv: env(map[string]string{"ACME_KEY": testKey})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func chatter(t *testing.T, r *Registry, id string) engine.Chatter {
	t.Helper()
	e, ok := r.Engine(id)
	if !ok {
		t.Fatalf("no engine %s", id)
	}
	c, ok := e.(engine.Chatter)
	if !ok {
		t.Fatalf("%s is not a chat engine", id)
	}
	return c
}

func TestConfigIDsAndValidation(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"providers":[{"name":"vllm","base_url":"http://127.0.0.1:8000/v1/","models":[
		{"model":"Qwen/Qwen2.5-0.5B-Instruct"},{"model":"BAAI/bge-small-en-v1.5","task":"embeddings","dimensions":384}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got [][3]string
	for _, m := range r.Models() {
		got = append(got, [3]string{m.ID, m.WireID, string(m.Task)})
	}
	want := [][3]string{
		{"upstream/vllm/baai-bge-small-en-v1.5", "vllm:BAAI/bge-small-en-v1.5", "embeddings"},
		{"upstream/vllm/qwen-qwen2.5-0.5b-instruct", "vllm:Qwen/Qwen2.5-0.5B-Instruct", "chat"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("models %v, want %v", got, want)
	}
	for _, id := range []string{"upstream/vllm/qwen-qwen2.5-0.5b-instruct", "vllm:Qwen/Qwen2.5-0.5B-Instruct"} {
		if e, ok := r.Engine(id); !ok || e.ID() != "upstream/vllm/qwen-qwen2.5-0.5b-instruct" {
			t.Errorf("engine %s: %v %v", id, e, ok)
		}
	}
	if emb, _ := r.Engine("vllm:BAAI/bge-small-en-v1.5"); emb.(engine.Embedder).MaxDimensions() != 384 || emb.(engine.Embedder).TruncatableDimensions() {
		t.Errorf("embedder dimensions: %d %v", emb.(engine.Embedder).MaxDimensions(), emb.(engine.Embedder).TruncatableDimensions())
	}
	if SanitizeID("..Llama 3.1:8B!") != "llama-3.1-8b-" {
		t.Errorf("SanitizeID: %q", SanitizeID("..Llama 3.1:8B!"))
	}
	var nilReg *Registry
	if nilReg.Models() != nil {
		t.Error("a nil registry lists models")
	}
	if _, ok := nilReg.Engine("x"); ok {
		t.Error("a nil registry has engines")
	}

	keyFile := filepath.Join(t.TempDir(), "key")
	os.WriteFile(keyFile, []byte("  \n"), 0o600)
	bad := []struct {
		json, want string
	}{
		{`{"providers":[{"name":"Bad Name","base_url":"http://x/v1","models":[{"model":"m"}]}]}`, "name:"},
		{`{"providers":[{"name":"a","base_url":"ftp://x","models":[{"model":"m"}]}]}`, "base_url"},
		{`{"providers":[{"name":"a","base_url":"http://x/v1","api_key_env":"A","api_key_file":"/f","models":[{"model":"m"}]}]}`, "not both"},
		{`{"providers":[{"name":"a","base_url":"http://x/v1","api_key_env":"UNSET_VAR","models":[{"model":"m"}]}]}`, "UNSET_VAR is unset"},
		{`{"providers":[{"name":"a","base_url":"http://x/v1","api_key_file":"` + keyFile + `","models":[{"model":"m"}]}]}`, "is empty"},
		{`{"providers":[{"name":"a","base_url":"http://x/v1","timeout":"soon","models":[{"model":"m"}]}]}`, "timeout"},
		{`{"providers":[{"name":"a","base_url":"http://x/v1","models":[]}]}`, "at least one model"},
		{`{"providers":[{"name":"a","base_url":"http://x/v1","models":[{"model":"m","task":"vision"}]}]}`, "task"},
		{`{"providers":[{"name":"a","base_url":"http://x/v1","models":[{"model":"M"},{"model":"m"}]}]}`, "also the id"},
		{`{"providers":[{"name":"a","base_url":"http://x/v1","models":[{"model":"m"}]},{"name":"a","base_url":"http://y/v1","models":[{"model":"n"}]}]}`, "used twice"},
		{`{"providers":[{"name":"a","base_url":"http://x/v1","models":[{"model":"m","colour":"red"}]}]}`, "unknown field"},
		{`{"providers":[{"name":"a","base_url":"http://x/v1","models":[{"model":"m","task":"embeddings","image_input":true}]}]}`, "image_input is for chat"},
	}
	for _, tt := range bad {
		cfg, err := ParseConfig([]byte(tt.json))
		if err == nil {
			_, err = New(cfg, Options{})
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want an error with %q", tt.json, err, tt.want)
		}
	}
}

func TestChatRequestAndResponse(t *testing.T) {
	d := upstreamtest.NewProvider(t, testKey)
	r := registry(t, d.URL(), "", ModelConfig{Model: "Tiny-Chat:1b"})
	c := chatter(t, r, "acme:Tiny-Chat:1b")
	if c.ID() != "upstream/acme/tiny-chat-1b" {
		t.Fatalf("id %s", c.ID())
	}
	temp, seed := 0.5, int64(42)
	req := engine.ChatRequest{
		Messages:       []engine.ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hello there"}},
		MaxTokens:      20,
		Temperature:    &temp,
		Seed:           &seed,
		Stop:           []string{"\n"},
		ResponseFormat: engine.ResponseFormat{Type: engine.FormatJSONSchema, Name: "out", Schema: []byte(`{"type":"object"}`), Strict: true},
	}
	res, err := c.Chat(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Message.Content != "echo: hello there" || res.FinishReason != "stop" || res.Usage.PromptTokens != 2 || res.Usage.CompletionTokens != 3 {
		t.Fatalf("response %+v", res)
	}
	body, auth := d.Last()
	if auth != "Bearer "+testKey {
		t.Errorf("authorization %q", auth)
	}
	if body["model"] != "Tiny-Chat:1b" || body["max_tokens"] != 20.0 || body["temperature"] != 0.5 || body["seed"] != 42.0 || body["stream"] != nil {
		t.Errorf("request body %v", body)
	}
	rf, _ := body["response_format"].(map[string]any)
	js, _ := rf["json_schema"].(map[string]any)
	if rf["type"] != "json_schema" || js["name"] != "out" || js["strict"] != true || !reflect.DeepEqual(js["schema"], map[string]any{"type": "object"}) {
		t.Errorf("response_format %v", rf)
	}
	if !reflect.DeepEqual(body["stop"], []any{"\n"}) {
		t.Errorf("stop %v", body["stop"])
	}

	// Tools, tool_choice and an assistant tool call in the history.
	req = engine.ChatRequest{
		Messages: []engine.ChatMessage{{Role: "user", Content: "weather?"},
			{Role: "assistant", ToolCalls: []engine.ToolCall{{ID: "call_0", Name: "get_weather", Arguments: `{"city":"Rome"}`}}},
			{Role: "tool", ToolCallID: "call_0", Content: "sunny"}, {Role: "user", Content: "and Oslo?"}},
		Tools:      []engine.Tool{{Name: "get_weather", Parameters: []byte(`{"type":"object","properties":{"city":{"type":"string"}}}`)}},
		ToolChoice: engine.ToolChoice{Mode: engine.ToolChoiceFunction, Name: "get_weather"},
	}
	res, err = c.Chat(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.FinishReason != "tool_calls" || len(res.Message.ToolCalls) != 1 || res.Message.ToolCalls[0] != (engine.ToolCall{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Oslo"}`}) {
		t.Fatalf("tool response %+v", res)
	}
	body, _ = d.Last()
	msgs := body["messages"].([]any)
	asst := msgs[1].(map[string]any)
	if asst["content"] != nil || asst["tool_calls"].([]any)[0].(map[string]any)["id"] != "call_0" || msgs[2].(map[string]any)["tool_call_id"] != "call_0" {
		t.Errorf("history %v", msgs)
	}
	tc := body["tool_choice"].(map[string]any)
	if tc["function"].(map[string]any)["name"] != "get_weather" {
		t.Errorf("tool_choice %v", tc)
	}
}

func TestChatStream(t *testing.T) {
	d := upstreamtest.NewProvider(t, testKey)
	r := registry(t, d.URL(), "", ModelConfig{Model: "m"})
	c := chatter(t, r, "upstream/acme/m")
	var deltas []engine.ChatDelta
	req := engine.ChatRequest{Messages: []engine.ChatMessage{{Role: "user", Content: "one two three"}}}
	res, err := c.Chat(context.Background(), req, func(d engine.ChatDelta) error {
		deltas = append(deltas, d)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(deltas) < 5 || deltas[0].Role != "assistant" {
		t.Fatalf("deltas %+v", deltas)
	}
	var text strings.Builder
	for i, d := range deltas {
		if i > 0 && d.Role != "" {
			t.Errorf("delta %d repeats the role", i)
		}
		text.WriteString(d.Content)
	}
	if text.String() != "echo: one two three" || res.Message.Content != text.String() {
		t.Errorf("streamed %q, result %q", text.String(), res.Message.Content)
	}
	if last := deltas[len(deltas)-1]; last.FinishReason != "stop" || res.FinishReason != "stop" {
		t.Errorf("finish %q / %q", last.FinishReason, res.FinishReason)
	}
	if res.Usage != (engine.ChatUsage{PromptTokens: 3, CompletionTokens: 4}) {
		t.Errorf("usage %+v", res.Usage)
	}
	body, _ := d.Last()
	if body["stream"] != true || body["stream_options"].(map[string]any)["include_usage"] != true {
		t.Errorf("stream request %v", body)
	}

	// Tool call fragments are sent whole, once each, in order.
	deltas = nil
	req.Tools = []engine.Tool{{Name: "get_weather"}, {Name: "get_time"}}
	res, err = c.Chat(context.Background(), req, func(d engine.ChatDelta) error {
		deltas = append(deltas, d)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var calls []engine.ToolCallDelta
	for _, d := range deltas {
		calls = append(calls, d.ToolCalls...)
	}
	want := []engine.ToolCallDelta{
		{Index: 0, ToolCall: engine.ToolCall{ID: "call_0", Name: "get_weather", Arguments: `{"city":"Oslo"}`}},
		{Index: 1, ToolCall: engine.ToolCall{ID: "call_1", Name: "get_time", Arguments: `{"city":"Oslo"}`}},
	}
	if !reflect.DeepEqual(calls, want) {
		t.Errorf("tool call deltas %+v", calls)
	}
	if res.FinishReason != "tool_calls" || len(res.Message.ToolCalls) != 2 || deltas[len(deltas)-1].FinishReason != "tool_calls" {
		t.Errorf("tool stream result %+v", res)
	}

	// An error from onDelta stops the stream and is returned.
	stop := errors.New("client went away")
	_, err = c.Chat(context.Background(), engine.ChatRequest{Messages: req.Messages}, func(engine.ChatDelta) error { return stop })
	if !errors.Is(err, stop) {
		t.Errorf("onDelta error: %v", err)
	}
}

// providerError asserts err is a ProviderError with status and code.
func providerError(t *testing.T, err error, status int, code string) *engine.ProviderError {
	t.Helper()
	var pe *engine.ProviderError
	if !errors.As(err, &pe) {
		t.Fatalf("want a provider error %d %s, got %v", status, code, err)
	}
	if pe.Status != status || pe.Code != code {
		t.Fatalf("got %d %q (%s), want %d %q", pe.Status, pe.Code, pe.Message, status, code)
	}
	return pe
}

func TestProviderErrors(t *testing.T) {
	d := upstreamtest.NewProvider(t, testKey)
	models := []ModelConfig{{Model: "bad-params"}, {Model: "rate-limited"}, {Model: "broken"}, {Model: "overloaded"}, {Model: "hang"}, {Model: "cut-off"}, {Model: "m"}}
	r := registry(t, d.URL(), "300ms", models...)
	req := engine.ChatRequest{Messages: []engine.ChatMessage{{Role: "user", Content: "hi"}}}
	ctx := context.Background()
	for _, stream := range []bool{false, true} {
		var on func(engine.ChatDelta) error
		if stream {
			on = func(engine.ChatDelta) error { return nil }
		}
		_, err := chatter(t, r, "acme:bad-params").Chat(ctx, req, on)
		pe := providerError(t, err, 400, "invalid_value")
		if pe.Param != "temperature" || pe.Type != apierr.TypeInvalidRequest || pe.Message != "temperature is out of range for this model" {
			t.Errorf("400 passed as %+v", pe)
		}
		_, err = chatter(t, r, "acme:rate-limited").Chat(ctx, req, on)
		if pe := providerError(t, err, 429, "rate_limit_exceeded"); pe.RetryAfter != 7 {
			t.Errorf("429 Retry-After %d", pe.RetryAfter)
		}
		_, err = chatter(t, r, "acme:broken").Chat(ctx, req, on)
		if pe := providerError(t, err, 502, apierr.CodeUpstreamUnavailable); !strings.Contains(pe.Message, "the GPU fell over") {
			t.Errorf("500 message %q", pe.Message)
		}
		_, err = chatter(t, r, "acme:overloaded").Chat(ctx, req, on)
		if pe := providerError(t, err, 503, apierr.CodeUpstreamUnavailable); pe.RetryAfter != 3 {
			t.Errorf("503 Retry-After %d", pe.RetryAfter)
		}
		_, err = chatter(t, r, "acme:hang").Chat(ctx, req, on)
		providerError(t, err, 504, apierr.CodeUpstreamTimeout)
	}
	// A stream that breaks off before it finishes is an outage.
	_, err := chatter(t, r, "acme:cut-off").Chat(ctx, req, func(engine.ChatDelta) error { return nil })
	providerError(t, err, 502, apierr.CodeUpstreamUnavailable)

	// The caller's own cancellation is not a provider error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := chatter(t, r, "acme:m").Chat(cctx, req, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}

	// A wrong key is the operator's problem: 502, and the key is not quoted.
	wrong, err := New(Config{Providers: []ProviderConfig{{Name: "acme", BaseURL: d.URL(), APIKeyEnv: "K", Models: []ModelConfig{{Model: "m"}}}}},
		Options{Getenv: env(map[string]string{"K": "sk-wrong-key-987"})})
	if err != nil {
		t.Fatal(err)
	}
	_, err = chatter(t, wrong, "acme:m").Chat(ctx, req, nil)
	if pe := providerError(t, err, 502, apierr.CodeUpstreamAuth); strings.Contains(pe.Message, "987") || strings.Contains(pe.Error(), "987") {
		t.Errorf("the key leaked: %q", pe.Error())
	}

	// A provider that is not there at all.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	down := registry(t, "http://"+addr+"/v1", "", ModelConfig{Model: "m"}, ModelConfig{Model: "e", Task: "embeddings"})
	_, err = chatter(t, down, "acme:m").Chat(ctx, req, nil)
	providerError(t, err, http.StatusBadGateway, apierr.CodeUpstreamUnavailable)
	emb, _ := down.Engine("acme:e")
	_, err = emb.(engine.Embedder).Embed(ctx, engine.EmbedRequest{Texts: []string{"x"}})
	providerError(t, err, http.StatusBadGateway, apierr.CodeUpstreamUnavailable)
}

func TestEmbeddings(t *testing.T) {
	d := upstreamtest.NewProvider(t, testKey)
	r := registry(t, d.URL(), "", ModelConfig{Model: "emb", Task: "embeddings", Dimensions: 8, TruncatableDimensions: true},
		ModelConfig{Model: "short", Task: "embeddings"}, ModelConfig{Model: "bad-params", Task: "embeddings"})
	e, _ := r.Engine("acme:emb")
	emb := e.(engine.Embedder)
	texts := []string{"a b", "hello world again", "zzz"}
	res, err := emb.Embed(context.Background(), engine.EmbedRequest{Texts: texts, Dimensions: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i, text := range texts {
		if !reflect.DeepEqual(res.Vectors[i], upstreamtest.Vector(text, 4)) {
			t.Errorf("vector %d = %v, want %v", i, res.Vectors[i], upstreamtest.Vector(text, 4))
		}
	}
	if res.PromptTokens != 6 {
		t.Errorf("prompt tokens %d", res.PromptTokens)
	}
	body, _ := d.Last()
	if body["model"] != "emb" || body["dimensions"] != 4.0 || body["encoding_format"] != "float" {
		t.Errorf("request %v", body)
	}
	res, err = emb.Embed(context.Background(), engine.EmbedRequest{Tokens: [][]int64{{1, 2, 3}, {4}}})
	if err != nil || len(res.Vectors) != 2 || res.Vectors[0][0] != 3 || res.Vectors[1][0] != 1 {
		t.Errorf("token input: %v %v", res.Vectors, err)
	}
	if body, _ := d.Last(); !reflect.DeepEqual(body["input"], []any{[]any{1.0, 2.0, 3.0}, []any{4.0}}) {
		t.Errorf("token input sent as %v", body["input"])
	}
	short, _ := r.Engine("acme:short")
	_, err = short.(engine.Embedder).Embed(context.Background(), engine.EmbedRequest{Texts: texts})
	providerError(t, err, 502, apierr.CodeUpstreamBadResponse)
	if short.(engine.Embedder).MaxDimensions() < 1<<20 || !short.(engine.Embedder).TruncatableDimensions() {
		t.Error("a model without configured dimensions should leave dimensions to the provider")
	}
	bad, _ := r.Engine("acme:bad-params")
	_, err = bad.(engine.Embedder).Embed(context.Background(), engine.EmbedRequest{Texts: texts})
	if pe := providerError(t, err, 400, "invalid_value"); pe.Param != "temperature" {
		t.Errorf("param %q", pe.Param)
	}
}

func TestKeyFromFile(t *testing.T) {
	d := upstreamtest.NewProvider(t, testKey)
	path := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(path, []byte(testKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	r, err := New(Config{Providers: []ProviderConfig{{Name: "filed", BaseURL: d.URL(), APIKeyFile: path, Models: []ModelConfig{{Model: "m"}}}}},
		Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "provider=filed") || strings.Contains(log.String(), testKey) {
		t.Errorf("log %q", log.String())
	}
	if _, err := chatter(t, r, "filed:m").Chat(context.Background(), engine.ChatRequest{Messages: []engine.ChatMessage{{Role: "user", Content: "x"}}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, auth := d.Last(); auth != "Bearer "+testKey {
		t.Errorf("authorization %q", auth)
	}
}

// TestChatImageParts: a message with image parts reaches the provider as
// OpenAI content parts, in order, with the detail; a text-only message
// stays a plain string.
func TestChatImageParts(t *testing.T) {
	d := upstreamtest.NewProvider(t, testKey)
	r := registry(t, d.URL(), "", ModelConfig{Model: "eyes", ImageInput: true}, ModelConfig{Model: "blind"})
	c := chatter(t, r, "acme:eyes")
	if !c.(engine.ImageInput).TakesImages() || chatter(t, r, "acme:blind").(engine.ImageInput).TakesImages() {
		t.Fatal("image_input not reflected by TakesImages")
	}
	const img = "data:image/png;base64,iVBORw0KGgo="
	res, err := c.Chat(context.Background(), engine.ChatRequest{Messages: []engine.ChatMessage{
		{Role: "system", Content: "describe"},
		{Role: "user", Content: "what is this", Parts: []engine.ContentPart{{Text: "what is"}, {ImageURL: img, Detail: "low"}, {Text: "this"}}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Message.Content != "echo: what is [image] this" {
		t.Fatalf("answer %q", res.Message.Content)
	}
	body, _ := d.Last()
	msgs := body["messages"].([]any)
	if s, ok := msgs[0].(map[string]any)["content"].(string); !ok || s != "describe" {
		t.Fatalf("text-only message sent as %v", msgs[0])
	}
	parts, ok := msgs[1].(map[string]any)["content"].([]any)
	if !ok || len(parts) != 3 {
		t.Fatalf("image message sent as %v", msgs[1])
	}
	im := parts[1].(map[string]any)
	iu, _ := im["image_url"].(map[string]any)
	if im["type"] != "image_url" || iu["url"] != img || iu["detail"] != "low" || parts[2].(map[string]any)["text"] != "this" {
		t.Fatalf("parts %v", parts)
	}
}

// TestImageGeneration: the provider's images come back as given (base64
// PNGs or URLs), options left empty are not sent, and the provider's
// errors keep their status and param.
func TestImageGeneration(t *testing.T) {
	d := upstreamtest.NewProvider(t, testKey)
	r := registry(t, d.URL(), "", ModelConfig{Model: "painter", Task: "image-generation"}, ModelConfig{Model: "bad-params", Task: "image-generation"})
	e, _ := r.Engine("acme:painter")
	gen, ok := e.(engine.ImageGenerator)
	if !ok || e.ID() != "upstream/acme/painter" {
		t.Fatalf("engine %T %s", e, e.ID())
	}
	if m := r.Models(); m[1].Task != engine.TaskImageGeneration {
		t.Fatalf("models %+v", m)
	}
	res, err := gen.GenerateImages(context.Background(), engine.ImageRequest{Prompt: "a red fox", N: 2, Size: "256x256"})
	if err != nil {
		t.Fatal(err)
	}
	want := base64.StdEncoding.EncodeToString(upstreamtest.Image("a red fox"))
	if len(res.Images) != 2 || res.Images[0].B64JSON != want || res.Images[1].RevisedPrompt != "revised: a red fox" || res.Created != 1700000000 {
		t.Fatalf("result %+v", res)
	}
	body, auth := d.Last()
	if body["model"] != "painter" || body["size"] != "256x256" || body["n"] != 2.0 || auth != "Bearer "+testKey {
		t.Fatalf("request %v %q", body, auth)
	}
	for _, k := range []string{"quality", "style", "response_format", "user"} {
		if _, sent := body[k]; sent {
			t.Fatalf("empty option %s was sent: %v", k, body)
		}
	}
	res, err = gen.GenerateImages(context.Background(), engine.ImageRequest{Prompt: "x", N: 1, ResponseFormat: "url"})
	if err != nil || len(res.Images) != 1 || res.Images[0].URL != "https://images.invalid/0.png" || res.Images[0].B64JSON != "" {
		t.Fatalf("url result %+v %v", res, err)
	}
	// A model that refuses response_format is asked again without it.
	r2 := registry(t, d.URL(), "", ModelConfig{Model: "b64-only", Task: "image-generation"})
	only, _ := r2.Engine("acme:b64-only")
	n := d.Requests()
	res, err = only.(engine.ImageGenerator).GenerateImages(context.Background(), engine.ImageRequest{Prompt: "y", N: 1, ResponseFormat: "b64_json"})
	if err != nil || len(res.Images) != 1 || res.Images[0].B64JSON == "" || d.Requests()-n != 2 {
		t.Fatalf("b64-only model: %+v %v after %d requests", res, err, d.Requests()-n)
	}
	if body, _ := d.Last(); body["response_format"] != nil {
		t.Fatalf("second request still had response_format: %v", body)
	}
	bad, _ := r.Engine("acme:bad-params")
	_, err = bad.(engine.ImageGenerator).GenerateImages(context.Background(), engine.ImageRequest{Prompt: "x", N: 1})
	var pe *engine.ProviderError
	if !errors.As(err, &pe) || pe.Status != 400 || pe.Param != "temperature" {
		t.Fatalf("provider error %v", err)
	}
}

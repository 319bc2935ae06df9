package onnx

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/infermesh/infermesh/node/engine"
)

// genTinyLlama runs testdata/models/gen_tiny_llama.py into a temporary
// directory and returns it.
func genTinyLlama(tb testing.TB, variant string) string {
	return genModel(tb, "gen_tiny_llama.py", "--variant", variant)
}

// manifestSpec reads a generated manifest into a Spec.
func manifestSpec(tb testing.TB, dir string) engine.Spec {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var m struct {
		ID      string            `json:"id"`
		Task    string            `json:"task"`
		Files   map[string]string `json:"files"`
		Options map[string]string `json:"options"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		tb.Fatal(err)
	}
	return engine.Spec{ID: m.ID, Task: engine.Task(m.Task), Dir: dir, Files: m.Files, Options: m.Options}
}

// loadTinyLlama generates the model and loads it on a fresh runtime.
func loadTinyLlama(tb testing.TB, variant string, cfg Config) (*Runtime, *decoder) {
	tb.Helper()
	r := testRuntime(tb, cfg)
	c, err := r.LoadChat(manifestSpec(tb, genTinyLlama(tb, variant)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return r, c.(*decoder)
}

func seed(v int64) *int64                   { return &v }
func temp(v float64) *float64               { return &v }
func userMsg(s string) []engine.ChatMessage { return []engine.ChatMessage{{Role: "user", Content: s}} }

func TestDecoderSignature(t *testing.T) {
	_, d := loadTinyLlama(t, "fp32", Config{})
	if d.layers != 2 || d.kvHeads != 2 || d.headDim != 16 || d.vocabRows%64 != 0 || !d.positions || d.branch {
		t.Fatalf("layers %d kv %d head %d vocab %d positions %v branch %v", d.layers, d.kvHeads, d.headDim, d.vocabRows, d.positions, d.branch)
	}
	if d.ContextWindow() != 2048 || d.MaxOutputTokens() != 1024 || d.ID() != "onnx/tiny-llama/test" {
		t.Fatalf("window %d output %d id %s", d.ContextWindow(), d.MaxOutputTokens(), d.ID())
	}
	if d.model.Template.Builtin() != "" {
		t.Fatal("the model's own template must render")
	}
}

// TestKVCacheMatchesFullRun checks the cache handling against the model
// itself: logits after feeding tokens one at a time (present -> past)
// equal those of one run over the whole sequence, and of a prefill cut
// into small chunks.
func TestKVCacheMatchesFullRun(t *testing.T) {
	for _, variant := range []string{"fp32", "int8"} {
		t.Run(variant, func(t *testing.T) {
			_, d := loadTinyLlama(t, variant, Config{})
			ids, err := d.model.Tok.EncodeContent("<|im_start|>user\nWhat is the weather like in Paris today?<|im_end|>\n<|im_start|>assistant\n")
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			whole, err := d.newStream(len(ids))
			if err != nil {
				t.Fatal(err)
			}
			defer whole.close()
			want, err := whole.Forward(ctx, ids)
			if err != nil {
				t.Fatal(err)
			}
			want = append([]float32(nil), want...)

			step, _ := d.newStream(len(ids))
			defer step.close()
			step.chunk = 3 // prefill in chunks of 3, then one by one
			if _, err := step.Forward(ctx, ids[:10]); err != nil {
				t.Fatal(err)
			}
			var got []float32
			for _, id := range ids[10:] {
				if got, err = step.Forward(ctx, []int64{id}); err != nil {
					t.Fatal(err)
				}
			}
			worst, scale := 0.0, 0.0
			for i := range want {
				worst = max(worst, math.Abs(float64(want[i]-got[i])))
				scale = max(scale, math.Abs(float64(want[i])))
			}
			tol := 1e-4
			if variant == "int8" {
				// Activations are quantised per run with the run's own
				// range, so one-token runs round differently.
				tol = 0.05 * scale
			}
			if worst > tol {
				t.Fatalf("incremental logits differ from the full run by %g", worst)
			}
			if step.past != len(ids) {
				t.Fatalf("cache holds %d positions, want %d", step.past, len(ids))
			}
		})
	}
}

func chatOnce(t *testing.T, c engine.Chatter, req engine.ChatRequest) engine.ChatResponse {
	t.Helper()
	resp, err := c.Chat(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestChatSeedDeterminismAndStreaming(t *testing.T) {
	_, d := loadTinyLlama(t, "fp32", Config{})
	req := engine.ChatRequest{Messages: userMsg("Tell me a story about the sea."), MaxTokens: 40, Seed: seed(7), Temperature: temp(0.8)}
	a := chatOnce(t, d, req)
	b := chatOnce(t, d, req)
	if a.Message.Content != b.Message.Content || a.Message.Content == "" {
		t.Fatalf("same seed, different answers:\n%q\n%q", a.Message.Content, b.Message.Content)
	}
	req.Seed = seed(8)
	if c := chatOnce(t, d, req); c.Message.Content == a.Message.Content {
		t.Fatalf("seeds 7 and 8 gave the same 40 tokens %q", a.Message.Content)
	}
	req.Seed = seed(7)
	var deltas []engine.ChatDelta
	streamed, err := d.Chat(context.Background(), req, func(dl engine.ChatDelta) error {
		deltas = append(deltas, dl)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	for _, dl := range deltas {
		sb.WriteString(dl.Content)
	}
	if sb.String() != a.Message.Content || streamed.Message.Content != a.Message.Content {
		t.Fatalf("streamed %q, want %q", sb.String(), a.Message.Content)
	}
	if deltas[0].Role != engine.RoleAssistant || deltas[len(deltas)-1].FinishReason != a.FinishReason {
		t.Fatalf("first delta %+v, last %+v", deltas[0], deltas[len(deltas)-1])
	}
	if a.Usage.PromptTokens == 0 || a.Usage.CompletionTokens == 0 || a.Usage.CompletionTokens > 40 {
		t.Fatalf("usage %+v", a.Usage)
	}
	// Greedy decoding needs no seed.
	g1 := chatOnce(t, d, engine.ChatRequest{Messages: userMsg("hi"), MaxTokens: 20, Temperature: temp(0)})
	g2 := chatOnce(t, d, engine.ChatRequest{Messages: userMsg("hi"), MaxTokens: 20, Temperature: temp(0), Seed: seed(99)})
	if g1.Message.Content != g2.Message.Content {
		t.Fatal("greedy output depends on the seed")
	}
}

func TestChatMaxTokensAndStop(t *testing.T) {
	_, d := loadTinyLlama(t, "fp32", Config{})
	req := engine.ChatRequest{Messages: userMsg("Count with me."), MaxTokens: 6, Seed: seed(3)}
	resp := chatOnce(t, d, req)
	if resp.FinishReason != engine.FinishLength || resp.Usage.CompletionTokens != 6 {
		t.Fatalf("max_tokens 6: finish %q, %d tokens", resp.FinishReason, resp.Usage.CompletionTokens)
	}
	req.MaxTokens = 60
	full := chatOnce(t, d, req).Message.Content
	// A stop string from the middle of the answer, cut at runes; the answer
	// must end right before its first occurrence.
	runes := []rune(full)
	if len(runes) < 30 {
		t.Fatalf("answer too short for the test: %q", full)
	}
	stop := string(runes[15:19])
	req.Stop = []string{stop}
	cut := chatOnce(t, d, req)
	if want := full[:strings.Index(full, stop)]; cut.Message.Content != want || cut.FinishReason != engine.FinishStop {
		t.Fatalf("stop %q: got %q (%s), want %q", stop, cut.Message.Content, cut.FinishReason, want)
	}
	var streamed strings.Builder
	if _, err := d.Chat(context.Background(), req, func(dl engine.ChatDelta) error {
		streamed.WriteString(dl.Content)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if streamed.String() != cut.Message.Content {
		t.Fatalf("streamed with stop %q, want %q", streamed.String(), cut.Message.Content)
	}
}

func TestChatJSONObjectParses(t *testing.T) {
	_, d := loadTinyLlama(t, "fp32", Config{})
	for s := range int64(6) {
		resp := chatOnce(t, d, engine.ChatRequest{Messages: userMsg("Reply in JSON."), MaxTokens: 48, Seed: seed(s), ResponseFormat: engine.ResponseFormat{Type: engine.FormatJSONObject}})
		var v map[string]any
		if err := json.Unmarshal([]byte(resp.Message.Content), &v); err != nil || resp.FinishReason != engine.FinishStop {
			t.Fatalf("seed %d: %q (%s) is not a JSON object: %v", s, resp.Message.Content, resp.FinishReason, err)
		}
	}
}

func schemaValidator(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("s.json", doc); err != nil {
		t.Fatal(err)
	}
	v, err := c.Compile("s.json")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func mustValidate(t *testing.T, v *jsonschema.Schema, text string) {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("%q does not parse: %v", text, err)
	}
	if err := v.Validate(inst); err != nil {
		t.Fatalf("%q does not validate: %v", text, err)
	}
}

func TestChatJSONSchemaValidates(t *testing.T) {
	_, d := loadTinyLlama(t, "fp32", Config{})
	schema := `{"type":"object","properties":{"city":{"type":"string","maxLength":12},"temperature":{"type":"number"},"rain":{"type":"boolean"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"array","items":{"type":"integer"},"maxItems":3},"note":{"type":["string","null"]}},"required":["city","temperature","rain","unit","days","note"],"additionalProperties":false}`
	v := schemaValidator(t, schema)
	for s := range int64(5) {
		req := engine.ChatRequest{Messages: userMsg("Weather as JSON."), MaxTokens: 120, Seed: seed(s),
			ResponseFormat: engine.ResponseFormat{Type: engine.FormatJSONSchema, Name: "weather", Schema: []byte(schema), Strict: true}}
		resp := chatOnce(t, d, req)
		mustValidate(t, v, resp.Message.Content)
		if resp.FinishReason != engine.FinishStop {
			t.Fatalf("finish %q", resp.FinishReason)
		}
	}
	// Too small a budget for the shortest valid answer is the caller's error.
	_, err := d.Chat(context.Background(), engine.ChatRequest{Messages: userMsg("x"), MaxTokens: 5,
		ResponseFormat: engine.ResponseFormat{Type: engine.FormatJSONSchema, Schema: []byte(schema)}}, nil)
	var ie *engine.InputError
	if !errors.As(err, &ie) || ie.Param != "response_format" {
		t.Fatalf("tiny budget: %v", err)
	}
}

func TestChatToolCallsValidate(t *testing.T) {
	_, d := loadTinyLlama(t, "fp32", Config{})
	weather := `{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer"}},"required":["city","unit"]}`
	search := `{"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer"}},"required":["query","limit"],"additionalProperties":false}`
	tools := []engine.Tool{{Name: "get_weather", Description: "Weather for a city.", Parameters: []byte(weather)}, {Name: "search", Parameters: []byte(search)}}
	validators := map[string]*jsonschema.Schema{"get_weather": schemaValidator(t, weather), "search": schemaValidator(t, search)}
	no := false
	for s := range int64(4) {
		for _, choice := range []engine.ToolChoice{{Mode: engine.ToolChoiceRequired}, {Mode: engine.ToolChoiceFunction, Name: "search"}} {
			req := engine.ChatRequest{Messages: userMsg("Weather in Paris?"), Tools: tools, ToolChoice: choice, MaxTokens: 120, Seed: seed(s), ParallelToolCalls: &no}
			var deltas []engine.ToolCallDelta
			resp, err := d.Chat(context.Background(), req, func(dl engine.ChatDelta) error {
				deltas = append(deltas, dl.ToolCalls...)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			calls := resp.Message.ToolCalls
			if resp.FinishReason != engine.FinishToolCalls || len(calls) != 1 || resp.Message.Content != "" {
				t.Fatalf("choice %+v seed %d: finish %q calls %+v content %q", choice, s, resp.FinishReason, calls, resp.Message.Content)
			}
			if choice.Name != "" && calls[0].Name != choice.Name {
				t.Fatalf("named choice called %s", calls[0].Name)
			}
			if !strings.HasPrefix(calls[0].ID, "call_") || len(deltas) != 1 || deltas[0].ToolCall != calls[0] {
				t.Fatalf("call %+v, deltas %+v", calls[0], deltas)
			}
			mustValidate(t, validators[calls[0].Name], calls[0].Arguments)
		}
	}
	// The conversation continues with the call and its result.
	follow := engine.ChatRequest{Messages: []engine.ChatMessage{
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []engine.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris","unit":"celsius"}`}}},
		{Role: "tool", ToolCallID: "call_1", Content: `{"temperature": 21}`},
	}, Tools: tools, MaxTokens: 10, Seed: seed(1)}
	if resp := chatOnce(t, d, follow); resp.Usage.PromptTokens == 0 {
		t.Fatal("no prompt tokens")
	}
}

func TestChatConcurrentEqualsSerial(t *testing.T) {
	_, d := loadTinyLlama(t, "fp32", Config{})
	reqs := make([]engine.ChatRequest, 6)
	for i := range reqs {
		reqs[i] = engine.ChatRequest{Messages: userMsg(strings.Repeat("word ", i+1)), MaxTokens: 30, Seed: seed(int64(i))}
		if i%3 == 2 {
			reqs[i].ResponseFormat = engine.ResponseFormat{Type: engine.FormatJSONObject}
		}
	}
	serial := make([]string, len(reqs))
	for i, r := range reqs {
		serial[i] = chatOnce(t, d, r).Message.Content
	}
	got := make([]string, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() {
			resp, err := d.Chat(context.Background(), r, nil)
			got[i], errs[i] = resp.Message.Content, err
		})
	}
	wg.Wait()
	for i := range reqs {
		if errs[i] != nil || got[i] != serial[i] {
			t.Fatalf("request %d: concurrent %q (%v), serial %q", i, got[i], errs[i], serial[i])
		}
	}
}

func TestChatCancelAndErrors(t *testing.T) {
	_, d := loadTinyLlama(t, "fp32", Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Chat(ctx, engine.ChatRequest{Messages: userMsg("x")}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	// The client goes away after three deltas: generation stops there.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	n := 0
	resp, err := d.Chat(ctx, engine.ChatRequest{Messages: userMsg("x"), MaxTokens: 200, Seed: seed(1)}, func(engine.ChatDelta) error {
		if n++; n == 3 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || resp.Usage.CompletionTokens >= 200 {
		t.Fatalf("cancel mid-stream: %v after %d tokens", err, resp.Usage.CompletionTokens)
	}
	sentinel := errors.New("client gone")
	if _, err := d.Chat(context.Background(), engine.ChatRequest{Messages: userMsg("x"), MaxTokens: 50}, func(engine.ChatDelta) error { return sentinel }); !errors.Is(err, sentinel) {
		t.Fatalf("callback error: %v", err)
	}
	for _, c := range []struct {
		param string
		req   engine.ChatRequest
	}{
		{"max_tokens", engine.ChatRequest{Messages: userMsg("x"), MaxTokens: 1025}},
		{"messages", engine.ChatRequest{Messages: userMsg(strings.Repeat("zq ", 3000))}},
		{"max_tokens", engine.ChatRequest{Messages: userMsg(strings.Repeat("zq ", 600)), MaxTokens: 1000}},
	} {
		_, err := d.Chat(context.Background(), c.req, nil)
		var ie *engine.InputError
		if !errors.As(err, &ie) || ie.Param != c.param {
			t.Errorf("want a 400 on %s, got %v", c.param, err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Chat(context.Background(), engine.ChatRequest{Messages: userMsg("x"), MaxTokens: 3}, nil); !errors.Is(err, errEngineClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestChatInt8Variant(t *testing.T) {
	_, d := loadTinyLlama(t, "int8", Config{})
	if d.ID() != "onnx/tiny-llama/test-int8" {
		t.Fatalf("id %s", d.ID())
	}
	req := engine.ChatRequest{Messages: userMsg("hello"), MaxTokens: 24, Seed: seed(5)}
	a, b := chatOnce(t, d, req), chatOnce(t, d, req)
	if a.Message.Content == "" || a.Message.Content != b.Message.Content {
		t.Fatalf("int8: %q vs %q", a.Message.Content, b.Message.Content)
	}
	resp := chatOnce(t, d, engine.ChatRequest{Messages: userMsg("JSON"), MaxTokens: 40, Seed: seed(2), ResponseFormat: engine.ResponseFormat{Type: engine.FormatJSONObject}})
	if !json.Valid([]byte(resp.Message.Content)) {
		t.Fatalf("int8 json_object: %q", resp.Message.Content)
	}
}

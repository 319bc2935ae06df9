package llama

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/chat"
)

// loadTiny loads the tiny GGUF chat model with option overrides.
func loadTiny(tb testing.TB, opts map[string]string) *chatEngine {
	tb.Helper()
	r, err := NewRuntime(testLibDir(tb), Config{Threads: 1})
	if err != nil {
		tb.Fatal(err)
	}
	spec := engine.Spec{ID: "gguf/tiny-gguf/test", Task: engine.TaskChat, Dir: testTinyDir(tb),
		Files: map[string]string{"model": "model.gguf"}, Options: opts}
	e, err := r.loadChat(spec)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		e.Close()
		r.Close()
	})
	return e
}

func user(s string) []engine.ChatMessage {
	return []engine.ChatMessage{{Role: engine.RoleUser, Content: s}}
}

func greedy() *float64 { z := 0.0; return &z }

// testPrompts are 16 conversations of different lengths.
func testPrompts() []string {
	out := make([]string, 16)
	for i := range out {
		out[i] = fmt.Sprintf("Question %d: %s", i, strings.Repeat("tell me about the mesh and its nodes. ", 1+i%5))
	}
	return out
}

// bareGreedy runs plan's prompt through a context of its own with
// llama.cpp directly (one sequence, the whole prompt in one decode, then
// one token per decode), taking the argmax (lowest id on ties) over the
// tokenizer's ids, until an end id or maxTokens: the reference the engine
// must match.
func bareGreedy(t *testing.T, e *chatEngine, plan *chat.Plan) []int64 {
	t.Helper()
	c, err := e.lm.NewContext(ContextConfig{Context: 2048, Sequences: 1, Batch: 1024, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Free()
	b := c.Batch()
	for i, id := range plan.Prompt {
		b.Add(int32(id), i, 0, i == len(plan.Prompt)-1)
	}
	if err := c.Decode(); err != nil {
		t.Fatal(err)
	}
	lg := c.Logits(len(plan.Prompt) - 1)
	var out []int64
	pos := len(plan.Prompt)
	for len(out) < plan.MaxTokens {
		best := 0
		for i := 1; i < e.model.Tok.VocabSize(); i++ {
			if lg[i] > lg[best] {
				best = i
			}
		}
		out = append(out, int64(best))
		if slicesContains(e.model.EOS, int64(best)) {
			break
		}
		b := c.Batch()
		b.Add(int32(best), pos, 0, true)
		pos++
		if err := c.Decode(); err != nil {
			t.Fatal(err)
		}
		lg = c.Logits(0)
	}
	return out
}

func slicesContains(s []int64, v int64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestGreedyMatchesBareLlama: for 16 prompts, greedy answers through the
// engine — one at a time, then all 16 at once through the batch, with
// different lengths so sequences join and leave mid-stream — equal bare
// llama.cpp's greedy tokens on the same GGUF.
func TestGreedyMatchesBareLlama(t *testing.T) {
	e := loadTiny(t, map[string]string{"max_batch": "6"})
	prompts := testPrompts()
	want := make([]string, len(prompts))
	reqs := make([]engine.ChatRequest, len(prompts))
	for i, p := range prompts {
		reqs[i] = engine.ChatRequest{Messages: user(p), MaxTokens: 8 + 3*i, Temperature: greedy()}
		plan, err := e.model.Prepare(reqs[i])
		if err != nil {
			t.Fatal(err)
		}
		ids := bareGreedy(t, e, plan)
		if slicesContains(e.model.EOS, ids[len(ids)-1]) {
			ids = ids[:len(ids)-1]
		}
		want[i] = e.model.Tok.Decode(ids, true)
	}
	for i, r := range reqs {
		resp, err := e.Chat(context.Background(), r, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Message.Content != want[i] {
			t.Fatalf("prompt %d alone:\n got  %q\n bare %q", i, resp.Message.Content, want[i])
		}
	}
	got := make([]string, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() {
			time.Sleep(time.Duration(i%4) * time.Millisecond) // staggered joins
			resp, err := e.Chat(context.Background(), r, nil)
			if err != nil {
				t.Error(err)
				return
			}
			got[i] = resp.Message.Content
		})
	}
	wg.Wait()
	for i := range reqs {
		if got[i] != want[i] {
			t.Errorf("prompt %d batched:\n got  %q\n bare %q", i, got[i], want[i])
		}
	}
	st := e.BatchStats()
	if st.Steps == 0 || st.StepRows <= st.Steps {
		t.Errorf("no batched steps: %+v", st)
	}
	t.Logf("stats %+v (mean rows per step %.2f)", st, float64(st.StepRows)/float64(st.Steps))
}

// TestStreamEqualsNonStreamed: concatenated streamed deltas equal the
// non-streamed answer, with the same seed.
func TestStreamEqualsNonStreamed(t *testing.T) {
	e := loadTiny(t, nil)
	seed := int64(7)
	req := engine.ChatRequest{Messages: user("Tell me a story."), MaxTokens: 40, Seed: &seed}
	plain, err := e.Chat(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	var finish string
	streamed, err := e.Chat(context.Background(), req, func(d engine.ChatDelta) error {
		b.WriteString(d.Content)
		if d.FinishReason != "" {
			finish = d.FinishReason
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != plain.Message.Content || streamed.Message.Content != plain.Message.Content || finish != plain.FinishReason {
		t.Fatalf("streamed %q (%s), plain %q (%s)", b.String(), finish, plain.Message.Content, plain.FinishReason)
	}
	if plain.Usage.PromptTokens == 0 || plain.Usage.CompletionTokens == 0 {
		t.Fatalf("usage %+v", plain.Usage)
	}
}

// TestCancelFreesSequence: with one sequence, a stream cancelled midway
// gives its sequence back; the next request runs to the end and nothing
// stays admitted.
func TestCancelFreesSequence(t *testing.T) {
	e := loadTiny(t, map[string]string{"max_batch": "1", "max_queue": "1"})
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	_, err := e.Chat(ctx, engine.ChatRequest{Messages: user("Count forever."), MaxTokens: 400, Temperature: greedy()}, func(d engine.ChatDelta) error {
		if d.Content != "" {
			n++
			if n == 3 {
				cancel()
			}
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled stream: %v", err)
	}
	resp, err := e.Chat(context.Background(), engine.ChatRequest{Messages: user("Hello"), MaxTokens: 10, Temperature: greedy()}, nil)
	if err != nil || resp.Usage.CompletionTokens == 0 {
		t.Fatalf("after cancel: %+v %v", resp, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.BatchStats().Running != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if st := e.BatchStats(); st.Running != 0 {
		t.Fatalf("still admitted: %+v", st)
	}
}

func compile(t *testing.T, schema string) *jsonschema.Schema {
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

func validate(t *testing.T, v *jsonschema.Schema, text string) {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("%q does not parse: %v", text, err)
	}
	if err := v.Validate(inst); err != nil {
		t.Fatalf("%q does not validate: %v", text, err)
	}
}

// TestJSONSchemaAndToolCalls: strict JSON-schema output parses and
// validates; forced tool calls come back as tool_calls whose arguments
// validate against the function's schema.
func TestJSONSchemaAndToolCalls(t *testing.T) {
	e := loadTiny(t, nil)
	schema := `{"type":"object","properties":{"city":{"type":"string","maxLength":12},"temperature":{"type":"number"},"rain":{"type":"boolean"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"array","items":{"type":"integer"},"maxItems":3}},"required":["city","temperature","rain","unit","days"],"additionalProperties":false}`
	v := compile(t, schema)
	for s := range int64(4) {
		seed := s
		resp, err := e.Chat(context.Background(), engine.ChatRequest{Messages: user("Weather as JSON."), MaxTokens: 120, Seed: &seed,
			ResponseFormat: engine.ResponseFormat{Type: engine.FormatJSONSchema, Name: "w", Schema: []byte(schema), Strict: true}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		validate(t, v, resp.Message.Content)
	}
	params := `{"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer"}},"required":["query","limit"],"additionalProperties":false}`
	pv := compile(t, params)
	no := false
	for s := range int64(3) {
		seed := s
		resp, err := e.Chat(context.Background(), engine.ChatRequest{Messages: user("Find flights."), MaxTokens: 120, Seed: &seed,
			Tools: []engine.Tool{{Name: "search", Parameters: []byte(params)}}, ToolChoice: engine.ToolChoice{Mode: engine.ToolChoiceRequired}, ParallelToolCalls: &no}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.FinishReason != engine.FinishToolCalls || len(resp.Message.ToolCalls) != 1 {
			t.Fatalf("tool call: %+v", resp)
		}
		validate(t, pv, resp.Message.ToolCalls[0].Arguments)
		var args map[string]any
		if err := json.Unmarshal([]byte(resp.Message.ToolCalls[0].Arguments), &args); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKVCellsAdmission: a request whose reservation (prompt + max_tokens)
// does not fit in the KV cells left waits in the queue until the running
// one ends, then runs.
func TestKVCellsAdmission(t *testing.T) {
	e := loadTiny(t, map[string]string{"context_window": "256", "kv_cells": "256", "max_batch": "4"})
	release := make(chan struct{})
	started := make(chan struct{})
	done := make(chan error, 2)
	go func() {
		once := false
		_, err := e.Chat(context.Background(), engine.ChatRequest{Messages: user("first"), MaxTokens: 150, Temperature: greedy()}, func(d engine.ChatDelta) error {
			if !once {
				once = true
				close(started)
				<-release
			}
			return nil
		})
		done <- err
	}()
	<-started
	go func() {
		_, err := e.Chat(context.Background(), engine.ChatRequest{Messages: user("second"), MaxTokens: 150, Temperature: greedy()}, nil)
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for e.BatchStats().Queued != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if st := e.BatchStats(); st.Queued != 1 || st.Running != 1 {
		t.Fatalf("want one running and one queued: %+v", st)
	}
	close(release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

package chat

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

func TestSamplerGreedyAndMask(t *testing.T) {
	logits := []float32{1, 5, 5, 2, 9}
	s := NewSampler(SamplingParams{Temperature: 0}, 4) // id 4 is past the limit
	if got := s.Sample(logits, nil); got != 1 {
		t.Fatalf("greedy = %d, want 1 (ties go to the lowest id; id 4 is beyond the limit)", got)
	}
	if got := s.Sample(logits, []bool{true, false, false, true}); got != 3 {
		t.Fatalf("masked greedy = %d, want 3", got)
	}
	if got := s.Sample(logits, make([]bool, 4)); got != -1 {
		t.Fatalf("nothing allowed gave %d", got)
	}
	// Penalties: id 1 generated twice loses 0.5 + 2*1.5 = 3.5 -> 1.5, so 2 wins.
	p := NewSampler(SamplingParams{PresencePenalty: 0.5, FrequencyPenalty: 1.5}, 4)
	p.Accept(1)
	p.Accept(1)
	if got := p.Sample(logits, nil); got != 2 {
		t.Fatalf("penalised greedy = %d, want 2", got)
	}
}

func TestSamplerSeedAndDistribution(t *testing.T) {
	logits := []float32{0, float32(math.Log(3)), -50, 0}
	draw := func(seed uint64, topP float64) []int64 {
		s := NewSampler(SamplingParams{Temperature: 1, TopP: topP, Seed: seed}, 4)
		out := make([]int64, 4000)
		for i := range out {
			out[i] = s.Sample(logits, nil)
		}
		return out
	}
	a, b, c := draw(42, 1), draw(42, 1), draw(43, 1)
	if !slices.Equal(a, b) {
		t.Fatal("the same seed must give the same tokens")
	}
	if slices.Equal(a, c) {
		t.Fatal("different seeds gave the same 4000 tokens")
	}
	// p = 1/5, 3/5, ~0, 1/5.
	counts := make([]int, 4)
	for _, id := range a {
		counts[id]++
	}
	if counts[1] < 2200 || counts[1] > 2600 || counts[2] != 0 || counts[0] < 600 || counts[3] < 600 {
		t.Fatalf("counts %v do not follow softmax [0.2 0.6 0 0.2]", counts)
	}
	// top_p 0.6 keeps only the most likely token.
	for _, id := range draw(1, 0.6) {
		if id != 1 {
			t.Fatalf("top_p 0.6 sampled %d", id)
		}
	}
	// top_p 0.7 keeps ids 1 and 0 (0 before 3 on the tie).
	seen := map[int64]bool{}
	for _, id := range draw(2, 0.7) {
		seen[id] = true
	}
	if !seen[0] || !seen[1] || seen[3] || seen[2] {
		t.Fatalf("top_p 0.7 sampled %v", seen)
	}
}

func TestStopBufferAcrossBoundaries(t *testing.T) {
	b := NewStopBuffer([]string{"STOP", "\n\n"})
	var out strings.Builder
	pieces := []string{"hello S", "T", "ill going ST", "O", "P and more"}
	stopped := false
	for _, p := range pieces {
		s, st := b.Push(p)
		out.WriteString(s)
		if st {
			stopped = true
			break
		}
	}
	if !stopped || out.String() != "hello STill going " {
		t.Fatalf("out %q stopped %v", out.String(), stopped)
	}
	b = NewStopBuffer([]string{"abc"})
	s1, _ := b.Push("xxab")
	s2 := b.Flush()
	if s1 != "xx" || s2 != "ab" {
		t.Fatalf("held %q / %q", s1, s2)
	}
	// The earliest stop wins.
	b = NewStopBuffer([]string{"cd", "b"})
	if s, st := b.Push("abcd"); s != "a" || !st {
		t.Fatalf("earliest stop: %q %v", s, st)
	}
}

func TestToolScanner(t *testing.T) {
	tools := []engine.Tool{{Name: "get_weather"}, {Name: "noop"}}
	text := "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"noop\", \"arguments\": \"{}\"}\n</tool_call>\n"
	whole := NewToolScanner(tools)
	content, calls := whole.Push(text)
	content += whole.Finish()
	want := []engine.ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris"}`}, {Name: "noop", Arguments: `{}`}}
	if content != "Let me check." || !slices.Equal(calls, want) {
		t.Fatalf("content %q calls %+v", content, calls)
	}
	// Byte by byte gives the same split.
	r := rand.New(rand.NewPCG(1, 1))
	for range 50 {
		sc := NewToolScanner(tools)
		var got strings.Builder
		var gotCalls []engine.ToolCall
		for rest := text; rest != ""; {
			n := 1 + r.IntN(min(6, len(rest)))
			c, cl := sc.Push(rest[:n])
			got.WriteString(c)
			gotCalls = append(gotCalls, cl...)
			rest = rest[n:]
		}
		got.WriteString(sc.Finish())
		if got.String() != content || !slices.Equal(gotCalls, want) {
			t.Fatalf("chunked: %q %+v", got.String(), gotCalls)
		}
	}
	// A closing tag inside an argument string does not end the block.
	inner := "<tool_call>\n{\"name\": \"noop\", \"arguments\": {\"s\": \"a</tool_call>b\"}}\n</tool_call>"
	sc := NewToolScanner(tools)
	c, cl := sc.Push(inner)
	if c += sc.Finish(); c != "" || len(cl) != 1 || cl[0].Arguments != `{"s":"a</tool_call>b"}` {
		t.Fatalf("inner closing tag: content %q calls %+v", c, cl)
	}
	// Unknown functions, broken JSON and unfinished blocks stay content.
	for _, s := range []string{"<tool_call>{\"name\": \"rm\"}</tool_call>", "<tool_call>{oops</tool_call>", "a <tool_call>{\"name\""} {
		sc := NewToolScanner(tools)
		c, cl := sc.Push(s)
		c += sc.Finish()
		if len(cl) != 0 || c != s {
			t.Errorf("%q: content %q calls %v", s, c, cl)
		}
	}
}

func TestToolGrammar(t *testing.T) {
	tools := []engine.Tool{
		{Name: "get_weather", Parameters: []byte(`{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city","days"],"additionalProperties":false}`)},
		{Name: "get_time", Parameters: []byte(`{"type":"object","properties":{"tz":{"enum":["UTC","CET"]}},"required":["tz"]}`)},
	}
	g, err := NewToolGrammar(tools, "", true)
	if err != nil {
		t.Fatal(err)
	}
	call := "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>"
	s, ok := g.Start().StepBytes([]byte(call))
	if !ok || !s.Accepting() || s.Done() {
		t.Fatalf("one call: ok=%v accepting=%v done=%v (parallel allows more)", ok, s.Accepting(), s.Done())
	}
	if _, ok := s.StepBytes([]byte("\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>")); !ok {
		t.Fatal("a second parallel call was refused")
	}
	for _, bad := range []string{
		"<tool_call>\n{\"name\": \"get_wind\"",
		"<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"PST\"",
		"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}",
		"Sure! <tool_call>",
	} {
		if _, ok := g.Start().StepBytes([]byte(bad)); ok {
			t.Errorf("accepted %q", bad)
		}
	}
	only, err := NewToolGrammar(tools, "get_time", false)
	if err != nil {
		t.Fatal(err)
	}
	s, ok = only.Start().StepBytes([]byte("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>"))
	if !ok || !s.Done() {
		t.Fatal("a named single call must end the answer")
	}
	if _, ok := only.Start().StepBytes([]byte("<tool_call>\n{\"name\": \"get_weather\"")); ok {
		t.Fatal("named tool_choice allowed another function")
	}
	// Random walks through the grammar always parse back into valid calls.
	r := rand.New(rand.NewPCG(9, 9))
	v := compileValidator(t, string(tools[0].Parameters))
	for range 100 {
		st := g.Start()
		text := randomWalk(t, r, st, st.MinClose()+r.IntN(80))
		sc := NewToolScanner(tools)
		content, calls := sc.Push(text)
		content += sc.Finish()
		if content != "" || len(calls) == 0 {
			t.Fatalf("walk %q parsed to content %q calls %v", text, content, calls)
		}
		for _, c := range calls {
			if c.Name == "get_weather" {
				validate(t, v, c.Arguments)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	user := []engine.ChatMessage{{Role: "user", Content: "hi"}}
	f := func(v float64) *float64 { return &v }
	cases := []struct {
		param string
		req   engine.ChatRequest
	}{
		{"messages", engine.ChatRequest{}},
		{"messages[0].role", engine.ChatRequest{Messages: []engine.ChatMessage{{Role: "robot"}}}},
		{"messages[2].tool_call_id", engine.ChatRequest{Messages: []engine.ChatMessage{user[0], {Role: "assistant", ToolCalls: []engine.ToolCall{{ID: "a", Name: "f"}}}, {Role: "tool", ToolCallID: "b"}}}},
		{"tools[1].function.name", engine.ChatRequest{Messages: user, Tools: []engine.Tool{{Name: "f"}, {Name: "f"}}}},
		{"tools[0].function.name", engine.ChatRequest{Messages: user, Tools: []engine.Tool{{Name: "has space"}}}},
		{"tool_choice", engine.ChatRequest{Messages: user, Tools: []engine.Tool{{Name: "f"}}, ToolChoice: engine.ToolChoice{Mode: "function", Name: "g"}}},
		{"tool_choice", engine.ChatRequest{Messages: user, ToolChoice: engine.ToolChoice{Mode: "required"}}},
		{"response_format", engine.ChatRequest{Messages: user, ResponseFormat: engine.ResponseFormat{Type: "xml"}}},
		{"max_tokens", engine.ChatRequest{Messages: user, MaxTokens: MaxOutputTokensLimit + 1}},
		{"temperature", engine.ChatRequest{Messages: user, Temperature: f(2.5)}},
		{"top_p", engine.ChatRequest{Messages: user, TopP: f(0)}},
		{"presence_penalty", engine.ChatRequest{Messages: user, PresencePenalty: 3}},
		{"stop", engine.ChatRequest{Messages: user, Stop: []string{"a", "b", "c", "d", "e"}}},
	}
	for _, c := range cases {
		err := Validate(c.req)
		var ie *engine.InputError
		if !errors.As(err, &ie) || ie.Param != c.param || !errors.Is(err, engine.ErrInvalidInput) {
			t.Errorf("want a 400 on %s, got %v", c.param, err)
		}
	}
	ok := engine.ChatRequest{Messages: []engine.ChatMessage{user[0], {Role: "assistant", ToolCalls: []engine.ToolCall{{ID: "a", Name: "f"}}}, {Role: "tool", ToolCallID: "a", Content: "1"}}, Tools: []engine.Tool{{Name: "f"}}}
	if err := Validate(ok); err != nil {
		t.Fatal(err)
	}
}

package chat

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/tokenizer"
)

// Model is everything about a loaded chat model that does not run the
// network: tokenizer, template, token bytes for masking, end tokens and
// limits. It is immutable and shared by all requests.
type Model struct {
	// Tok encodes the rendered prompt and decodes the generated tokens.
	Tok *tokenizer.Tokenizer
	// Template renders a conversation and its tools into the prompt text.
	Template *Template
	// Vocab holds Tok's tokens as bytes, for masking constrained decoding.
	Vocab *Vocab
	// EOS are the ids that end generation.
	EOS []int64
	// ContextWindow bounds prompt plus completion, in tokens.
	ContextWindow int
	// MaxOutput is the default and the cap of max_tokens.
	MaxOutput int
}

// NewModel checks the parts fit together and precomputes the token bytes.
func NewModel(tok *tokenizer.Tokenizer, tpl *Template, eos []int64, contextWindow, maxOutput int) (*Model, error) {
	if !tok.PerTokenDecoding() {
		return nil, errors.New("chat: the tokenizer's decoder does not decode token by token (only byte-level BPE tokenizers are supported for chat)")
	}
	if len(eos) == 0 {
		return nil, errors.New("chat: the model has no end-of-sequence token")
	}
	if contextWindow <= 1 || contextWindow > MaxContextTokens {
		return nil, fmt.Errorf("chat: context window %d must be in [2, %d]", contextWindow, MaxContextTokens)
	}
	if maxOutput <= 0 || maxOutput > min(contextWindow, MaxOutputTokensLimit) {
		return nil, fmt.Errorf("chat: max output %d must be in [1, %d]", maxOutput, min(contextWindow, MaxOutputTokensLimit))
	}
	return &Model{Tok: tok, Template: tpl, Vocab: NewVocab(tok), EOS: eos, ContextWindow: contextWindow, MaxOutput: maxOutput}, nil
}

// Plan is a validated, tokenized request, ready to generate.
type Plan struct {
	// Prompt is the rendered conversation's ids.
	Prompt []int64
	// MaxTokens is the completion budget.
	MaxTokens int
	// Sampling holds the request's temperature, top-p, seed (random when
	// the request gives none) and penalties.
	Sampling SamplingParams
	stops    []string
	start    *State        // constrained decoding from here; nil: free text
	scanner  []engine.Tool // tools whose calls are recognised in free text
	toolMode bool          // the constraint is tool calls
}

// Prepare validates req, renders and tokenizes the prompt, and builds the
// constraint: tool calls for tool_choice required or a named function, a
// JSON automaton for response_format json_object / json_schema.
func (m *Model) Prepare(req engine.ChatRequest) (*Plan, error) {
	if err := Validate(req); err != nil {
		return nil, err
	}
	p := &Plan{Sampling: SamplingParams{Temperature: 1, TopP: 1, PresencePenalty: req.PresencePenalty, FrequencyPenalty: req.FrequencyPenalty}, stops: req.Stop}
	if req.Temperature != nil {
		p.Sampling.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		p.Sampling.TopP = *req.TopP
	}
	if req.Seed != nil {
		p.Sampling.Seed = uint64(*req.Seed)
	} else {
		var b [8]byte
		_, _ = rand.Read(b[:])
		p.Sampling.Seed = binary.LittleEndian.Uint64(b[:])
	}
	tools := req.Tools
	mode := req.ToolChoice.Mode
	if mode == "" {
		mode = engine.ToolChoiceAuto
	}
	parallel := req.ParallelToolCalls == nil || *req.ParallelToolCalls
	switch {
	case len(tools) > 0 && (mode == engine.ToolChoiceRequired || mode == engine.ToolChoiceFunction):
		g, err := NewToolGrammar(tools, req.ToolChoice.Name, parallel && mode == engine.ToolChoiceRequired)
		if err != nil {
			return nil, inputErr("tools", "%v", err)
		}
		st := g.Start()
		p.start, p.toolMode, p.scanner = &st, true, tools
	case len(tools) > 0 && mode == engine.ToolChoiceAuto:
		p.scanner = tools
	}
	if p.start == nil {
		switch req.ResponseFormat.Type {
		case engine.FormatJSONObject:
			st := NewState(AnyObject())
			p.start = &st
		case engine.FormatJSONSchema:
			n, err := CompileSchema(req.ResponseFormat.Schema)
			if err != nil {
				return nil, inputErr("response_format", "json_schema: %v", err)
			}
			st := NewState(n)
			p.start = &st
		}
	}
	text, err := m.Template.Render(req.Messages, tools, true)
	if err != nil {
		return nil, err
	}
	if p.Prompt, err = m.Tok.EncodeContent(text); err != nil {
		if errors.Is(err, tokenizer.ErrInputTooLarge) {
			return nil, inputErr("messages", "the conversation is too long: %v", err)
		}
		return nil, err
	}
	room := m.ContextWindow - len(p.Prompt)
	if room < 1 {
		return nil, inputErr("messages", "this model's maximum context length is %d tokens, but the messages take %d", m.ContextWindow, len(p.Prompt))
	}
	switch {
	case req.MaxTokens > m.MaxOutput:
		return nil, inputErr("max_tokens", "max_tokens is %d, but this model writes at most %d tokens", req.MaxTokens, m.MaxOutput)
	case req.MaxTokens > room:
		return nil, inputErr("max_tokens", "this model's maximum context length is %d tokens: %d in the messages plus max_tokens %d is too many", m.ContextWindow, len(p.Prompt), req.MaxTokens)
	case req.MaxTokens > 0:
		p.MaxTokens = req.MaxTokens
	default:
		p.MaxTokens = min(m.MaxOutput, room)
	}
	if p.start != nil && p.start.MinClose() > p.MaxTokens {
		param := "response_format"
		if p.toolMode {
			param = "tools"
		}
		return nil, inputErr(param, "the shortest valid answer takes about %d tokens, more than max_tokens %d", p.start.MinClose(), p.MaxTokens)
	}
	return p, nil
}

// Forwarder runs the network for one generation: it is fed the prompt,
// then each sampled token, and returns the logits of the last position.
// The slice is read before the next call.
type Forwarder interface {
	// Forward feeds ids (the prompt, then one sampled token per call) and
	// returns the logits of the last position.
	Forward(ctx context.Context, ids []int64) ([]float32, error)
}

// Generate runs the decode loop for plan on f, streaming deltas through
// onDelta when it is not nil.
func (m *Model) Generate(ctx context.Context, plan *Plan, f Forwarder, onDelta func(engine.ChatDelta) error) (engine.ChatResponse, error) {
	g := &generation{m: m, plan: plan, onDelta: onDelta, stop: NewStopBuffer(plan.stops), dec: m.Tok.NewDecodeStream(true)}
	if plan.scanner != nil {
		g.tools = NewToolScanner(plan.scanner)
	}
	return g.run(ctx, f)
}

// generation is one request's decode state.
type generation struct {
	m       *Model
	plan    *Plan
	onDelta func(engine.ChatDelta) error
	stop    *StopBuffer
	dec     *tokenizer.DecodeStream
	tools   *ToolScanner
	resp    engine.ChatResponse
	content []byte
}

func (g *generation) run(ctx context.Context, f Forwarder) (engine.ChatResponse, error) {
	m, plan := g.m, g.plan
	g.resp.Message.Role = engine.RoleAssistant
	g.resp.Usage.PromptTokens = len(plan.Prompt)
	if err := g.send(engine.ChatDelta{Role: engine.RoleAssistant}); err != nil {
		return g.resp, err
	}
	if err := ctx.Err(); err != nil {
		return g.resp, err
	}
	logits, err := f.Forward(ctx, plan.Prompt)
	if err != nil {
		return g.resp, err
	}
	sampler := NewSampler(plan.Sampling, m.Tok.VocabSize())
	var state State
	var mask []bool
	if plan.start != nil {
		state = *plan.start
		mask = make([]bool, m.Vocab.Size())
	}
	finish := engine.FinishLength
	for i := 0; i < plan.MaxTokens; i++ {
		if err := ctx.Err(); err != nil {
			return g.resp, err
		}
		if mask != nil {
			if state.Done() {
				finish = engine.FinishStop
				break
			}
			if m.Vocab.Allow(state, plan.MaxTokens-i, m.EOS, mask) == 0 {
				return g.resp, errors.New("chat: constrained decoding has no allowed token (grammar and vocabulary do not fit)")
			}
		}
		id := sampler.Sample(logits, mask)
		if id < 0 {
			return g.resp, errors.New("chat: no token to sample")
		}
		g.resp.Usage.CompletionTokens++
		if g.isEOS(id) {
			finish = engine.FinishStop
			break
		}
		sampler.Accept(id)
		if mask != nil {
			next, ok := state.StepBytes(m.Vocab.Bytes(id))
			if !ok {
				return g.resp, fmt.Errorf("chat: sampled token %d outside the grammar", id)
			}
			state = next
		}
		stopped, err := g.text(g.dec.Add(id))
		if err != nil {
			return g.resp, err
		}
		if stopped {
			finish = engine.FinishStop
			break
		}
		if mask != nil && state.Done() {
			finish = engine.FinishStop
			break
		}
		if i+1 == plan.MaxTokens {
			break
		}
		if logits, err = f.Forward(ctx, []int64{id}); err != nil {
			return g.resp, err
		}
	}
	if finish == engine.FinishLength && mask != nil && state.Accepting() {
		finish = engine.FinishStop // the budget ran out exactly as the value closed
	}
	if err := g.flush(); err != nil {
		return g.resp, err
	}
	if len(g.resp.Message.ToolCalls) > 0 {
		finish = engine.FinishToolCalls
	}
	g.resp.Message.Content = string(g.content)
	g.resp.FinishReason = finish
	return g.resp, g.send(engine.ChatDelta{FinishReason: finish})
}

func (g *generation) isEOS(id int64) bool {
	for _, e := range g.m.EOS {
		if id == e {
			return true
		}
	}
	return false
}

// text passes decoded text through the stop buffer and the tool scanner.
func (g *generation) text(s string) (stopped bool, err error) {
	out, stopped := g.stop.Push(s)
	return stopped, g.emit(out, false)
}

// flush drains the decoder, the stop buffer and the tool scanner.
func (g *generation) flush() error {
	if _, err := g.text(g.dec.Flush()); err != nil {
		return err
	}
	return g.emit(g.stop.Flush(), true)
}

// emit classifies text as content or tool calls and streams it.
func (g *generation) emit(s string, final bool) error {
	var calls []engine.ToolCall
	if g.tools != nil {
		s, calls = g.tools.Push(s)
		if final {
			s += g.tools.Finish()
		}
	}
	d := engine.ChatDelta{Content: s}
	for _, c := range calls {
		c.ID = newCallID()
		d.ToolCalls = append(d.ToolCalls, engine.ToolCallDelta{Index: len(g.resp.Message.ToolCalls), ToolCall: c})
		g.resp.Message.ToolCalls = append(g.resp.Message.ToolCalls, c)
	}
	g.content = append(g.content, s...)
	if s == "" && len(d.ToolCalls) == 0 {
		return nil
	}
	return g.send(d)
}

func (g *generation) send(d engine.ChatDelta) error {
	if g.onDelta == nil {
		return nil
	}
	return g.onDelta(d)
}

// newCallID returns an OpenAI-style tool call id.
func newCallID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "call_" + hex.EncodeToString(b[:])
}

package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
)

// maxEventBytes bounds one server-sent event from a provider.
const maxEventBytes = 8 << 20

// sseReader reads the data of server-sent events.
type sseReader struct {
	sc *bufio.Scanner
}

func newSSEReader(r io.Reader) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxEventBytes)
	return &sseReader{sc: sc}
}

// next returns the data of the next event (several data lines joined by
// "\n"), or io.EOF at the end of the stream.
func (s *sseReader) next() ([]byte, error) {
	var data [][]byte
	for s.sc.Scan() {
		line := s.sc.Bytes()
		if len(line) == 0 {
			if data != nil {
				return bytes.Join(data, []byte("\n")), nil
			}
			continue
		}
		if line[0] == ':' {
			continue // a comment (keep-alive)
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		if string(field) != "data" {
			continue // event:, id:, retry:
		}
		value = bytes.TrimPrefix(value, []byte(" "))
		data = append(data, bytes.Clone(value))
	}
	if err := s.sc.Err(); err != nil {
		return nil, err
	}
	if data != nil {
		return bytes.Join(data, []byte("\n")), nil
	}
	return nil, io.EOF
}

// streamState turns provider chunks into engine deltas. Tool calls arrive
// in fragments (name first, then pieces of the arguments); each is sent
// whole once the next call starts or the answer finishes, as
// engine.ToolCallDelta asks.
type streamState struct {
	onDelta  func(engine.ChatDelta) error
	res      engine.ChatResponse
	started  bool
	finished bool
	calls    []*engine.ToolCall
	byIndex  map[int]*engine.ToolCall
	sent     int
	content  strings.Builder
}

func (s *streamState) emit(d engine.ChatDelta) error {
	if !s.started {
		s.started = true
		d.Role = engine.RoleAssistant
	}
	return s.onDelta(d)
}

// flushCalls sends the tool calls before index upto (all when upto < 0).
func (s *streamState) flushCalls(upto int) error {
	var ds []engine.ToolCallDelta
	for s.sent < len(s.calls) && (upto < 0 || s.sent < upto) {
		ds = append(ds, engine.ToolCallDelta{Index: s.sent, ToolCall: *s.calls[s.sent]})
		s.sent++
	}
	if len(ds) == 0 {
		return nil
	}
	return s.emit(engine.ChatDelta{ToolCalls: ds})
}

// chunk handles one parsed chunk.
func (s *streamState) chunk(c wireCompletion) error {
	if c.Usage != nil {
		s.res.Usage = engine.ChatUsage{PromptTokens: c.Usage.PromptTokens, CompletionTokens: c.Usage.CompletionTokens}
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue
		}
		d := ch.Delta
		for _, tc := range d.ToolCalls {
			idx := len(s.calls)
			if tc.Index != nil {
				idx = *tc.Index
			}
			call := s.byIndex[idx]
			if call == nil {
				// A new call: the ones before it are complete.
				if err := s.flushCalls(len(s.calls)); err != nil {
					return err
				}
				call = &engine.ToolCall{}
				s.byIndex[idx] = call
				s.calls = append(s.calls, call)
			}
			if tc.ID != "" {
				call.ID = tc.ID
			}
			call.Name += tc.Function.Name
			call.Arguments += tc.Function.Arguments
		}
		text := ""
		if d.Content != nil {
			text = *d.Content
		}
		if text != "" || (!s.started && d.Role != "") {
			s.content.WriteString(text)
			if err := s.emit(engine.ChatDelta{Content: text}); err != nil {
				return err
			}
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" && !s.finished {
			if err := s.finish(finishReason(ch.FinishReason)); err != nil {
				return err
			}
		}
	}
	return nil
}

// finish sends the remaining tool calls and the finish reason.
func (s *streamState) finish(reason string) error {
	s.finished = true
	if err := s.flushCalls(-1); err != nil {
		return err
	}
	s.res.FinishReason = reason
	return s.emit(engine.ChatDelta{FinishReason: reason})
}

// stream reads the provider's server-sent events until [DONE].
func (e *chatEngine) stream(ctx context.Context, cl *call, onDelta func(engine.ChatDelta) error) (engine.ChatResponse, error) {
	s := &streamState{onDelta: onDelta, byIndex: map[int]*engine.ToolCall{}}
	s.res.Message.Role = engine.RoleAssistant
	r := newSSEReader(cl.resp.Body)
	done := false
	for {
		data, err := r.next()
		cl.touch()
		if errors.Is(err, io.EOF) {
			break
		}
		if err == nil && string(bytes.TrimSpace(data)) == "[DONE]" {
			done = true
			break
		}
		if err != nil {
			if errors.Is(err, bufio.ErrTooLong) {
				return s.res, e.c.badResponse("an event is longer than %d bytes", maxEventBytes)
			}
			return s.res, e.c.failure(ctx, cl.ctx, err)
		}
		var c wireCompletion
		if err := json.Unmarshal(data, &c); err != nil {
			return s.res, e.c.badResponse("invalid JSON in the stream: %v", err)
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			f := parseErrorBody(append(append([]byte(`{"error":`), c.Error...), '}'))
			return s.res, &engine.ProviderError{Provider: e.c.p.name, Status: http.StatusBadGateway, Type: apierr.TypeServer, Code: apierr.CodeUpstreamUnavailable,
				Message: fmt.Sprintf("The upstream provider %s failed during the answer: %s", e.c.p.name, f.Message)}
		}
		if err := s.chunk(c); err != nil {
			return s.res, err
		}
	}
	if !s.finished {
		if !done {
			return s.res, &engine.ProviderError{Provider: e.c.p.name, Status: http.StatusBadGateway, Type: apierr.TypeServer, Code: apierr.CodeUpstreamUnavailable,
				Message: fmt.Sprintf("The upstream provider %s ended the stream before the answer was complete.", e.c.p.name)}
		}
		if !s.started && len(s.calls) == 0 {
			return s.res, e.c.badResponse("the stream ended before any answer")
		}
		if err := s.finish(engine.FinishStop); err != nil {
			return s.res, err
		}
	}
	s.res.Message.Content = s.content.String()
	for _, c := range s.calls {
		s.res.Message.ToolCalls = append(s.res.Message.ToolCalls, *c)
	}
	return s.res, nil
}

package legacy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// v1Chunk is a chat.completion.chunk as /v1 streams it.
type v1Chunk struct {
	Choices []struct {
		Delta struct {
			Content   *string `json:"content"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// ndjson writes Ollama's answer: one JSON object per line when streaming,
// else the final object alone.
type ndjson struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	stream  bool
	started bool
}

// line writes one streamed object.
func (o *ndjson) line(v any) error {
	if !o.started {
		o.started = true
		o.w.Header().Set("Content-Type", "application/x-ndjson")
		o.w.WriteHeader(http.StatusOK)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := o.w.Write(append(b, '\n')); err != nil {
		return err
	}
	return o.rc.Flush()
}

// fail reports an error: with a status while nothing is written, else as
// an error line (the Ollama client returns it from the call).
func (o *ndjson) fail(status int, msg string) {
	if !o.started {
		writeError(o.w, status, msg)
		return
	}
	o.line(map[string]string{"error": msg})
}

// doneReason maps an OpenAI finish reason: Ollama reports tool calls as
// "stop".
func doneReason(finish string) string {
	if finish == "" || finish == "tool_calls" {
		return "stop"
	}
	return finish
}

// ollamaCall is a finished tool call in Ollama's shape.
func ollamaCall(i int, id, name, args string) (map[string]any, error) {
	a := strings.TrimSpace(args)
	if a == "" {
		a = "{}"
	}
	if !json.Valid([]byte(a)) || !strings.HasPrefix(a, "{") {
		return nil, fmt.Errorf("tool call %s: the arguments are not a JSON object", name)
	}
	return map[string]any{"id": id, "function": map[string]any{"index": i, "name": name, "arguments": json.RawMessage(a)}}, nil
}

// complete runs a /v1 chat completion (always streamed from /v1) and
// writes it in Ollama's chat (chat true) or generate shape, streamed as
// NDJSON when stream is set.
func (s *Server) complete(w http.ResponseWriter, r *http.Request, body map[string]any, model string, stream, chat bool) {
	start := s.opt.Clock()
	res, err := s.call(r, http.MethodPost, "/v1/chat/completions", body)
	if err != nil {
		s.fail(w, err)
		return
	}
	defer res.Close()
	o := &ndjson{w: w, rc: http.NewResponseController(w), stream: stream}
	piece := func(text string, calls []map[string]any) map[string]any {
		out := map[string]any{"model": model, "created_at": s.opt.Clock().UTC(), "done": false}
		if chat {
			msg := map[string]any{"role": "assistant", "content": text}
			if calls != nil {
				msg["tool_calls"] = calls
			}
			out["message"] = msg
		} else {
			out["response"] = text
			if calls != nil {
				out["tool_calls"] = calls
			}
		}
		return out
	}
	type acc struct{ id, name, args string }
	var (
		text     strings.Builder
		calls    []*acc
		finish   string
		prompt   int
		eval     int
		firstAt  time.Time
		finished bool
	)
	rd := newSSEReader(res.body)
	for !finished {
		data, err := rd.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			o.fail(http.StatusBadGateway, fmt.Sprintf("%v: %v", errStreamBroke, err))
			return
		}
		if string(bytes.TrimSpace(data)) == "[DONE]" {
			finished = true
			break
		}
		var c v1Chunk
		if err := json.Unmarshal(data, &c); err != nil {
			o.fail(http.StatusBadGateway, "unreadable /v1 stream: "+err.Error())
			return
		}
		if c.Error != nil {
			o.fail(http.StatusInternalServerError, c.Error.Message)
			return
		}
		if c.Usage != nil {
			prompt, eval = c.Usage.PromptTokens, c.Usage.CompletionTokens
		}
		for _, ch := range c.Choices {
			if firstAt.IsZero() {
				firstAt = s.opt.Clock()
			}
			for _, tc := range ch.Delta.ToolCalls {
				for len(calls) <= tc.Index {
					calls = append(calls, &acc{})
				}
				a := calls[tc.Index]
				if tc.ID != "" {
					a.id = tc.ID
				}
				a.name += tc.Function.Name
				a.args += tc.Function.Arguments
			}
			if d := ch.Delta.Content; d != nil && *d != "" {
				text.WriteString(*d)
				if stream {
					if err := o.line(piece(*d, nil)); err != nil {
						return // the caller went away
					}
				}
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	if !finished {
		o.fail(http.StatusBadGateway, errStreamBroke.Error())
		return
	}
	var out []map[string]any
	for i, a := range calls {
		c, err := ollamaCall(i, a.id, a.name, a.args)
		if err != nil {
			o.fail(http.StatusBadGateway, err.Error())
			return
		}
		out = append(out, c)
	}
	if stream && out != nil {
		if err := o.line(piece("", out)); err != nil {
			return
		}
	}
	end := s.opt.Clock()
	final := piece("", nil)
	if !stream {
		final = piece(text.String(), out)
	}
	final["done"] = true
	final["done_reason"] = doneReason(finish)
	final["total_duration"] = end.Sub(start).Nanoseconds()
	final["prompt_eval_count"] = prompt
	final["eval_count"] = eval
	if !firstAt.IsZero() {
		final["prompt_eval_duration"] = firstAt.Sub(start).Nanoseconds()
		final["eval_duration"] = end.Sub(firstAt).Nanoseconds()
	}
	if stream {
		o.line(final)
		return
	}
	writeJSON(w, http.StatusOK, final)
}

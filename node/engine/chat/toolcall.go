package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode"

	"github.com/infermesh/infermesh/node/engine"
)

// The Hermes / Qwen tool-call convention: each call is a JSON object in a
// <tool_call> block. Constrained calls are written exactly like this.
const (
	toolOpenTag   = "<tool_call>"
	toolCloseTag  = "</tool_call>"
	toolOpen      = "<tool_call>\n{\"name\": "
	toolOpenNext  = "\n<tool_call>\n{\"name\": "
	toolMid       = ", \"arguments\": "
	toolClose     = "}\n</tool_call>"
	maxToolNameLn = 64
)

// toolSpec is the grammar of one or more constrained tool calls.
type toolSpec struct {
	names    []string // function names as JSON strings, sorted
	fn       []string // the names themselves, same order
	args     []*Node  // each function's parameters, same order
	parallel bool
	minCall  int // fewest bytes of one call after the opening text
}

func (t *toolSpec) open(calls int32) string {
	if calls > 0 {
		return toolOpenNext
	}
	return toolOpen
}

// ToolGrammar constrains output to tool calls whose arguments follow each
// function's parameter schema.
type ToolGrammar struct {
	spec *toolSpec
}

// NewToolGrammar builds the grammar for calls to tools (only the one named
// only, when not empty); with parallel, several calls may follow each
// other.
func NewToolGrammar(tools []engine.Tool, only string, parallel bool) (*ToolGrammar, error) {
	t := &toolSpec{parallel: parallel, minCall: inf}
	type entry struct {
		quoted, name string
		args         *Node
	}
	var entries []entry
	for _, tl := range tools {
		if only != "" && tl.Name != only {
			continue
		}
		params := tl.Parameters
		if len(bytes.TrimSpace(params)) == 0 {
			params = []byte(`{"type":"object","properties":{}}`)
		}
		n, err := CompileSchema(params)
		if err != nil {
			return nil, fmt.Errorf("function %s: %w", tl.Name, err)
		}
		if n.kind != kObject {
			return nil, fmt.Errorf("function %s: parameters must be an object schema", tl.Name)
		}
		var q strings.Builder
		writePyString(&q, tl.Name)
		entries = append(entries, entry{q.String(), tl.Name, n})
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("no function to call")
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.quoted, b.quoted) })
	for _, e := range entries {
		t.names = append(t.names, e.quoted)
		t.fn = append(t.fn, e.name)
		t.args = append(t.args, e.args)
		t.minCall = min(t.minCall, len(e.quoted)+len(toolMid)+e.args.minSize+len(toolClose))
	}
	return &ToolGrammar{spec: t}, nil
}

// Start returns the state before the first call.
func (g *ToolGrammar) Start() State {
	return State{top: frame{kind: fTools}, below: &stackNode{f: frame{kind: fRoot}}, tools: g.spec}
}

func (s *State) stepTools(c byte) outcome {
	f := &s.top
	t := s.tools
	match := func(lit string) bool {
		if lit[f.n] != c {
			return false
		}
		f.n++
		return true
	}
	switch f.st {
	case tOpen:
		lit := t.open(f.aux)
		if !match(lit) {
			return rejected
		}
		if int(f.n) == len(lit) {
			f.st = tName
			s.push(frame{kind: fToolName, lits: t.names, hi: int32(len(t.names))})
		}
		return consumed
	case tMid:
		if !match(toolMid) {
			return rejected
		}
		if int(f.n) == len(toolMid) {
			f.st = tArgs
			s.push(frame{kind: fValue, node: t.args[f.lo]})
		}
		return consumed
	case tClose:
		if !match(toolClose) {
			return rejected
		}
		if int(f.n) == len(toolClose) {
			f.st, f.n = tDone, 0
			f.aux++
		}
		return consumed
	case tDone:
		if t.parallel && c == '\n' {
			f.st, f.n = tOpen, 1
			return consumed
		}
	}
	return rejected
}

// ToolScanner separates <tool_call> blocks from content in streamed text
// and parses them. Text that could still be the start of a block is held
// back, as is trailing whitespace (dropped when the answer has calls), so
// streamed and whole answers are split the same way. A block that does
// not parse, or names an unknown function, stays content.
type ToolScanner struct {
	known  map[string]bool
	held   string // text not yet classified
	inCall bool
	ws     string // trailing whitespace of the content so far
	calls  int
}

// NewToolScanner recognises calls to the named functions.
func NewToolScanner(tools []engine.Tool) *ToolScanner {
	k := map[string]bool{}
	for _, t := range tools {
		k[t.Name] = true
	}
	return &ToolScanner{known: k}
}

// Push adds text; it returns the content that is now certain and the
// calls that completed.
func (t *ToolScanner) Push(text string) (content string, calls []engine.ToolCall) {
	var out strings.Builder
	buf := t.held + text
	t.held = ""
	for {
		if !t.inCall {
			if i := strings.Index(buf, toolOpenTag); i >= 0 {
				t.content(&out, buf[:i])
				buf = buf[i+len(toolOpenTag):]
				t.inCall = true
				continue
			}
			keep := 0
			for k := min(len(toolOpenTag)-1, len(buf)); k > 0; k-- {
				if strings.HasSuffix(buf, toolOpenTag[:k]) {
					keep = k
					break
				}
			}
			t.content(&out, buf[:len(buf)-keep])
			t.held = buf[len(buf)-keep:]
			return out.String(), calls
		}
		// The first closing tag that ends a complete JSON body closes the
		// block: one inside a string of the arguments does not.
		i, from := -1, 0
		for {
			j := strings.Index(buf[from:], toolCloseTag)
			if j < 0 {
				break
			}
			i = from + j
			if !truncatedJSON(buf[:i]) {
				break
			}
			from, i = i+1, -1
		}
		if i < 0 {
			t.held = buf
			return out.String(), calls
		}
		body := buf[:i]
		buf = buf[i+len(toolCloseTag):]
		t.inCall = false
		if c, ok := t.parse(body); ok {
			calls = append(calls, c)
			t.calls++
			t.ws = "" // whitespace before a call is not content
		} else {
			t.content(&out, toolOpenTag+body+toolCloseTag)
		}
	}
}

// Finish ends the text: an unfinished block and held text become content;
// trailing whitespace is kept only when there were no calls.
func (t *ToolScanner) Finish() string {
	var out strings.Builder
	rest := t.held
	if t.inCall {
		rest = toolOpenTag + rest
	}
	t.held, t.inCall = "", false
	t.content(&out, rest)
	if t.calls == 0 {
		out.WriteString(t.ws)
	}
	t.ws = ""
	return out.String()
}

// content writes s, holding back its trailing whitespace.
func (t *ToolScanner) content(out *strings.Builder, s string) {
	if s == "" {
		return
	}
	full := t.ws + s
	trimmed := strings.TrimRightFunc(full, unicode.IsSpace)
	t.ws = full[len(trimmed):]
	if trimmed == "" {
		return
	}
	out.WriteString(trimmed)
}

// truncatedJSON reports whether s is the beginning of a JSON value that
// has not ended yet.
func truncatedJSON(s string) bool {
	dec := json.NewDecoder(strings.NewReader(s))
	var v any
	err := dec.Decode(&v)
	return errors.Is(err, io.ErrUnexpectedEOF)
}

// parse reads a block body: {"name": ..., "arguments": {...}}.
func (t *ToolScanner) parse(body string) (engine.ToolCall, bool) {
	var c struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(body)), &c); err != nil || !t.known[c.Name] {
		return engine.ToolCall{}, false
	}
	args := bytes.TrimSpace(c.Arguments)
	var s string
	if json.Unmarshal(args, &s) == nil { // arguments given as a JSON string
		args = []byte(s)
	}
	if len(args) == 0 {
		args = []byte("{}")
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(args, &obj) != nil {
		return engine.ToolCall{}, false
	}
	var compact bytes.Buffer
	if json.Compact(&compact, args) != nil {
		return engine.ToolCall{}, false
	}
	return engine.ToolCall{Name: c.Name, Arguments: compact.String()}, true
}

package chat

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// compileValidator compiles schema with a real JSON-schema validator.
func compileValidator(t testing.TB, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func validate(t testing.TB, v *jsonschema.Schema, text string) {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("output does not parse: %v\n%s", err, text)
	}
	if err := v.Validate(inst); err != nil {
		t.Fatalf("output does not validate: %v\n%s", err, text)
	}
}

// randomWalk writes a random text the automaton accepts within budget
// bytes: at each step it picks a random byte among those the state takes
// and that leave room to close (MinClose), biased towards structure.
func randomWalk(t testing.TB, r *rand.Rand, s State, budget int) string {
	t.Helper()
	var out []byte
	var alphabet []byte
	for c := byte(' '); c < 0x7f; c++ {
		alphabet = append(alphabet, c)
	}
	alphabet = append(alphabet, '\n', '\t', 0xc3, 0xa9, 0xe2, 0x82, 0xac, 0x01, 0xff)
	for len(out) < budget {
		if s.Done() || s.Accepting() && r.IntN(4) == 0 {
			return string(out)
		}
		left := budget - len(out)
		var options []State
		var bytesOK []byte
		for _, c := range alphabet {
			if next, ok := s.Step(c); ok && next.MinClose() <= left-1 {
				options = append(options, next)
				bytesOK = append(bytesOK, c)
			}
		}
		if len(options) == 0 && s.Accepting() {
			return string(out) // e.g. a number at its digit limit
		}
		if len(options) == 0 {
			t.Fatalf("stuck after %q (MinClose %d, %d left)", out, s.MinClose(), left)
		}
		i := r.IntN(len(options))
		s = options[i]
		out = append(out, bytesOK[i])
	}
	if !s.Accepting() {
		t.Fatalf("budget spent on an incomplete text %q", out)
	}
	return string(out)
}

var schemas = []string{
	`{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"ok":{"type":"boolean"}},"required":["name","age","ok"],"additionalProperties":false}`,
	`{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"string","maxLength":3},"c":{"type":"null"},"d":{"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3}},"required":["d"]}`,
	`{"type":"object","properties":{"color":{"enum":["red","green","blue",1,10,null]},"nested":{"type":"object","properties":{"x":{"type":["string","null"]},"y":{"anyOf":[{"type":"integer"},{"type":"object","properties":{"z":{"const":"zz"}},"required":["z"]}]}},"required":["x","y"]}},"required":["color","nested"]}`,
	`{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},"$ref":"#/$defs/node"}`,
	`{"type":"array","items":{"type":"string","minLength":2},"minItems":2}`,
	`{"type":"object"}`,
	`{}`,
	`{"type":"string","enum":["a\"b","é","\u0001"]}`,
}

func TestSchemaAutomatonOutputValidates(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i, src := range schemas {
		node, err := CompileSchema([]byte(src))
		if err != nil {
			t.Fatalf("schema %d: %v", i, err)
		}
		v := compileValidator(t, src)
		start := NewState(node)
		for run := range 300 {
			budget := start.MinClose() + r.IntN(120)
			text := randomWalk(t, r, start, budget)
			if !json.Valid([]byte(text)) {
				t.Fatalf("schema %d run %d: invalid JSON %q", i, run, text)
			}
			validate(t, v, text)
		}
	}
}

func TestMinCloseIsExact(t *testing.T) {
	// From any reachable state, some byte lowers MinClose by exactly one,
	// down to an accepting state: the budget rule can always be met.
	r := rand.New(rand.NewPCG(7, 8))
	for i, src := range schemas {
		node, _ := CompileSchema([]byte(src))
		v := compileValidator(t, src)
		for range 100 {
			s := NewState(node)
			prefix := randomWalk(t, r, s, s.MinClose()+r.IntN(40))
			s, _ = NewState(node).StepBytes([]byte(prefix))
			text := []byte(prefix)
			for s.MinClose() > 0 {
				want := s.MinClose() - 1
				found := false
				for c := range 256 {
					if next, ok := s.Step(byte(c)); ok && next.MinClose() == want {
						s, found = next, true
						text = append(text, byte(c))
						break
					}
				}
				if !found {
					t.Fatalf("schema %d: no byte closes %q (MinClose %d)", i, text, want+1)
				}
			}
			validate(t, v, string(text))
		}
	}
}

func TestAutomatonAcceptsAndRejects(t *testing.T) {
	node, err := CompileSchema([]byte(schemas[0]))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		text   string
		accept bool // a complete, valid value
		prefix bool // a valid prefix
	}{
		{`{"name": "Ann", "age": 30, "ok": true}`, true, true},
		{` {"name":"A\u00e9\n","age":-0,"ok":false}`, true, true},
		{`{"name": "Ann", "age": 30}`, false, false}, // '}' before a required key
		{`{"age": 30`, false, false},                 // wrong order
		{`{"name": 5`, false, false},                 // wrong type
		{`{"name": "x", "age": 1.5`, false, false},   // not an integer
		{`{"name": "x", "age": 01`, false, false},    // leading zero
		{`{"name": "x", "extra"`, false, false},      // undeclared key
		{`{"name": "\ud800`, false, false},           // lone surrogate escape
		{"{\"name\": \"\x01", false, false},          // raw control character
		{"{\"name\": \"\xff", false, false},          // invalid UTF-8
		{`{"name": "x", "age": 12, "ok": tr`, false, true},
	}
	for _, c := range cases {
		s, ok := NewState(node).StepBytes([]byte(c.text))
		if ok != c.prefix && !(c.accept && ok) {
			t.Errorf("%q: prefix ok = %v, want %v", c.text, ok, c.prefix)
			continue
		}
		if ok && s.Accepting() != c.accept {
			t.Errorf("%q: accepting = %v, want %v", c.text, s.Accepting(), c.accept)
		}
		if c.accept && !s.Done() {
			t.Errorf("%q: a closed object must be done", c.text)
		}
	}
	// Any JSON object (json_object).
	for _, text := range []string{`{}`, `{"a":[1,{"b":null}],"c":"d"}`, `{ "x" : -1.5e+3 , "y":[ ] }`} {
		s, ok := NewState(AnyObject()).StepBytes([]byte(text))
		if !ok || !s.Done() {
			t.Errorf("json_object rejected %q", text)
		}
	}
	for _, text := range []string{`[]`, `"s"`, `{"a":}`, `{"a" 1}`, `{,}`, `{"a":1,}`} {
		if s, ok := NewState(AnyObject()).StepBytes([]byte(text)); ok && s.Accepting() {
			t.Errorf("json_object accepted %q", text)
		}
	}
	// Whitespace is bounded.
	if _, ok := NewState(AnyObject()).StepBytes(bytes.Repeat([]byte(" "), maxWhitespace+1)); ok {
		t.Error("unbounded leading whitespace accepted")
	}
	// A top-level number ends only at the end of the text.
	s, ok := NewState(finish(&Node{kind: kAny})).StepBytes([]byte("12"))
	if !ok || !s.Accepting() || s.Done() {
		t.Errorf("top-level 12: ok=%v accepting=%v done=%v", ok, s.Accepting(), s.Done())
	}
}

func TestCompileSchemaRefusals(t *testing.T) {
	for _, src := range []string{
		`{"type":"string","pattern":"^a"}`,
		`{"type":"integer","minimum":3}`,
		`{"anyOf":[{"type":"string"},{"enum":["a"]}]}`,
		`{"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]}`,
		`{"$ref":"#/components/x"}`,
		`{"type":"object","required":["x"]}`,
		`{"type":"wat"}`,
		`false`,
		`{"type":"string"`,
	} {
		if _, err := CompileSchema([]byte(src)); err == nil {
			t.Errorf("CompileSchema(%s) must fail", src)
		}
	}
}

// FuzzSchemaAutomaton feeds arbitrary bytes: whatever the automaton takes
// as a complete value must parse and validate against the schema.
func FuzzSchemaAutomaton(f *testing.F) {
	for _, s := range []string{`{"name":"a","age":1,"ok":true}`, `{"d":[1,2]}`, `{"color":10,"nested":{"x":null,"y":{"z":"zz"}}}`, `{}`, `[1]`} {
		f.Add(s)
	}
	type compiled struct {
		node *Node
		v    *jsonschema.Schema
	}
	var all []compiled
	for _, src := range schemas {
		n, err := CompileSchema([]byte(src))
		if err != nil {
			f.Fatal(err)
		}
		all = append(all, compiled{n, compileValidator(f, src)})
	}
	f.Fuzz(func(t *testing.T, text string) {
		for _, c := range all {
			s, ok := NewState(c.node).StepBytes([]byte(text))
			if !ok || !s.Accepting() {
				continue
			}
			validate(t, c.v, text)
		}
	})
}

package prefix

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

const model = "onnx/llama/tiny"

func mustHashes(t *testing.T, body string) []uint64 {
	t.Helper()
	tools, msgs, err := parseRequestForTest([]byte(body))
	if err != nil {
		t.Fatalf("parse %s: %v", body, err)
	}
	return Hashes(model, tools, msgs)
}

func TestHashesStable(t *testing.T) {
	body := `{"model":"tiny","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`
	h := mustHashes(t, body)
	if len(h) != 2 || h[0] == h[1] {
		t.Fatalf("hashes = %x, want two distinct", h)
	}
	// Pinned: a change to the canonical form must bump the domain, since
	// nodes of different versions would otherwise disagree silently.
	if got := fmt.Sprintf("%016x %016x", h[0], h[1]); got != pinned {
		t.Fatalf("hashes changed: %s, pinned %s", got, pinned)
	}
	if again := mustHashes(t, body); !slices.Equal(h, again) {
		t.Fatalf("not deterministic: %x vs %x", h, again)
	}
}

// pinned are the hashes of TestHashesStable's body, computed independently
// of this package with Python's hashlib:
//
//	h = sha256(b"infermesh/prefix/v1\n" + b'{"model":"onnx/llama/tiny"}')
//	h = sha256(h + b'{"role":"system","content":"Be brief."}')  -> h[:8]
//	h = sha256(h + b'{"role":"user","content":"Hi"}')           -> h[:8]
const pinned = "f1ffbdd3f9a08010 0ca67b65a35c8b24"

func TestHashesIgnoreUnhashedFields(t *testing.T) {
	base := mustHashes(t, `{"model":"a","messages":[{"role":"user","content":"Hi"}]}`)
	for _, body := range []string{
		`{"model":"b","stream":true,"temperature":0.2,"max_tokens":9,"seed":1,"user":"u","stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hi"}]}`,
		`{"messages":[{"content":"Hi","role":"user"}],"model":"a"}`,
		"{\n  \"model\": \"a\",\n  \"messages\": [ { \"role\": \"user\", \"content\": \"Hi\", \"refusal\": null } ]\n}",
		// Text-only parts are joined as the API layer joins them.
		`{"model":"a","messages":[{"role":"user","content":[{"type":"text","text":"H"},{"type":"text","text":"i"}]}]}`,
	} {
		if got := mustHashes(t, body); !slices.Equal(got, base) {
			t.Errorf("%s: hashes %x, want %x", body, got, base)
		}
	}
}

func TestHashesOrderAndContentSensitive(t *testing.T) {
	ab := mustHashes(t, `{"messages":[{"role":"user","content":"A"},{"role":"assistant","content":"B"}]}`)
	ba := mustHashes(t, `{"messages":[{"role":"assistant","content":"B"},{"role":"user","content":"A"}]}`)
	if ab[1] == ba[1] || ab[0] == ba[0] {
		t.Fatalf("order does not matter: %x %x", ab, ba)
	}
	distinct := map[uint64]string{}
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"A"}]}`,
		`{"messages":[{"role":"system","content":"A"}]}`,
		`{"messages":[{"role":"user","content":"A "}]}`,
		`{"messages":[{"role":"user","content":"A","name":"bob"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"A"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]}]}`,
		`{"messages":[{"role":"user","content":"A"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c2","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`,
		`{"messages":[{"role":"tool","content":"1","tool_call_id":"c1"}]}`,
		`{"messages":[{"role":"tool","content":"1","tool_call_id":"c2"}]}`,
	} {
		h := mustHashes(t, body)[0]
		if prev, dup := distinct[h]; dup {
			t.Fatalf("%s and %s hash alike", prev, body)
		}
		distinct[h] = body
	}
	// The model is part of every hash.
	_, msgs, _ := parseRequestForTest([]byte(`{"messages":[{"role":"user","content":"A"}]}`))
	if Hashes("m1", nil, msgs)[0] == Hashes("m2", nil, msgs)[0] {
		t.Fatal("the model does not change the hash")
	}
}

func TestHashesChain(t *testing.T) {
	long := mustHashes(t, `{"messages":[{"role":"system","content":"S"},{"role":"user","content":"U1"},{"role":"assistant","content":"A1"},{"role":"user","content":"U2"}]}`)
	short := mustHashes(t, `{"messages":[{"role":"system","content":"S"},{"role":"user","content":"U1"}]}`)
	if !slices.Equal(long[:2], short) {
		t.Fatalf("a longer conversation does not extend the shorter one's hashes: %x vs %x", long, short)
	}
}

func TestToolSchemaWhitespace(t *testing.T) {
	a := mustHashes(t, `{"messages":[{"role":"user","content":"A"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}]}`)
	b := mustHashes(t, `{"messages":[{"role":"user","content":"A"}],"tools":[{"type":"function","function":{"name":"f","parameters":{ "type" : "object", "properties" : { } }}}]}`)
	if !slices.Equal(a, b) {
		t.Fatal("schema whitespace changes the hash")
	}
}

func TestParseRequestRejects(t *testing.T) {
	for _, body := range []string{``, `[]`, `{"messages":[]}`, `{"model":"a"}`, `{"messages":[{"role":"user","content":7}]}`} {
		if _, _, err := parseRequestForTest([]byte(body)); err == nil {
			t.Errorf("%q parsed", body)
		}
		if h := RequestHashes(model, []byte(body)); h != nil {
			t.Errorf("%q: hashes %x", body, h)
		}
	}
}

// TestServedMatchesNextTurn is the property routing relies on: what the
// serving node records from the engine's view of a turn is what the
// entry node computes from the raw body of the next turn.
func TestServedMatchesNextTurn(t *testing.T) {
	params := json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}}}`)
	req := engine.ChatRequest{
		Messages: []engine.ChatMessage{
			{Role: engine.RoleSystem, Content: "You are terse."},
			{Role: engine.RoleUser, Content: "look at this", Parts: []engine.ContentPart{{Text: "look at "}, {ImageURL: "data:image/png;base64,AA", Detail: "low"}, {Text: "this"}}},
			{Role: engine.RoleAssistant, ToolCalls: []engine.ToolCall{{ID: "call_1", Name: "weather", Arguments: `{"city":"Oslo"}`}}},
			{Role: engine.RoleTool, Content: "rain", ToolCallID: "call_1"},
		},
		Tools:       []engine.Tool{{Name: "weather", Description: "Weather now", Parameters: params}},
		Temperature: new(float64),
	}
	answer := engine.ChatMessage{Content: "It rains in Oslo."}
	rec := Served(model, req, answer)
	if len(rec) != 2 {
		t.Fatalf("served = %x", rec)
	}
	// The same turn as the client sent it, and the next turn.
	turn := `{"model":"x","stream":true,"tools":[{"type":"function","function":{"name":"weather","description":"Weather now","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
	"messages":[{"role":"system","content":"You are terse."},
	{"role":"user","content":[{"type":"text","text":"look at "},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA","detail":"low"}},{"type":"text","text":"this"}]},
	{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Oslo\"}"}}]},
	{"role":"tool","content":"rain","tool_call_id":"call_1"}`
	this := mustHashes(t, turn+`]}`)
	next := mustHashes(t, turn+`,{"role":"assistant","content":"It rains in Oslo."},{"role":"user","content":"And tomorrow?"}]}`)
	if rec[0] != this[len(this)-1] {
		t.Fatalf("the recorded prompt %x is not the request's hash %x", rec[0], this[len(this)-1])
	}
	if len(next) != 6 || rec[1] != next[4] {
		t.Fatalf("the recorded conversation %x is not the next turn's prefix %x", rec[1], next)
	}
	tr := NewTracker(TrackerConfig{})
	tr.Record(rec...)
	if k := tr.Longest(next); k != 5 {
		t.Fatalf("longest recorded prefix of the next turn = %d, want 5", k)
	}
	if k := tr.Digest().Longest(next); k != 5 {
		t.Fatalf("longest digest prefix of the next turn = %d, want 5", k)
	}
	if Served(model, engine.ChatRequest{}, answer) != nil {
		t.Fatal("an empty request records something")
	}
}

// BenchmarkRequestHashes measures the entry node's cost per chat request:
// parsing and hashing a 20-message conversation of about 4 KB.
func BenchmarkRequestHashes(b *testing.B) {
	msgs := []map[string]string{{"role": "system", "content": "You are a helpful assistant."}}
	for i := 0; i < 19; i++ {
		role := []string{"user", "assistant"}[i%2]
		msgs = append(msgs, map[string]string{"role": role, "content": fmt.Sprintf("%0200d", i)})
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "stream": true, "messages": msgs})
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if len(RequestHashes(model, body)) != 20 {
			b.Fatal("wrong number of hashes")
		}
	}
}

// BenchmarkDigest measures building the default digest after a served turn.
func BenchmarkDigest(b *testing.B) {
	tr := NewTracker(TrackerConfig{})
	for i := uint64(0); i < DefaultCapacity; i++ {
		tr.Record(i * 0x9e3779b97f4a7c15)
	}
	for b.Loop() {
		tr.Digest()
	}
}

// TestCacheKeyAffinity: requests sharing a prompt_cache_key share its
// hash as their shortest prefix, and the node that served one of them
// holds it, so another conversation with the key finds that node (with a
// match of 1, below any longer prefix); without the key, nothing matches.
func TestCacheKeyAffinity(t *testing.T) {
	a := `{"model":"m","prompt_cache_key":"tenant-7","messages":[{"role":"user","content":"first conversation"}]}`
	b := `{"model":"m","prompt_cache_key":"tenant-7","messages":[{"role":"user","content":"another one"}]}`
	c := `{"model":"m","prompt_cache_key":"tenant-8","messages":[{"role":"user","content":"another one"}]}`
	d := `{"model":"m","messages":[{"role":"user","content":"another one"}]}`
	ha := RequestHashes(model, []byte(a))
	if len(ha) != 2 || ha[0] != KeyHash(model, "tenant-7") {
		t.Fatalf("hashes of a keyed body: %x", ha)
	}
	// The messages' own hashes do not change with the key.
	if hd := RequestHashes(model, []byte(d)); !slices.Equal(RequestHashes(model, []byte(b))[1:], hd) {
		t.Fatal("the key changed the message hashes")
	}
	_, msgs, err := parseRequestForTest([]byte(a))
	if err != nil {
		t.Fatal(err)
	}
	req := engine.ChatRequest{CacheKey: "tenant-7", Messages: []engine.ChatMessage{{Role: engine.RoleUser, Content: msgs[0].Content}}}
	tr := NewTracker(TrackerConfig{})
	tr.Record(Served(model, req, engine.ChatMessage{Content: "answer"})...)
	dg := tr.Digest()
	for body, want := range map[string]int{b: 1, c: 0, d: 0} {
		if got := dg.Longest(RequestHashes(model, []byte(body))); got != want {
			t.Errorf("%s: longest match %d, want %d", body, got, want)
		}
	}
	if KeyHash(model, "k") == KeyHash("other/model/x", "k") {
		t.Error("the key's hash does not depend on the model")
	}
}

// parseRequestForTest is parseRequest without the cache key.
func parseRequestForTest(body []byte) ([]Tool, []Message, error) {
	tools, msgs, _, err := parseRequest(body)
	return tools, msgs, err
}

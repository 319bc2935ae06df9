// Package upstreamtest is a test double of an OpenAI-compatible provider's
// HTTP API, for tests of the upstream runtime and of nodes that use it (the
// one double the house rules allow: the provider lives outside the
// project).
package upstreamtest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/infermesh/infermesh/node/apierr"
)

// Provider speaks the OpenAI wire format on /v1/chat/completions (JSON
// and server-sent events), /v1/embeddings, /v1/images/generations and
// /v1/audio/speech (a tone per word, see speech). It
// answers from the request: chat echoes the last user message ("echo:
// ...", an image part read as "[image]"), word by word when streamed, and
// answers with tool calls when tools are given; embeddings are Vector of
// each input; images are n PNGs (Image of the prompt), as base64 or as
// URLs under https://images.invalid/ (the image model "b64-only" refuses
// response_format with a 400, as some real ones do). Some model names answer with errors:
// "bad-params" 400 (param temperature, code invalid_value),
// "rate-limited" 429 (Retry-After 7), "broken" 500, "overloaded" 503
// (Retry-After 3), "hang" never answers, "cut-off" breaks its stream off,
// and the embeddings model "short" returns one vector too few. With a key
// set, requests without "Bearer <key>" get 401.
type Provider struct {
	srv *httptest.Server
	key string

	mu     sync.Mutex
	bodies []map[string]any // every request body, in order
	auths  []string
}

// NewProvider starts a provider that requires key ("" for none); it stops
// when the test ends.
func NewProvider(t testing.TB, key string) *Provider {
	d := &Provider{key: key}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", d.chat)
	mux.HandleFunc("POST /v1/embeddings", d.embeddings)
	mux.HandleFunc("POST /v1/images/generations", d.images)
	mux.HandleFunc("POST /v1/audio/speech", d.speech)
	d.srv = httptest.NewServer(mux)
	t.Cleanup(d.srv.Close)
	return d
}

// URL is the provider's base URL, ending in /v1.
func (d *Provider) URL() string { return d.srv.URL + "/v1" }

// Requests is the number of requests received.
func (d *Provider) Requests() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.bodies)
}

// Last returns the last request body and Authorization header.
func (d *Provider) Last() (map[string]any, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.bodies[len(d.bodies)-1], d.auths[len(d.auths)-1]
}

func writeErr(w http.ResponseWriter, status int, msg, typ, param, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": param, "code": code}})
}

// read records the request and applies the key check and the error models.
func (d *Provider) read(w http.ResponseWriter, r *http.Request) (map[string]any, bool) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		writeErr(w, 400, "bad json", apierr.TypeInvalidRequest, "", apierr.CodeInvalidJSON)
		return nil, false
	}
	d.mu.Lock()
	d.bodies = append(d.bodies, body)
	d.auths = append(d.auths, r.Header.Get("Authorization"))
	d.mu.Unlock()
	if d.key != "" && r.Header.Get("Authorization") != "Bearer "+d.key {
		// Real providers quote part of the key they got.
		writeErr(w, 401, "Incorrect API key provided: "+r.Header.Get("Authorization"), apierr.TypeInvalidRequest, "", apierr.CodeInvalidAPIKey)
		return nil, false
	}
	switch body["model"] {
	case "bad-params":
		writeErr(w, 400, "temperature is out of range for this model", apierr.TypeInvalidRequest, "temperature", apierr.CodeInvalidValue)
		return nil, false
	case "rate-limited":
		w.Header().Set("Retry-After", "7")
		writeErr(w, 429, "slow down", apierr.TypeRateLimit, "", apierr.CodeRateLimit)
		return nil, false
	case "broken":
		writeErr(w, 500, "the GPU fell over", apierr.TypeServer, "", "")
		return nil, false
	case "overloaded":
		w.Header().Set("Retry-After", "3")
		writeErr(w, 503, "overloaded", apierr.TypeServer, "", "")
		return nil, false
	case "hang":
		<-r.Context().Done()
		return nil, false
	}
	return body, true
}

// lastUser is the content of the last user message.
func lastUser(body map[string]any) string {
	msgs, _ := body["messages"].([]any)
	for i := len(msgs) - 1; i >= 0; i-- {
		m, _ := msgs[i].(map[string]any)
		if m["role"] != "user" {
			continue
		}
		if parts, ok := m["content"].([]any); ok {
			var words []string
			for _, p := range parts {
				p, _ := p.(map[string]any)
				if p["type"] == "image_url" {
					words = append(words, "[image]")
				} else if t, ok := p["text"].(string); ok {
					words = append(words, t)
				}
			}
			return strings.Join(words, " ")
		}
		s, _ := m["content"].(string)
		return s
	}
	return ""
}

func (d *Provider) chat(w http.ResponseWriter, r *http.Request) {
	body, ok := d.read(w, r)
	if !ok {
		return
	}
	words := strings.Fields("echo: " + lastUser(body))
	_, tools := body["tools"]
	stream, _ := body["stream"].(bool)
	usage := map[string]any{"prompt_tokens": len(strings.Fields(lastUser(body))), "completion_tokens": len(words), "total_tokens": 0}
	if !stream {
		msg := map[string]any{"role": "assistant", "content": strings.Join(words, " ")}
		finish := "stop"
		if tools {
			msg["content"] = nil
			msg["tool_calls"] = []any{map[string]any{"id": "call_1", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": `{"city":"Oslo"}`}}}
			finish = "tool_calls"
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"id": "x", "object": "chat.completion",
			"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}}, "usage": usage})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		w.(http.Flusher).Flush()
	}
	chunk := func(delta map[string]any, finish any) map[string]any {
		return map[string]any{"object": "chat.completion.chunk", "choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
	}
	send(chunk(map[string]any{"role": "assistant", "content": ""}, nil))
	fmt.Fprint(w, ": keep-alive\n\n")
	if body["model"] == "cut-off" {
		send(chunk(map[string]any{"content": "half"}, nil))
		return // the connection ends without finish_reason or [DONE]
	}
	if tools {
		// Two calls, each in fragments, as OpenAI streams them.
		for i, name := range []string{"get_weather", "get_time"} {
			send(chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": fmt.Sprintf("call_%d", i), "type": "function", "function": map[string]any{"name": name, "arguments": ""}}}}, nil))
			for _, part := range []string{`{"city"`, `:"Oslo"`, `}`} {
				send(chunk(map[string]any{"tool_calls": []any{map[string]any{"index": i, "function": map[string]any{"arguments": part}}}}, nil))
			}
		}
		send(chunk(map[string]any{}, "tool_calls"))
	} else {
		for i, word := range words {
			if i > 0 {
				word = " " + word
			}
			send(chunk(map[string]any{"content": word}, nil))
		}
		send(chunk(map[string]any{}, "stop"))
	}
	if so, _ := body["stream_options"].(map[string]any); so["include_usage"] == true {
		send(map[string]any{"object": "chat.completion.chunk", "choices": []any{}, "usage": usage})
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// Vector is the provider's embedding of a text: its length, its first
// byte and its word count, then zeros up to dims.
func Vector(text string, dims int) []float32 {
	v := make([]float32, dims)
	v[0] = float32(len(text))
	if dims > 1 && text != "" {
		v[1] = float32(text[0])
	}
	if dims > 2 {
		v[2] = float32(len(strings.Fields(text)))
	}
	return v
}

func (d *Provider) embeddings(w http.ResponseWriter, r *http.Request) {
	body, ok := d.read(w, r)
	if !ok {
		return
	}
	dims := 8
	if n, ok := body["dimensions"].(float64); ok {
		dims = int(n)
	}
	var texts []string
	switch in := body["input"].(type) {
	case string:
		texts = []string{in}
	case []any:
		for _, x := range in {
			switch x := x.(type) {
			case string:
				texts = append(texts, x)
			case []any:
				texts = append(texts, strings.Repeat("t", len(x)))
			}
		}
	}
	if body["model"] == "short" {
		texts = texts[:len(texts)-1]
	}
	data := make([]any, 0, len(texts))
	// Answer in reverse order: the index says where each vector belongs.
	for i := len(texts) - 1; i >= 0; i-- {
		data = append(data, map[string]any{"object": "embedding", "index": i, "embedding": Vector(texts[i], dims)})
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data, "usage": map[string]int{"prompt_tokens": len(texts) * 2, "total_tokens": len(texts) * 2}})
}

// Image is the provider's picture of a prompt: a 4x4 PNG filled with a
// colour taken from the prompt's bytes.
func Image(prompt string) []byte {
	var r, g, b byte
	for i := 0; i < len(prompt); i++ {
		r, g, b = r+prompt[i], g^prompt[i], b+byte(i)
	}
	img := image.NewNRGBA(image.Rect(0, 0, 4, 4))
	for i := 0; i < len(img.Pix); i += 4 {
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = r, g, b, 255
	}
	var buf bytes.Buffer
	png.Encode(&buf, img)
	return buf.Bytes()
}

func (d *Provider) images(w http.ResponseWriter, r *http.Request) {
	body, ok := d.read(w, r)
	if !ok {
		return
	}
	if _, ok := body["response_format"]; ok && body["model"] == "b64-only" {
		writeErr(w, 400, "Unknown parameter: 'response_format'.", apierr.TypeInvalidRequest, "response_format", apierr.CodeUnknownParam)
		return
	}
	prompt, _ := body["prompt"].(string)
	if prompt == "" {
		writeErr(w, 400, "prompt is required", apierr.TypeInvalidRequest, "prompt", apierr.CodeMissingParam)
		return
	}
	n := 1
	if v, ok := body["n"].(float64); ok {
		n = int(v)
	}
	data := make([]any, n)
	for i := range data {
		im := map[string]any{"revised_prompt": "revised: " + prompt}
		if body["response_format"] == "url" {
			im["url"] = fmt.Sprintf("https://images.invalid/%d.png", i)
		} else {
			im["b64_json"] = base64.StdEncoding.EncodeToString(Image(prompt))
		}
		data[i] = im
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"created": 1700000000, "data": data})
}

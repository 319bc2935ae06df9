package onnx

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/chat"
)

// TestChatContextCap: no chat model may declare a context window above the
// API's cap of 131072 tokens (loading refuses it), a window at the cap
// loads, and a prompt longer than the model's window is a 400 on
// "messages" rather than a truncated run.
func TestChatContextCap(t *testing.T) {
	dir := genTinyLlama(t, "fp32")
	r := testRuntime(t, Config{})
	for _, tc := range []struct {
		window string
		ok     bool
	}{{"131073", false}, {"1000000", false}, {"131072", true}} {
		spec := manifestSpec(t, dir)
		spec.Options["context_window"] = tc.window
		c, err := r.LoadChat(spec)
		if tc.ok {
			if err != nil {
				t.Fatalf("context_window %s: %v", tc.window, err)
			}
			c.Close()
			continue
		}
		if err == nil {
			c.Close()
			t.Fatalf("context_window %s above the cap of %d was accepted", tc.window, chat.MaxContextTokens)
		}
	}
	// The generated model's own window (2048) bounds the prompt.
	c, err := r.LoadChat(manifestSpec(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Chat(context.Background(), engine.ChatRequest{Messages: userMsg(strings.Repeat("zq ", 3000))}, nil)
	var ie *engine.InputError
	if !errors.As(err, &ie) || ie.Param != "messages" || !errors.Is(err, engine.ErrInvalidInput) {
		t.Fatalf("prompt over the window: %v, want a 400 on messages", err)
	}
}

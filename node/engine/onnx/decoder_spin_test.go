package onnx

import (
	"context"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
)

// TestDecoderThreadSpinning: the thread_spinning option loads with "on"
// and "off" (the default), both give the same greedy answer, and any other
// value is a load error naming the option.
func TestDecoderThreadSpinning(t *testing.T) {
	dir := genTinyLlama(t, "fp32")
	r := testRuntime(t, Config{})
	var answers []string
	for _, v := range []string{"", "off", "on"} {
		spec := manifestSpec(t, dir)
		spec.Options[spinningOption] = v
		c, err := r.LoadChat(spec)
		if err != nil {
			t.Fatalf("%s=%q: %v", spinningOption, v, err)
		}
		if d := c.(*decoder); d.spin != (v == "on") {
			t.Errorf("%s=%q: spin %v", spinningOption, v, d.spin)
		}
		resp, err := c.Chat(context.Background(), engine.ChatRequest{Messages: userMsg("Tell me about the bridge."), MaxTokens: 12, Temperature: temp(0)}, nil)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		answers = append(answers, resp.Message.Content)
	}
	if answers[0] != answers[1] || answers[1] != answers[2] {
		t.Fatalf("answers differ with the spinning setting: %q", answers)
	}
	spec := manifestSpec(t, dir)
	spec.Options[spinningOption] = "yes"
	if c, err := r.LoadChat(spec); err == nil {
		c.Close()
		t.Fatal("thread_spinning=yes was accepted")
	} else if !strings.Contains(err.Error(), spinningOption) {
		t.Fatalf("error %q does not name the option", err)
	}
}

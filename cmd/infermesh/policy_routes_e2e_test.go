package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"testing"
	"time"
)

// smallPNG is a data URL of a 16x16 image.
func smallPNG(t *testing.T) string {
	img := image.NewNRGBA(image.Rect(0, 0, 16, 16))
	for i := range img.Pix {
		img.Pix[i] = uint8(i * 7)
	}
	img.Set(3, 3, color.White)
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

// TestPolicyOnEveryModelRoute: a blocked model is refused on the vision
// routes (named: 403 model_blocked; by default: not picked), vision calls
// without a model are admitted and counted, and a deprecated model carries
// X-AI-Model-Deprecated on GET /v1/models/{id} and batch submissions.
func TestPolicyOnEveryModelRoute(t *testing.T) {
	p := startNode(t, "policy-routes", "tiny-bert", "isnet")
	setPolicy := func(doc string) {
		t.Helper()
		if code, _, err := adminReq(p, "PUT", "/v1/server/policy", json.RawMessage(doc), nil); err != nil || code != 200 {
			t.Fatalf("policy %s: %d %v", doc, code, err)
		}
	}
	img := smallPNG(t)
	setPolicy(`{"models":{"onnx/isnet/general-use-small":{"lifecycle":"blocked"},"onnx/tiny-bert/test-128":{"lifecycle":"deprecated","replacement":"onnx/tiny-bert/v2"}}}`)
	for _, id := range []string{"onnx/isnet/general-use-small", "isnet:small"} {
		if st, code, _, err := postRaw(p, "/v1/vision/background", map[string]any{"model": id, "image": img}); err != nil || st != 403 || code != "model_blocked" {
			t.Errorf("blocked %s: %d %s %v, want 403 model_blocked", id, st, code, err)
		}
	}
	if st, code, _, err := postRaw(p, "/v1/vision/background", map[string]any{"image": img}); err != nil || st != 501 {
		t.Errorf("background without a model while the only one is blocked: %d %s %v, want 501", st, code, err)
	}
	for _, path := range []string{"/v1/models/onnx/tiny-bert/test-128", "/v1/models/tiny-bert:test-128"} {
		resp, err := http.Get(p.url(path))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("X-AI-Model-Deprecated"); resp.StatusCode != 200 || got != "onnx/tiny-bert/v2" {
			t.Errorf("GET %s: %d, X-AI-Model-Deprecated %q", path, resp.StatusCode, got)
		}
	}
	body, _ := json.Marshal(map[string]any{"model": "tiny-bert:test-128", "input": []string{"a", "b"}})
	resp, err := http.Post(p.url("/v1/batch/embeddings"), "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-AI-Model-Deprecated"); resp.StatusCode != 200 || got != "onnx/tiny-bert/v2" {
		t.Errorf("batch submission: %d, X-AI-Model-Deprecated %q", resp.StatusCode, got)
	}

	// Unblocked, a call without a model is served by the default model and
	// counted toward usage like any other.
	setPolicy(`{}`)
	if st, code, _, err := postRaw(p, "/v1/vision/background", map[string]any{"image": img}); err != nil || st != 200 {
		t.Fatalf("background without a model: %d %s %v", st, code, err)
	}
	eventually(t, 10*time.Second, "vision call counted", func() error {
		var u struct {
			Data []struct {
				Group    string `json:"group"`
				Requests int64  `json:"requests"`
			} `json:"data"`
		}
		if _, _, err := adminReq(p, "GET", "/v1/server/usage?by=model", nil, &u); err != nil {
			return err
		}
		for _, r := range u.Data {
			if r.Group == "onnx/isnet/general-use-small" && r.Requests >= 1 {
				return nil
			}
		}
		return fmt.Errorf("usage by model: %+v", u.Data)
	})
}

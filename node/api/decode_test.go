package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/apierr"
)

func TestParseEmbeddings(t *testing.T) {
	ok := []struct {
		body   string
		texts  int
		tokens int
		b64    bool
		dims   int
	}{
		{`{"model":"m","input":"hello"}`, 1, 0, false, 0},
		{`{"model":"m","input":["a","b","c"],"encoding_format":"base64"}`, 3, 0, true, 0},
		{`{"model":"m","input":[1,2,3],"encoding_format":"float"}`, 0, 1, false, 0},
		{`{"model":"m","input":[[1,2],[3]],"dimensions":8,"user":"u"}`, 0, 2, false, 8},
		{" \n{\"model\":\"m\",\"input\":\"x\"}\n ", 1, 0, false, 0},
	}
	for _, c := range ok {
		p, err := parseEmbeddings([]byte(c.body))
		if err != nil {
			t.Errorf("%s: %v", c.body, err)
			continue
		}
		if len(p.Texts) != c.texts || len(p.Tokens) != c.tokens || p.Base64 != c.b64 || p.Dimensions != c.dims {
			t.Errorf("%s: got %+v", c.body, p)
		}
	}
	bad := []struct{ body, code, param string }{
		{``, apierr.CodeInvalidJSON, ""},
		{`null`, apierr.CodeInvalidJSON, ""},
		{`{"model":"m","input":"x"} {}`, apierr.CodeInvalidJSON, ""},
		{`{"model":"m","input":"x"`, apierr.CodeInvalidJSON, ""},
		{`{"input":"x"}`, apierr.CodeMissingParam, "model"},
		{`{"model":"m"}`, apierr.CodeMissingParam, "input"},
		{`{"model":"m","input":null}`, apierr.CodeMissingParam, "input"},
		{`{"model":"m","input":""}`, apierr.CodeInvalidValue, "input"},
		{`{"model":"m","input":[]}`, apierr.CodeInvalidValue, "input"},
		{`{"model":"m","input":[[]]}`, apierr.CodeInvalidValue, "input"},
		{`{"model":"m","input":[-1]}`, apierr.CodeInvalidValue, "input"},
		{`{"model":"m","input":[1.5]}`, apierr.CodeInvalidType, "input"},
		{`{"model":"m","input":{"a":1}}`, apierr.CodeInvalidType, "input"},
		{`{"model":["m"],"input":"x"}`, apierr.CodeInvalidType, "model"},
		{`{"model":"m","input":"x","dimensions":"4"}`, apierr.CodeInvalidType, "dimensions"},
		{`{"model":"m","input":"x","dimensions":0}`, apierr.CodeInvalidValue, "dimensions"},
		{`{"model":"m","input":"x","encoding_format":"hex"}`, apierr.CodeInvalidValue, "encoding_format"},
		{`{"model":"m","input":"x","extra":true}`, apierr.CodeUnknownParam, "extra"},
		{`{"model":"` + strings.Repeat("m", 300) + `","input":"x"}`, apierr.CodeInvalidValue, "model"},
	}
	for _, c := range bad {
		_, err := parseEmbeddings([]byte(c.body))
		var ae *apierr.Error
		if !errors.As(err, &ae) {
			t.Errorf("%.50s: want apierr.Error, got %v", c.body, err)
			continue
		}
		if ae.Status != 400 || ae.Code != c.code || (c.param == "" && ae.Param != nil) || (c.param != "" && ae.Param != c.param) {
			t.Errorf("%.50s: got %d %v %v (%s), want 400 %s %q", c.body, ae.Status, ae.Code, ae.Param, ae.Message, c.code, c.param)
		}
	}
}

// FuzzParseEmbeddings: no input may panic, and every rejection is a 400
// apierr.Error with a message.
func FuzzParseEmbeddings(f *testing.F) {
	for _, s := range []string{`{"model":"m","input":"x"}`, `{"model":"m","input":[[1,2],[3]]}`, `{"model":"m","input":["a"],"dimensions":3,"encoding_format":"base64"}`, `[`, `{"input":[1e99]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := parseEmbeddings(body)
		if fuzzRejection(t, err) {
			return
		}
		if p.Model == "" || (len(p.Texts) == 0) == (len(p.Tokens) == 0) {
			t.Fatalf("accepted an invalid request: %+v", p)
		}
	})
}

func TestPeekModel(t *testing.T) {
	if m, _, err := peekRoute([]byte(`{"model":"a:b","messages":[]}`)); err != nil || m != "a:b" {
		t.Fatalf("%q %v", m, err)
	}
	for _, b := range []string{`{}`, `{"model":1}`, `{"model":""}`, `nope`} {
		if _, _, err := peekRoute([]byte(b)); err == nil {
			t.Errorf("%s accepted", b)
		}
	}
}

// TestPeekRouteStream: only a top-level "stream" that is literally true
// makes a request a stream (forwarded as one); anything else is one piece.
func TestPeekRouteStream(t *testing.T) {
	for body, want := range map[string]bool{
		`{"model":"m","stream":true}`:                     true,
		`{"model":"m", "stream" :  true }`:                true,
		`{"model":"m","stream":false}`:                    false,
		`{"model":"m"}`:                                   false,
		`{"model":"m","stream":"true"}`:                   false,
		`{"model":"m","stream":1}`:                        false,
		`{"model":"m","Stream":true}`:                     false,
		`{"model":"m","options":{"stream":true}}`:         false,
		`{"model":"m","stream":true,"stream":false}`:      false,
		`not json, "stream":true`:                         false,
		`{"model":"m","messages":[],"stream":true,"n":1}`: true,
	} {
		if _, got, _ := peekRoute([]byte(body)); got != want {
			t.Errorf("%s: stream %v, want %v", body, got, want)
		}
	}
}

// TestRoutedModelOnlyForTheSameID: the handler reuses the model routed
// resolved only when its body names the id routed saw; any other id, or
// a request that did not pass routed (a peer's), resolves again.
func TestRoutedModelOnlyForTheSameID(t *testing.T) {
	m := Model{ID: "onnx/tiny-bert/test-128", WireID: "tiny-bert:test-128"}
	ctx := withRouted(context.Background(), "tiny-bert:test-128", m, nil)
	if got, ok := routedModel(ctx, "tiny-bert:test-128"); !ok || got.ID != m.ID {
		t.Fatalf("same id: got %+v, %v", got, ok)
	}
	if _, ok := routedModel(ctx, "onnx/other/x"); ok {
		t.Fatal("another id took the routed model")
	}
	if _, ok := routedModel(context.Background(), "tiny-bert:test-128"); ok {
		t.Fatal("a request that did not pass routed took a model")
	}
}

// TestDecodeRequestTakesRoutedParse: a body routed decoded strictly is not
// read or decoded again by the handler; one it did not decode is.
func TestDecodeRequestTakesRoutedParse(t *testing.T) {
	body := []byte(`{"model":"tiny-bert:test-128","input":"hello"}`)
	v, model, stream, ok := parseOnce(parseEmbeddings, func(p *parsedEmbeddings) (string, bool) { return p.Model, false })(body)
	if !ok || model != "tiny-bert:test-128" || stream {
		t.Fatalf("preparse: %v %q %v", ok, model, stream)
	}
	ctx := withRouted(context.Background(), model, Model{ID: "onnx/tiny-bert/test-128"}, v)
	// The request's body is not what routed decoded: taking the routed
	// parse is the only way to get "hello".
	r := httptest.NewRequest(http.MethodPost, "/v1/embeddings", strings.NewReader(`{"model":"x","input":"other"}`)).WithContext(ctx)
	p, ok := decodeRequest(httptest.NewRecorder(), r, MaxJSONBody, parseEmbeddings)
	if !ok || p != v || p.Texts[0] != "hello" {
		t.Fatalf("decodeRequest did not take routed's parse: %+v", p)
	}
	r = httptest.NewRequest(http.MethodPost, "/v1/embeddings", strings.NewReader(`{"model":"x","input":"other"}`))
	if p, ok := decodeRequest(httptest.NewRecorder(), r, MaxJSONBody, parseEmbeddings); !ok || p.Texts[0] != "other" {
		t.Fatalf("decodeRequest without routed: %+v", p)
	}
	if _, _, _, ok := parseOnce(parseEmbeddings, func(p *parsedEmbeddings) (string, bool) { return p.Model, false })([]byte(`{"model":"m","input":"x","stream":true}`)); ok {
		t.Fatal("a body strict decoding refuses was preparsed")
	}
}

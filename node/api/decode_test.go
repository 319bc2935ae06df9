package api

import (
	"errors"
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

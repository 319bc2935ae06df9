package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// b64 is n bytes of base64 text.
func b64(n int) string {
	raw := make([]byte, n*3/4+3)
	for i := range raw {
		raw[i] = byte(i*131 + i>>3)
	}
	return base64.StdEncoding.EncodeToString(raw)[:n]
}

func TestBigString(t *testing.T) {
	big := "data:image/jpeg;base64," + b64(6000)
	for _, c := range []struct {
		name string
		body string
		want bool
	}{
		{"plain", `{"image":"` + big + `"}`, true},
		{"spaces and other members", " {\n \"model\" : \"m\", \"image\" :\t\"" + big + `" , "max_results":3, "x":[{"image":"y"}]}`, true},
		{"case-folded key", `{"IMAGE":"` + big + `"}`, true},
		{"short value", `{"image":"abc"}`, false},
		{"no such key", `{"picture":"` + big + `"}`, false},
		{"nested only", `{"a":{"image":"` + big + `"}}`, false},
		{"two members for the field", `{"image":"` + big + `","Image":"x"}`, false},
		{"escaped key elsewhere", `{"\u0069mage":"x","image":"` + big + `"}`, false},
		{"escape in the value", `{"image":"` + big[:5000] + `\/` + big[5000:] + `"}`, false},
		{"control byte in the value", `{"image":"` + big[:5000] + "\x01" + big[5000:] + `"}`, false},
		{"non-ASCII in the value", `{"image":"` + big[:5000] + "é" + big[5000:] + `"}`, false},
		{"not a string", `{"image":[1,2]}`, false},
		{"unterminated", `{"image":"` + big, false},
		{"array body", `["image","` + big + `"]`, false},
		{"key as a value", `{"a":"image","b":"` + big + `"}`, false},
	} {
		s, e, ok := bigString([]byte(c.body), "image")
		if ok != c.want {
			t.Errorf("%s: ok %v, want %v", c.name, ok, c.want)
			continue
		}
		if ok && c.body[s:e] != big {
			t.Errorf("%s: span %d..%d is not the value", c.name, s, e)
		}
	}
}

// TestPlainASCII checks the eight-bytes-a-step test against the byte test
// for every byte value at every position of strings of several lengths,
// among printable neighbours.
func TestPlainASCII(t *testing.T) {
	for _, n := range []int{1, 7, 8, 9, 16, 23} {
		for pos := range n {
			for v := range 256 {
				s := []byte(strings.Repeat("Az09+/=~", 3)[:n])
				s[pos] = byte(v)
				want := v >= 0x20 && v <= 0x7e
				if got := plainASCII(s); got != want {
					t.Fatalf("len %d, byte %#x at %d: %v, want %v", n, v, pos, got, want)
				}
			}
		}
	}
}

// sameDecoding fails unless decodeWithBigString and decodeStrict agree on
// body: the same error, or the same request.
func sameDecoding(t *testing.T, body []byte) {
	var fast, slow detectionsRequest
	ef := decodeWithBigString(body, &fast, "image", &fast.Image)
	es := decodeStrict(body, &slow)
	if fmt.Sprint(ef) != fmt.Sprint(es) {
		t.Fatalf("error %v, decodeStrict's %v", ef, es)
	}
	if es == nil && !reflect.DeepEqual(fast, slow) {
		t.Fatalf("decoded %+v, decodeStrict %+v", fast, slow)
	}
}

func TestDecodeWithBigStringMatchesDecodeStrict(t *testing.T) {
	big := b64(5000)
	for _, body := range []string{
		`{"image":"` + big + `","max_results":2}`,
		`{"Image":"` + big + `"}`,
		`{"image":"` + big + `","image":"short"}`,
		`{"image":"short","image":"` + big + `"}`,
		`{"\u0069mage":"x","image":"` + big + `"}`,
		`{"image":"` + big + `","unknown":1}`,
		`{"image":"` + big + `","max_results":"2"}`,
		`{"image":"` + big + `"} trailing`,
		`{"image":"` + big + `",}`,
		`{"x":"image":"` + big + `"}`,
		`{"model":7,"image":"` + big + `"}`,
	} {
		sameDecoding(t, []byte(body))
	}
}

// FuzzDecodeWithBigString: whatever the body, the fast path decodes it as
// decodeStrict does (value and error), and routing peeks the same model.
func FuzzDecodeWithBigString(f *testing.F) {
	big := b64(4200)
	for _, s := range []string{
		`{"image":"` + big + `","max_results":2,"model":"m"}`,
		`{"IMAGE":"` + big + `","return_embeddings":true}`,
		`{"image":"` + big + `","image":"x"}`,
		`{"a":{"image":"` + big + `"},"image":"` + big + `"}`,
		`{"image":"` + big + `"}{}`,
		`{"model":"m","stream":true,"image":"` + big + `"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		sameDecoding(t, body)
		// The probe as it was before bigString: the whole body.
		var probe map[string]json.RawMessage
		var wantModel string
		var wantStream bool
		var wantErr error
		if err := json.Unmarshal(body, &probe); err != nil {
			wantErr = jsonError(err)
		} else {
			wantStream = string(bytes.TrimSpace(probe["stream"])) == "true"
			wantModel, wantErr = modelOf(probe)
		}
		model, stream, err := peekRoute(body)
		if model != wantModel || stream != wantStream || fmt.Sprint(err) != fmt.Sprint(wantErr) {
			t.Fatalf("peekRoute: %q %v %v, want %q %v %v", model, stream, err, wantModel, wantStream, wantErr)
		}
	})
}

// BenchmarkDecodeImageRequest decodes a faces request carrying a 640x480
// JPEG's worth of base64 (85 kB) both ways, interleaved: ratio is the
// fast path's time over decodeStrict's.
func BenchmarkDecodeImageRequest(b *testing.B) {
	raw := make([]byte, 64<<10)
	for i := range raw {
		raw[i] = byte(rand.Uint32())
	}
	body := []byte(`{"image":"data:image/jpeg;base64,` + base64.StdEncoding.EncodeToString(raw) + `","return_embeddings":true}`)
	var fast, slow time.Duration
	for range b.N {
		var a, c detectionsRequest
		t0 := time.Now()
		if err := decodeWithBigString(body, &a, "image", &a.Image); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := decodeStrict(body, &c); err != nil {
			b.Fatal(err)
		}
		fast, slow = fast+t1.Sub(t0), slow+time.Since(t1)
	}
	b.ReportMetric(float64(fast.Microseconds())/float64(b.N), "fast-µs")
	b.ReportMetric(float64(slow.Microseconds())/float64(b.N), "decodeStrict-µs")
	b.ReportMetric(float64(fast)/float64(slow), "ratio")
}

// TestStringEnd: escapes, escaped quotes and backslashes, unterminated.
func TestStringEnd(t *testing.T) {
	for _, c := range []struct {
		text    string // after the opening quote
		end     int
		escaped bool
	}{
		{`abc"`, 3, false},
		{`"`, 0, false},
		{`a\"b"`, 4, true},
		{`a\\"b"`, 3, true},
		{`\\\\\"x"`, 7, true},
		{`abc`, -1, false},
		{`a\"`, -1, true},
		{`a\`, -1, true},
	} {
		end, esc := stringEnd([]byte(`"`+c.text), 1)
		if want := c.end; want >= 0 {
			want++
			if end != want || esc != c.escaped {
				t.Errorf("%q: %d %v, want %d %v", c.text, end, esc, want, c.escaped)
			}
		} else if end != -1 {
			t.Errorf("%q: %d, want -1", c.text, end)
		}
	}
}

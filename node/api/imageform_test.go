package api

import (
	"bytes"
	"encoding/base64"
	"errors"
	"image"
	"image/color"
	"image/png"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
)

// pngFile encodes img as a PNG for a form part.
func pngFile(t testing.TB, img image.Image) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// namedFile is a form file the SDK sends with a name and content type.
type namedFile struct {
	io.Reader
	name string
}

func (f namedFile) Filename() string    { return f.name }
func (f namedFile) ContentType() string { return "image/png" }

// sdkForm is the body the official OpenAI Go SDK sends for params.
func sdkForm(t testing.TB, params interface {
	MarshalMultipart() ([]byte, string, error)
}) ([]byte, string) {
	t.Helper()
	body, ct, err := params.MarshalMultipart()
	if err != nil {
		t.Fatal(err)
	}
	return body, ct
}

// imageFormBody writes a form with text fields and file parts, in order.
func imageFormBody(fields [][2]string, files ...formFile) ([]byte, string) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for _, f := range fields {
		mw.WriteField(f[0], f[1])
	}
	for _, f := range files {
		p, _ := mw.CreateFormFile(f.name, f.name+".png")
		p.Write(f.data)
	}
	mw.Close()
	return b.Bytes(), mw.FormDataContentType()
}

func TestParseImageEditSDKShapes(t *testing.T) {
	pic := pngFile(t, image.NewNRGBA(image.Rect(0, 0, 8, 6)))
	mask := pngFile(t, image.NewNRGBA(image.Rect(0, 0, 8, 6)))
	file := func(b []byte) io.Reader { return namedFile{bytes.NewReader(b), "a.png"} }

	// One image and a mask, as Images.Edit sends them.
	body, ct := sdkForm(t, openai.ImageEditParams{
		Image:  openai.ImageEditParamsImageUnion{OfFile: file(pic)},
		Mask:   file(mask),
		Prompt: "a red hat", Model: "tiny-sd:test", N: openai.Int(2), Size: "64x64",
		OutputFormat: openai.ImageEditParamsOutputFormatJPEG, OutputCompression: openai.Int(80),
		Background: openai.ImageEditParamsBackgroundOpaque, InputFidelity: openai.ImageEditParamsInputFidelityLow,
		ResponseFormat: openai.ImageEditParamsResponseFormatB64JSON,
	})
	p, err := parseImageEdit(body, ct)
	if err != nil {
		t.Fatal(err)
	}
	if p.Model != "tiny-sd:test" || p.Req.Prompt != "a red hat" || p.Req.N != 2 || p.Local.Op != engine.OpInpaint ||
		!p.Local.MaskAlpha || p.Local.Width != 64 || p.Local.Height != 64 || p.Local.OutputFormat != "jpeg" ||
		p.Local.Quality != 80 || p.Local.Background != "opaque" {
		t.Fatalf("edit with a mask parsed as %+v / %+v", p, p.Local)
	}
	if got, _ := base64.StdEncoding.DecodeString(*p.Local.Image); !bytes.Equal(got, pic) {
		t.Fatal("the image part did not arrive as it was sent")
	}

	// Several images (image[]): the first is edited, the rest are
	// reference images; no mask and no size keeps the picture's size.
	body, ct = sdkForm(t, openai.ImageEditParams{
		Image:  openai.ImageEditParamsImageUnion{OfFileArray: []io.Reader{file(pic), file(pic), file(pic)}},
		Prompt: "snow", Model: "m", Size: openai.ImageEditParamsSizeAuto,
	})
	if !bytes.Contains(body, []byte(`name="image[]"`)) {
		t.Fatal("the SDK no longer sends several images as image[]")
	}
	p, err = parseImageEdit(body, ct)
	if err != nil {
		t.Fatal(err)
	}
	if p.Local.Op != engine.OpImg2Img || p.Local.References != 2 || p.Local.Width != 0 || p.Local.MaskAlpha {
		t.Fatalf("edit of three images parsed as %+v", p.Local)
	}

	// A variation: one image, no prompt.
	body, ct = sdkForm(t, openai.ImageNewVariationParams{Image: file(pic), Model: "m", N: openai.Int(3), Size: "256x256"})
	p, err = parseImageVariation(body, ct)
	if err != nil {
		t.Fatal(err)
	}
	if p.Local.Op != engine.OpVariations || p.Req.N != 3 || p.Local.Width != 256 || p.Req.Prompt != "" {
		t.Fatalf("variation parsed as %+v / %+v", p.Req, p.Local)
	}
}

func TestParseImageFormRefusals(t *testing.T) {
	pic := formFile{name: "image", data: pngFile(t, image.NewNRGBA(image.Rect(0, 0, 4, 4)))}
	mask := formFile{name: "mask", data: pic.data}
	base := [][2]string{{"model", "m"}, {"prompt", "x"}}
	with := func(kv ...string) [][2]string {
		out := append([][2]string(nil), base...)
		for i := 0; i < len(kv); i += 2 {
			out = append(out, [2]string{kv[i], kv[i+1]})
		}
		return out
	}
	cases := []struct {
		name      string
		variation bool
		fields    [][2]string
		files     []formFile
		param     string
	}{
		{"no image", false, base, nil, "image"},
		{"no prompt", false, [][2]string{{"model", "m"}}, []formFile{pic}, "prompt"},
		{"no model", false, [][2]string{{"prompt", "x"}}, []formFile{pic}, "model"},
		{"mask without image", false, base, []formFile{mask}, "image"},
		{"two masks", false, base, []formFile{pic, mask, mask}, "mask"},
		{"unknown field", false, with("colour", "red"), []formFile{pic}, "colour"},
		{"unknown file", false, base, []formFile{pic, {name: "photo", data: pic.data}}, "photo"},
		{"n not a number", false, with("n", "two"), []formFile{pic}, "n"},
		{"n too large", false, with("n", "9"), []formFile{pic}, "n"},
		{"bad size", false, with("size", "big"), []formFile{pic}, "size"},
		{"url response", false, with("response_format", "url"), []formFile{pic}, "response_format"},
		{"streamed", false, with("stream", "true"), []formFile{pic}, "stream"},
		{"fidelity", false, with("input_fidelity", "max"), []formFile{pic}, "input_fidelity"},
		{"compression", false, with("output_compression", "101"), []formFile{pic}, "output_compression"},
		{"strength", false, with("strength", "2"), []formFile{pic}, "strength"},
		{"seed", false, with("seed", "1.5"), []formFile{pic}, "seed"},
		{"twice", false, with("n", "1", "n", "2"), []formFile{pic}, "n"},
		{"empty image", false, base, []formFile{{name: "image"}}, "image"},
		{"variation of two", true, [][2]string{{"model", "m"}}, []formFile{pic, pic}, "image"},
		{"variation with a mask", true, [][2]string{{"model", "m"}}, []formFile{pic, mask}, "mask"},
		{"variation with background", true, [][2]string{{"model", "m"}, {"background", "opaque"}}, []formFile{pic}, "background"},
	}
	for _, c := range cases {
		body, ct := imageFormBody(c.fields, c.files...)
		_, err := parseImageFormRequest(body, ct, c.variation)
		var ae *apierr.Error
		if !errors.As(err, &ae) || ae.Param != c.param || ae.Status != http.StatusBadRequest {
			t.Errorf("%s: got %v, want a 400 naming %s", c.name, err, c.param)
		}
	}
	if _, err := parseImageEdit([]byte(`{"model":"m"}`), "application/json"); err == nil {
		t.Error("a JSON body was taken for a form")
	}
}

func TestOpenAIMask(t *testing.T) {
	// OpenAI's convention: the transparent area is repainted.
	m := image.NewNRGBA(image.Rect(0, 0, 4, 2))
	for i := range m.Pix {
		m.Pix[i] = 0xff
	}
	m.SetNRGBA(1, 0, color.NRGBA{})
	m.SetNRGBA(2, 1, color.NRGBA{R: 0xff, G: 0xff, B: 0xff})
	g, ok := openAIMask(m).(*image.Gray)
	if !ok {
		t.Fatal("a mask with transparency was not converted")
	}
	want := []uint8{0, 0xff, 0, 0, 0, 0, 0xff, 0}
	if !bytes.Equal(g.Pix, want) {
		t.Fatalf("converted mask %v, want %v", g.Pix, want)
	}
	// An opaque mask keeps this API's own convention (white repainted).
	opaque := image.NewGray(image.Rect(0, 0, 2, 2))
	if openAIMask(opaque) != image.Image(opaque) {
		t.Fatal("an opaque mask was changed")
	}
}

// TestImageFormRoutes: both routes exist, POST only, on the public
// router, and the local router (where dispatch sends them) serves them
// (both answered 404 unknown_url before).
func TestImageFormRoutes(t *testing.T) {
	s := New(Options{Backend: &localImageBackend{gens: map[string]engine.ImageGenerator{}}, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	pic := formFile{name: "image", data: pngFile(t, image.NewNRGBA(image.Rect(0, 0, 4, 4)))}
	for _, path := range []string{"/v1/images/edits", "/v1/images/variations"} {
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "POST" {
			t.Errorf("GET %s: %d Allow %q, want 405 Allow POST", path, w.Code, w.Header().Get("Allow"))
		}
		body, ct := imageFormBody([][2]string{{"model", "nowhere"}}, pic)
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", ct)
		w = httptest.NewRecorder()
		s.LocalHandler().ServeHTTP(w, req)
		want := http.StatusNotFound
		if strings.HasSuffix(path, "edits") {
			want = http.StatusBadRequest // the prompt is missing
		}
		if w.Code != want || strings.Contains(w.Body.String(), "unknown_url") {
			t.Errorf("POST %s: %d %s; want %d", path, w.Code, w.Body, want)
		}
	}
}

func FuzzParseImageForm(f *testing.F) {
	pic := formFile{name: "image", data: []byte("\x89PNG\r\n\x1a\n....")}
	body, ct := imageFormBody([][2]string{{"model", "m"}, {"prompt", "x"}, {"n", "2"}, {"size", "auto"}}, pic, formFile{name: "mask", data: pic.data})
	f.Add(body, strings.TrimPrefix(ct, "multipart/form-data; boundary="), false)
	body, ct = imageFormBody([][2]string{{"model", "m"}}, formFile{name: "image[]", data: pic.data}, formFile{name: "image[]", data: pic.data})
	f.Add(body, strings.TrimPrefix(ct, "multipart/form-data; boundary="), true)
	f.Add([]byte("--x\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a\"\r\n\r\nabc\r\n--x--\r\n"), "x", false)
	f.Fuzz(func(t *testing.T, body []byte, boundary string, variation bool) {
		ct := "multipart/form-data; boundary=" + boundary
		form, err := parseImageForm(body, ct)
		if err == nil {
			if len(form.images) > maxFormImages {
				t.Fatalf("%d images accepted", len(form.images))
			}
			for _, im := range append(form.images, derefFile(form.mask)...) {
				if len(im.data) == 0 || len(im.data) > MaxImageBytes {
					t.Fatalf("a file of %d bytes accepted", len(im.data))
				}
			}
		}
		p, err := parseImageFormRequest(body, ct, variation)
		if err != nil {
			var ae *apierr.Error
			if !errors.As(err, &ae) || ae.Status/100 != 4 {
				t.Fatalf("refusal %v is not a client error", err)
			}
			return
		}
		if p.Model == "" || p.Local.Image == nil || (variation && p.Local.Op != engine.OpVariations) {
			t.Fatalf("accepted %+v", p.Local)
		}
	})
}

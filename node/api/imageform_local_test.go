package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/color"
	"image/jpeg"
	"net/http"
	"net/http/httptest"
	"testing"
)

// postForm posts a form to the local router (where dispatch sends it).
func postForm(s *Server, path string, body []byte, ct string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	req.Header.Set("Content-Type", ct)
	w := httptest.NewRecorder()
	s.LocalHandler().ServeHTTP(w, req)
	return w
}

// TestImagesFormsLocal runs OpenAI's edit and variation forms on the
// generated pipelines: an edit with an OpenAI mask (transparent =
// repaint) keeps every pixel outside it, an edit without a mask is an
// instruction edit on InstructPix2Pix, a variation gives n pictures of
// the asked size, and output_format jpeg answers JPEGs.
func TestImagesFormsLocal(t *testing.T) {
	s, _ := newImageServer(t, false, "tiny-sd", "tiny-sd-pix2pix")
	src := testPhoto(t)
	pic := formFile{name: "image", data: pngFile(t, src)}
	// OpenAI's mask: opaque where the picture stays, transparent where
	// it is repainted.
	mask := image.NewNRGBA(src.Rect)
	inside := func(x, y int) bool { return x >= 30 && x < 90 && y >= 10 && y < 60 }
	for y := range src.Rect.Dy() {
		for x := range src.Rect.Dx() {
			if !inside(x, y) {
				mask.SetNRGBA(x, y, color.NRGBA{A: 0xff})
			}
		}
	}
	body, ct := imageFormBody([][2]string{{"model", "tiny-sd"}, {"prompt", "a cat"}, {"seed", "1"}},
		pic, formFile{name: "mask", data: pngFile(t, mask)})
	imgs, _ := imagesOf(t, postForm(s, "/v1/images/edits", body, ct))
	if len(imgs) != 1 || imgs[0].Rect.Size() != src.Rect.Size() {
		t.Fatalf("edit with a mask: %d images", len(imgs))
	}
	in := imgs[0]
	changed := 0
	for y := range src.Rect.Dy() {
		for x := range src.Rect.Dx() {
			same := string(in.Pix[y*in.Stride+4*x:y*in.Stride+4*x+4]) == string(src.Pix[y*src.Stride+4*x:y*src.Stride+4*x+4])
			switch {
			case !inside(x, y) && !same:
				t.Fatalf("the edit changed pixel (%d,%d) outside the mask's transparent area", x, y)
			case inside(x, y) && !same:
				changed++
			}
		}
	}
	if changed < 60*50/2 {
		t.Fatalf("the edit repainted only %d of %d pixels inside the mask", changed, 60*50)
	}

	// Without a mask, on InstructPix2Pix: an instruction edit.
	body, ct = imageFormBody([][2]string{{"model", "tiny-sd-pix2pix"}, {"prompt", "make it snow"}, {"seed", "2"}, {"size", "64x64"}}, pic)
	imgs, _ = imagesOf(t, postForm(s, "/v1/images/edits", body, ct))
	if len(imgs) != 1 || imgs[0].Rect.Size() != image.Pt(64, 64) {
		t.Fatalf("instruction edit: %d images", len(imgs))
	}

	// A variation, two of the asked size, different from each other.
	body, ct = imageFormBody([][2]string{{"model", "tiny-sd"}, {"n", "2"}, {"size", "64x64"}, {"seed", "3"}}, pic)
	imgs, _ = imagesOf(t, postForm(s, "/v1/images/variations", body, ct))
	if len(imgs) != 2 || imgs[0].Rect.Size() != image.Pt(64, 64) || string(imgs[0].Pix) == string(imgs[1].Pix) {
		t.Fatalf("variations: %d images", len(imgs))
	}

	// output_format jpeg.
	body, ct = imageFormBody([][2]string{{"model", "tiny-sd"}, {"prompt", "a cat"}, {"size", "64x64"}, {"output_format", "jpeg"}, {"output_compression", "50"}}, pic)
	w := postForm(s, "/v1/images/edits", body, ct)
	var res struct {
		Data []struct {
			B64JSON string `json:"b64_json"`
		} `json:"data"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil || w.Code != http.StatusOK || len(res.Data) != 1 {
		t.Fatalf("jpeg edit: %d %s", w.Code, w.Body)
	}
	raw, _ := base64.StdEncoding.DecodeString(res.Data[0].B64JSON)
	if c, err := jpeg.DecodeConfig(bytes.NewReader(raw)); err != nil || c.Width != 64 {
		t.Fatalf("output_format jpeg: %v %+v", err, c)
	}

	// What a pipeline cannot honour is refused, naming the field.
	for _, c := range []struct {
		fields [][2]string
		param  string
	}{
		{[][2]string{{"model", "tiny-sd"}, {"prompt", "x"}, {"output_format", "webp"}}, "output_format"},
		{[][2]string{{"model", "tiny-sd"}, {"prompt", "x"}, {"background", "transparent"}}, "background"},
	} {
		body, ct := imageFormBody(c.fields, pic)
		w := postForm(s, "/v1/images/edits", body, ct)
		var e struct {
			Error struct{ Param string } `json:"error"`
		}
		json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != http.StatusBadRequest || e.Error.Param != c.param {
			t.Errorf("%v: %d %s; want 400 naming %s", c.fields, w.Code, w.Body, c.param)
		}
	}
	// Several pictures: the pipelines take no reference images.
	body, ct = imageFormBody([][2]string{{"model", "tiny-sd"}, {"prompt", "x"}}, formFile{name: "image[]", data: pic.data}, formFile{name: "image[]", data: pic.data})
	if w := postForm(s, "/v1/images/edits", body, ct); w.Code != http.StatusBadRequest {
		t.Errorf("two pictures: %d %s", w.Code, w.Body)
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"image"
	"image/color"
	"image/draw"
	"image/jpeg"
	"image/png"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/option"
)

// skimagePhoto reads a photo from Debian's python3-skimage data.
func skimagePhoto(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/usr/lib/python3/dist-packages/skimage/data", name))
	if err != nil {
		t.Fatalf("photo %s (Debian package python3-skimage): %v", name, err)
	}
	return b
}

func dataURL(png []byte) string {
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(png)
}

type visionObject struct {
	Label      string     `json:"label"`
	Confidence float64    `json:"confidence"`
	Box        [4]float64 `json:"box"`
}

type visionFace struct {
	Confidence float64      `json:"confidence"`
	Box        [4]float64   `json:"box"`
	Landmarks  [][2]float64 `json:"landmarks"`
	Embedding  []float64    `json:"embedding"`
}

// boxIoU is the intersection over union of an [x,y,w,h] box and a rectangle.
func boxIoU(b [4]float64, r image.Rectangle) float64 {
	ix := math.Max(0, math.Min(b[0]+b[2], float64(r.Max.X))-math.Max(b[0], float64(r.Min.X)))
	iy := math.Max(0, math.Min(b[1]+b[3], float64(r.Max.Y))-math.Max(b[1], float64(r.Min.Y)))
	inter := ix * iy
	return inter / (b[2]*b[3] + float64(r.Dx()*r.Dy()) - inter)
}

func cosine(a, b []float64) float64 {
	var d, na, nb float64
	for i := range a {
		d += a[i] * b[i]
		na += a[i] * a[i]
		nb += b[i] * b[i]
	}
	return d / math.Sqrt(na*nb)
}

// TestVisionThroughMesh runs detection and faces with the official SDK's
// raw request helper against a node that holds no vision model; a peer
// serves them on real CenterNet, BlazeFace and FaceRes weights.
func TestVisionThroughMesh(t *testing.T) {
	holder := startMeshNode(t, meshNode{id: "vis-a", ip: "127.0.30.1", models: []string{"centernet", "blazeface", "describer"}}, "")
	entry := startMeshNode(t, meshNode{id: "vis-b", ip: "127.0.30.2"}, "127.0.30.1:17946")
	waitMembers(t, []*proc{holder, entry}, 2)
	waitModel(t, entry, "onnx/centernet/mobilenetv3-coco", "onnx")
	waitModel(t, entry, "onnx/blazeface/faceres", "onnx")
	waitModel(t, entry, "onnx/composed-describer/v1", "onnx")
	cl := entry.client()
	ctx := context.Background()

	detect := func(photo []byte, extra map[string]any) ([]visionObject, *http.Response) {
		body := map[string]any{"image": dataURL(photo)}
		for k, v := range extra {
			body[k] = v
		}
		var out struct {
			Object  string         `json:"object"`
			Model   string         `json:"model"`
			Width   int            `json:"width"`
			Height  int            `json:"height"`
			Objects []visionObject `json:"objects"`
		}
		var resp *http.Response
		if err := cl.Post(ctx, "vision/detections", body, &out, option.WithResponseInto(&resp)); err != nil {
			t.Fatalf("detections: %v", err)
		}
		if out.Object != "vision.detections" || out.Model != "onnx/centernet/mobilenetv3-coco" || out.Width <= 0 || out.Height <= 0 {
			t.Fatalf("detections envelope: %+v", out)
		}
		for _, o := range out.Objects {
			if o.Box[0] < 0 || o.Box[1] < 0 || o.Box[0]+o.Box[2] > float64(out.Width)+0.5 || o.Box[1]+o.Box[3] > float64(out.Height)+0.5 {
				t.Errorf("box %v outside the %dx%d image", o.Box, out.Width, out.Height)
			}
		}
		return out.Objects, resp
	}
	cases := []struct {
		photo, label string
		region       image.Rectangle
	}{
		{"astronaut.png", "person", image.Rect(0, 0, 365, 512)},
		{"coffee.png", "cup", image.Rect(160, 15, 410, 290)},
		{"motorcycle_left.png", "motorcycle", image.Rect(100, 50, 690, 455)},
		{"horse.png", "horse", image.Rect(15, 10, 390, 318)},
	}
	for _, c := range cases {
		objs, resp := detect(skimagePhoto(t, c.photo), nil)
		if got := resp.Header.Get("X-Service-Backend"); got != "vis-a" {
			t.Errorf("%s: X-Service-Backend %q, want the holder vis-a", c.photo, got)
		}
		best := -1.0
		for _, o := range objs {
			if o.Label == c.label {
				best = math.Max(best, boxIoU(o.Box, c.region))
			}
		}
		t.Logf("%s: %d objects, best %s IoU %.2f", c.photo, len(objs), c.label, best)
		if best < 0.5 {
			t.Errorf("%s: no %q overlapping %v (IoU >= 0.5) in %+v", c.photo, c.label, c.region, objs)
		}
	}
	// JPEGs, which the holder decodes while it resizes (a streamed decode):
	// the same objects and face as from the PNGs.
	for _, c := range cases[2:] {
		best := -1.0
		objs, _ := detect(jpegOf(t, skimagePhoto(t, c.photo)), nil)
		for _, o := range objs {
			if o.Label == c.label {
				best = math.Max(best, boxIoU(o.Box, c.region))
			}
		}
		if best < 0.5 {
			t.Errorf("%s as JPEG: no %q overlapping %v (IoU >= 0.5) in %+v", c.photo, c.label, c.region, objs)
		}
	}
	if objs, _ := detect(skimagePhoto(t, "coffee.png"), map[string]any{"max_results": 1, "confidence_threshold": 0.05}); len(objs) != 1 {
		t.Errorf("max_results 1: %d objects", len(objs))
	}

	faces := func(photo []byte) []visionFace {
		var out struct {
			Object string       `json:"object"`
			Faces  []visionFace `json:"faces"`
		}
		if err := cl.Post(ctx, "vision/faces", map[string]any{"image": dataURL(photo), "return_embeddings": true}, &out); err != nil {
			t.Fatalf("faces: %v", err)
		}
		return out.Faces
	}
	astronaut := skimagePhoto(t, "astronaut.png")
	fs := faces(astronaut)
	face := image.Rect(172, 77, 275, 177)
	if len(fs) != 1 || boxIoU(fs[0].Box, face) < 0.6 || len(fs[0].Embedding) == 0 {
		t.Fatalf("astronaut: %d faces %+v, want one over %v with an embedding", len(fs), fs, face)
	}
	if fj := faces(jpegOf(t, astronaut)); len(fj) != 1 || boxIoU(fj[0].Box, face) < 0.6 || cosine(fj[0].Embedding, fs[0].Embedding) < 0.95 {
		t.Errorf("astronaut as JPEG: %d faces, want the PNG's face", len(fj))
	}
	// The same face mirrored and brightened scores above a different face.
	src, _ := png.Decode(bytes.NewReader(astronaut))
	b := src.Bounds()
	mir := image.NewRGBA(b)
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bb, _ := src.At(b.Max.X-1-x, y).RGBA()
			mir.Set(x, y, color.RGBA{uint8(min(255, float64(r>>8)*1.15)), uint8(min(255, float64(g>>8)*1.15)), uint8(min(255, float64(bb>>8)*1.15)), 255})
		}
	}
	var mb bytes.Buffer
	png.Encode(&mb, mir)
	same := faces(mb.Bytes())
	if len(same) != 1 {
		t.Fatalf("mirrored astronaut: %d faces", len(same))
	}
	sameCos := cosine(fs[0].Embedding, same[0].Embedding)
	camera := skimagePhoto(t, "camera.png") // a grey photo of a man
	ci, _ := png.Decode(bytes.NewReader(camera))
	rgb := image.NewRGBA(ci.Bounds())
	draw.Draw(rgb, rgb.Bounds(), ci, ci.Bounds().Min, draw.Src)
	var cb bytes.Buffer
	png.Encode(&cb, rgb)
	other := faces(cb.Bytes())
	t.Logf("same face mirrored+brighter cosine %.3f; camera faces %d", sameCos, len(other))
	if sameCos < 0.85 {
		t.Errorf("same face cosine %.3f < 0.85", sameCos)
	}
	for _, o := range other {
		if c := cosine(fs[0].Embedding, o.Embedding); c >= sameCos {
			t.Errorf("a different face scores %.3f, not below the same face's %.3f", c, sameCos)
		}
	}

	// Description: an editable prompt that names what the models found.
	describe := func(photo, detail string) string {
		var out struct {
			Object, Model, Detail, Prompt string
		}
		if err := cl.Post(ctx, "images/describe", map[string]any{"image": dataURL(skimagePhoto(t, photo)), "detail": detail}, &out); err != nil {
			t.Fatalf("describe %s: %v", photo, err)
		}
		if out.Object != "image.description" || out.Model != "onnx/composed-describer/v1" || out.Detail != detail {
			t.Fatalf("describe envelope: %+v", out)
		}
		t.Logf("describe %s (%s): %q", photo, detail, out.Prompt)
		return strings.ToLower(out.Prompt)
	}
	if p := describe("astronaut.png", "detailed"); !strings.Contains(p, "person") {
		t.Errorf("astronaut description does not mention a person: %q", p)
	}
	page := describe("page.png", "more")
	for _, w := range []string{"histogram", "coins"} {
		if !strings.Contains(page, w) {
			t.Errorf("page description lacks the printed word %q: %q", w, page)
		}
	}
	if c, m := describe("coffee.png", "caption"), describe("coffee.png", "more"); len(c) >= len(m) {
		t.Errorf("caption (%d chars) not shorter than more (%d)", len(c), len(m))
	}

	// Bad input: each a 4xx naming the field, and the node keeps serving.
	bad := []struct {
		path, body, param string
		status            int
	}{
		{"/v1/vision/detections", `{"image":"aGVsbG8gd29ybGQ="}`, "image", 400},
		{"/v1/vision/detections", `{"image":"` + truncatedPNG(t) + `"}`, "image", 400},
		{"/v1/vision/detections", `{"image":"` + dataURL(pngOf(t, 1, 1)) + `"}`, "image", 400},
		{"/v1/vision/detections", `{"image":"` + truncatedJPEG(t) + `"}`, "image", 400},
		{"/v1/vision/faces", `{"image":"` + truncatedJPEG(t) + `"}`, "image", 400},
		{"/v1/vision/detections", `{"image":"` + dataURL(hugeHeaderPNG(t)) + `"}`, "image", 400},
		{"/v1/vision/detections", `{"image":"` + dataURL(pngOf(t, 8, 8)) + `","confidence_threshold":1.5}`, "confidence_threshold", 400},
		{"/v1/vision/detections", `{"image":"` + dataURL(pngOf(t, 8, 8)) + `","max_results":0}`, "max_results", 400},
		{"/v1/vision/detections", `{"image":5}`, "image", 400},
		{"/v1/vision/faces", `{"image":"x","return_embeddings":"yes"}`, "return_embeddings", 400},
		{"/v1/vision/faces", `{"model":"onnx/centernet/mobilenetv3-coco","image":"` + dataURL(pngOf(t, 8, 8)) + `"}`, "model", 400},
		{"/v1/vision/faces", `{"model":"nope:1","image":"` + dataURL(pngOf(t, 8, 8)) + `"}`, "model", 404},
		{"/v1/images/describe", `{"image":"` + dataURL(pngOf(t, 8, 8)) + `","detail":"long"}`, "detail", 400},
		{"/v1/images/describe", `{"image":"not base64!"}`, "image", 400},
	}
	for _, c := range bad {
		resp, err := http.Post(entry.url(c.path), "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		_, param := errorBody(t, resp)
		if resp.StatusCode != c.status || param != c.param {
			t.Errorf("%s %.80s: %d param %q, want %d %q", c.path, c.body, resp.StatusCode, param, c.status, c.param)
		}
	}
	if objs, _ := detect(skimagePhoto(t, "horse.png"), nil); len(objs) == 0 {
		t.Error("no detections after the bad inputs")
	}
}

func pngOf(t *testing.T, w, h int) []byte {
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewRGBA(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func truncatedPNG(t *testing.T) string {
	full := skimagePhoto(t, "coffee.png")
	return dataURL(full[:len(full)/3])
}

// jpegOf re-encodes a PNG photo as a quality-90 JPEG.
func jpegOf(t *testing.T, pngData []byte) []byte {
	img, err := png.Decode(bytes.NewReader(pngData))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := jpeg.Encode(&b, img, &jpeg.Options{Quality: 90}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// truncatedJPEG is a JPEG cut after a third of its bytes: the header is
// whole, so the failure shows only while the pixels are decoded.
func truncatedJPEG(t *testing.T) string {
	full := jpegOf(t, skimagePhoto(t, "coffee.png"))
	return dataURL(full[:len(full)/3])
}

// hugeHeaderPNG is a PNG whose header claims 20000x20000 pixels.
func hugeHeaderPNG(t *testing.T) []byte {
	b := pngOf(t, 1, 1)
	// IHDR width and height are bytes 16..23; the CRC no longer matches,
	// which a decoder must refuse too, but the size check comes first.
	out := append([]byte(nil), b...)
	for i, v := range []byte{0, 0, 0x4e, 0x20, 0, 0, 0x4e, 0x20} {
		out[16+i] = v
	}
	return out
}

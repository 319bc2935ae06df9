package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/draw"
	"image/png"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infermesh/infermesh/node/apierr"
	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/diffusion"
	"github.com/infermesh/infermesh/node/engine/onnx"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// localImageBackend serves the generated diffusion pipelines under their
// folder names, the real ISNet as "isnet", and an image gate; the rest of
// Backend is unused here.
type localImageBackend struct {
	Backend
	gens  map[string]engine.ImageGenerator
	isnet engine.BackgroundRemover
	gate  *ImageGate
}

func (b *localImageBackend) Model(id string) (Model, bool) {
	if _, ok := b.gens[id]; ok {
		return Model{ID: id, Task: string(engine.TaskImageGeneration)}, true
	}
	if id == "isnet" {
		return Model{ID: id, Task: string(engine.TaskBackgroundRemoval)}, true
	}
	return Model{}, false
}

func (b *localImageBackend) ImageGenerator(_ context.Context, id string) (engine.ImageGenerator, error) {
	if g, ok := b.gens[id]; ok {
		return g, nil
	}
	return nil, fmt.Errorf("model %s: %w", id, ErrWrongTask)
}

func (b *localImageBackend) TaskEngine(_ context.Context, task engine.Task, id string) (engine.Engine, string, error) {
	if task == engine.TaskBackgroundRemoval && (id == "" || id == "isnet") && b.isnet != nil {
		return b.isnet, "isnet", nil
	}
	return nil, "", fmt.Errorf("model %s: %w", id, ErrWrongTask)
}

func (b *localImageBackend) ImageGate() *ImageGate { return b.gate }

// loadPipeline loads one folder of testdata/models/gen_tiny_sd.py.
func loadPipeline(t testing.TB, rt *onnx.Runtime, name string) engine.ImageGenerator {
	t.Helper()
	dir := onnxtest.AssetDir(t, name, "manifest.json")
	raw, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Files   map[string]string `json:"files"`
		Options map[string]string `json:"options"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	e, err := diffusion.LoadImageGenerator(rt, engine.Spec{ID: name, Task: engine.TaskImageGeneration, Dir: dir, Files: m.Files, Options: m.Options})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// newImageServer serves the given pipelines (and ISNet when withISNet)
// behind a gate of concurrency 1 and queue 2.
func newImageServer(t testing.TB, withISNet bool, names ...string) (*Server, *localImageBackend) {
	rt := onnxtest.Runtime(t)
	b := &localImageBackend{gens: map[string]engine.ImageGenerator{}, gate: NewImageGate(1, 2)}
	for _, n := range names {
		b.gens[n] = loadPipeline(t, rt, n)
	}
	if withISNet {
		dir := onnxtest.AssetDir(t, "isnet", "model.onnx")
		e, err := rt.LoadBackgroundRemover(engine.Spec{ID: "isnet", Task: engine.TaskBackgroundRemoval, Dir: dir,
			Files: map[string]string{"model": "model.onnx"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		b.isnet = e
	}
	return New(Options{Backend: b, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()}), b
}

// postImages posts body to the image generation handler.
func postImages(s *Server, body string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	s.imagesGenerations(w, httptest.NewRequest(http.MethodPost, "/v1/images/generations", strings.NewReader(body)))
	return w
}

// imagesOf decodes a 200 response's PNGs.
func imagesOf(t testing.TB, w *httptest.ResponseRecorder) ([]*image.NRGBA, map[string]any) {
	t.Helper()
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var res struct {
		Data []struct {
			B64JSON string `json:"b64_json"`
		} `json:"data"`
	}
	var all map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(w.Body.Bytes(), &all)
	var out []*image.NRGBA
	for _, d := range res.Data {
		raw, err := base64.StdEncoding.DecodeString(d.B64JSON)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		n := image.NewNRGBA(img.Bounds())
		draw.Draw(n, n.Rect, img, img.Bounds().Min, draw.Src)
		out = append(out, n)
	}
	return out, all
}

// b64PNG encodes img as base64 PNG.
func b64PNG(t testing.TB, img image.Image) string {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

// testPhoto is Go's image/testdata/video-001.png (150x103).
func testPhoto(t testing.TB) *image.NRGBA {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(onnxtest.GoTestdata(t, "video-001.png")))
	if err != nil {
		t.Fatal(err)
	}
	n := image.NewNRGBA(img.Bounds())
	draw.Draw(n, n.Rect, img, img.Bounds().Min, draw.Src)
	return n
}

// TestImagesLocalGenerate: text to image on the generated SD pipeline
// returns n PNGs of the asked size, the same for the same seed and
// different for another.
func TestImagesLocalGenerate(t *testing.T) {
	s, _ := newImageServer(t, false, "tiny-sd")
	gen := func(seed int) []*image.NRGBA {
		imgs, _ := imagesOf(t, postImages(s, fmt.Sprintf(`{"model":"tiny-sd","prompt":"a photo of a cat","n":2,"size":"96x64","seed":%d}`, seed)))
		return imgs
	}
	a, b, c := gen(11), gen(11), gen(12)
	if len(a) != 2 {
		t.Fatalf("%d images, want 2", len(a))
	}
	for _, im := range a {
		if im.Rect.Size() != image.Pt(96, 64) {
			t.Fatalf("size %v, want 96x64", im.Rect.Size())
		}
	}
	for i := range a {
		if string(a[i].Pix) != string(b[i].Pix) {
			t.Fatal("the same seed gave different images")
		}
	}
	if string(a[0].Pix) == string(c[0].Pix) {
		t.Fatal("seeds 11 and 12 gave the same image")
	}
}

// TestImagesLocalOperations runs the operations through the handler and
// checks sizes, the inpaint guarantee and the layers' recomposition.
func TestImagesLocalOperations(t *testing.T) {
	s, _ := newImageServer(t, true, "tiny-sd", "tiny-sd-pix2pix", "tiny-sd-turbo")
	src := testPhoto(t)
	img := b64PNG(t, src)
	mask := image.NewGray(src.Rect)
	inside := func(x, y int) bool { return x >= 30 && x < 90 && y >= 10 && y < 60 }
	for y := range src.Rect.Dy() {
		for x := range src.Rect.Dx() {
			if inside(x, y) {
				mask.Pix[y*mask.Stride+x] = 0xff
			}
		}
	}
	size := func(body string, want image.Point, n int) []*image.NRGBA {
		t.Helper()
		imgs, _ := imagesOf(t, postImages(s, body))
		if len(imgs) != n {
			t.Fatalf("%s: %d images, want %d", body[:60], len(imgs), n)
		}
		for _, im := range imgs {
			if im.Rect.Size() != want {
				t.Fatalf("%s: size %v, want %v", body[:60], im.Rect.Size(), want)
			}
		}
		return imgs
	}
	orig := image.Pt(150, 103)
	size(`{"model":"tiny-sd","prompt":"oil painting","operation":"img2img","strength":0.6,"seed":1,"image":"`+img+`"}`, orig, 1)
	size(`{"model":"tiny-sd","prompt":"oil painting","image":"`+img+`","size":"128x64","seed":1}`, image.Pt(128, 64), 1)
	size(`{"model":"tiny-sd","operation":"variations","n":2,"seed":1,"image":"`+img+`"}`, orig, 2)
	size(`{"model":"tiny-sd","prompt":"sky","operation":"outpaint","outpaint_percent":10,"seed":1,"image":"`+img+`"}`, image.Pt(180, 123), 1)
	size(`{"model":"tiny-sd-pix2pix","prompt":"make it winter","operation":"edit","seed":1,"image":"`+img+`"}`, orig, 1)
	size(`{"model":"tiny-sd-turbo","prompt":"a house","size":"64x64","control_type":"canny","control_scale":0.5,"seed":1,"control_image":"`+img+`"}`, image.Pt(64, 64), 1)
	size(`{"model":"tiny-sd-turbo","prompt":"a house","operation":"img2img","control_type":"depth","seed":1,"image":"`+img+`"}`, orig, 1)
	in := size(`{"model":"tiny-sd","prompt":"a cat","operation":"inpaint","seed":1,"image":"`+img+`","mask":"`+b64PNG(t, mask)+`"}`, orig, 1)[0]
	for y := range src.Rect.Dy() {
		for x := range src.Rect.Dx() {
			if !inside(x, y) && string(in.Pix[y*in.Stride+4*x:y*in.Stride+4*x+4]) != string(src.Pix[y*src.Stride+4*x:y*src.Stride+4*x+4]) {
				t.Fatalf("inpaint changed pixel (%d,%d) outside the mask", x, y)
			}
		}
	}
	// Background removal by the ISNet model itself.
	fg := size(`{"model":"isnet","operation":"remove-background","image":"`+img+`"}`, orig, 1)[0]
	transparent := 0
	for i := 3; i < len(fg.Pix); i += 4 {
		if fg.Pix[i] < 128 {
			transparent++
		}
	}
	if transparent == 0 || transparent == len(fg.Pix)/4 {
		t.Fatalf("remove-background: %d of %d pixels transparent", transparent, len(fg.Pix)/4)
	}
	// Layers through the pipeline with the node's ISNet: they recompose.
	layers := size(`{"model":"tiny-sd","operation":"layers","layer_count":3,"seed":1,"image":"`+img+`"}`, orig, 3)
	comp := image.NewRGBA(src.Rect)
	for _, l := range layers {
		draw.Draw(comp, comp.Rect, l, image.Point{}, draw.Over)
	}
	for i := range src.Pix {
		if d := int(comp.Pix[i]) - int(src.Pix[i]); d > 2 || d < -2 {
			t.Fatalf("layers recompose with an error of %d at byte %d", d, i)
		}
	}
}

// TestImagesLocalBadInput: each bad field is a 400 naming it, and an
// operation a model cannot do is a 400 with the reason.
func TestImagesLocalBadInput(t *testing.T) {
	s, _ := newImageServer(t, false, "tiny-sd", "tiny-sd-pix2pix", "tiny-sd-turbo")
	img := b64PNG(t, testPhoto(t))
	small := b64PNG(t, image.NewGray(image.Rect(0, 0, 20, 20)))
	for body, param := range map[string]string{
		`{"model":"tiny-sd","prompt":"x","operation":"inpaint","image":"` + img + `","mask":"` + small + `"}`:     "mask",
		`{"model":"tiny-sd","prompt":"x","operation":"img2img","strength":1.5,"image":"` + img + `"}`:             "strength",
		`{"model":"tiny-sd","operation":"upscale","upscale_factor":3,"image":"` + img + `"}`:                      "upscale_factor",
		`{"model":"tiny-sd","prompt":"x","operation":"img2img"}`:                                                  "image",
		`{"model":"tiny-sd","prompt":"x","size":"4097x512"}`:                                                      "size",
		`{"model":"tiny-sd","prompt":"x","operation":"outpaint","outpaint_percent":0,"image":"` + img + `"}`:      "outpaint_percent",
		`{"model":"tiny-sd","prompt":"x","control_type":"canny","control_scale":3,"control_image":"` + img + `"}`: "control_scale",
		`{"model":"tiny-sd","prompt":"x","control_type":"canny","control_image":"` + img + `"}`:                   "control_type",
		`{"model":"tiny-sd","prompt":"x","image":"bm90IGFuIGltYWdl"}`:                                             "image",
		`{"model":"tiny-sd","prompt":"x","control_type":"canny","control_image":"bm90"}`:                          "control_type",
		`{"model":"tiny-sd-pix2pix","prompt":"x","size":"64x64"}`:                                                 "operation",
		`{"model":"tiny-sd-pix2pix","prompt":"x","image":"` + img + `","mask":"` + img + `"}`:                     "mask",
		`{"model":"tiny-sd-turbo","prompt":"x","safety_check":true,"size":"64x64"}`:                               "safety_check",
		`{"model":"tiny-sd","prompt":"x","operation":"upscale","image":"` + img + `"}`:                            "model",
	} {
		w := postImages(s, body)
		var e struct {
			Error struct {
				Param   string `json:"param"`
				Message string `json:"message"`
			} `json:"error"`
		}
		json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != http.StatusBadRequest || e.Error.Param != param || e.Error.Message == "" {
			t.Errorf("%.90s: %d %s, want 400 on %q", body, w.Code, w.Body, param)
		}
	}
}

// TestImagesGateBurst: with one job at a time and two waiting, a burst of
// six slow jobs gets three served and three 503s with Retry-After.
func TestImagesGateBurst(t *testing.T) {
	s, b := newImageServer(t, false, "tiny-sd")
	body := `{"model":"tiny-sd","prompt":"x","size":"1024x1024","num_inference_steps":6,"seed":1}`
	var wg sync.WaitGroup
	codes := make([]*httptest.ResponseRecorder, 6)
	start := make(chan struct{})
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			codes[i] = postImages(s, body)
		}()
	}
	close(start)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if r, q := b.gate.Depth(); r == 1 && q == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	ok, busy := 0, 0
	for _, w := range codes {
		switch w.Code {
		case http.StatusOK:
			ok++
		case http.StatusServiceUnavailable:
			busy++
			if w.Header().Get("Retry-After") == "" {
				t.Fatal("503 without Retry-After")
			}
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	if ok != 3 || busy != 3 {
		t.Fatalf("%d served and %d refused, want 3 and 3", ok, busy)
	}
	if r, q := b.gate.Depth(); r != 0 || q != 0 {
		t.Fatalf("gate not drained: %d running, %d queued", r, q)
	}
}

// TestImageGate: the gate's queue, refusal, cancellation and release.
func TestImageGate(t *testing.T) {
	g := NewImageGate(1, 1)
	rel1, err := g.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan func(), 1)
	go func() {
		r, err := g.Acquire(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	for {
		if _, q := g.Depth(); q == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	_, err = g.Acquire(context.Background())
	ae, isAPI := err.(*apierr.Error)
	if !isAPI || ae.Status != http.StatusServiceUnavailable || ae.RetryAfter < 1 {
		t.Fatalf("third acquire: %v", err)
	}
	rel1()
	rel1() // a second release is a no-op
	rel2 := <-got
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Acquire(ctx); err == nil {
		// The slot is taken and the queue has room: a cancelled waiter leaves.
		t.Fatal("a cancelled waiter got a slot")
	}
	rel2()
	if r, q := g.Depth(); r != 0 || q != 0 {
		t.Fatalf("depth %d/%d after release", r, q)
	}
}

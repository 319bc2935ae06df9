package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	xdraw "golang.org/x/image/draw"

	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// The image operations end to end: the real binary, a mesh of processes,
// the generated diffusion pipelines (testdata/models/gen_tiny_sd.py), ISNet
// and the ESRGAN upscaler converted from its TF.js weights. Requests enter
// a node without models and are forwarded to the one that holds them.
// Loopback prefixes 127.0.80.x-127.0.89.x are this file's.

// Wire ids of the models the tests import.
const (
	opsSD      = "tiny-sd:test"         // 4-channel UNet, Euler a, CFG, safety checker
	opsInpaint = "tiny-sd-inpaint:test" // 9-channel inpainting UNet
	opsPix2Pix = "tiny-sd-pix2pix:test" // 8-channel InstructPix2Pix UNet
	opsTurbo   = "tiny-sd-turbo:test"   // fp16, LCM one step, canny and depth ControlNets
	opsESRGAN  = "esrgan:thick"
	opsISNet   = "isnet:small"
)

// opsTurboDir flattens the diffusers sub-folder layout of tiny-sd-turbo
// (which `infermesh models import` cannot take: manifests name plain
// files) into a folder whose manifest names each component by its role,
// and returns it.
func opsTurboDir(t *testing.T) string {
	t.Helper()
	src := onnxtest.AssetDir(t, "tiny-sd-turbo", "unet/model.onnx", "controlnet/canny/model.onnx", "controlnet/depth/model.onnx", "depth_estimator/model.onnx")
	roles := map[string]string{
		"text_encoder": "text_encoder/model.onnx", "unet": "unet/model.onnx", "vae_decoder": "vae_decoder/model.onnx",
		"vae_encoder": "vae_encoder/model.onnx", "vocab": "tokenizer/vocab.json", "merges": "tokenizer/merges.txt",
		"tokenizer_config": "tokenizer/tokenizer_config.json", "scheduler": "scheduler/scheduler_config.json",
		"controlnet_canny": "controlnet/canny/model.onnx", "controlnet_depth": "controlnet/depth/model.onnx",
		"depth_estimator": "depth_estimator/model.onnx",
	}
	dst := t.TempDir()
	var man map[string]any
	if err := json.Unmarshal(mustReadFile(t, filepath.Join(src, "manifest.json")), &man); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for role, rel := range roles {
		name := role + filepath.Ext(rel)
		if err := os.WriteFile(filepath.Join(dst, name), mustReadFile(t, filepath.Join(src, rel)), 0o644); err != nil {
			t.Fatal(err)
		}
		files[role] = name
	}
	man["files"] = files
	b, _ := json.Marshal(man)
	if err := os.WriteFile(filepath.Join(dst, "manifest.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

func mustReadFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// startOpsNode is startMeshNode for model folders given by path.
func startOpsNode(t *testing.T, id, ip string, dirs []string, join string, extra ...string) *proc {
	t.Helper()
	data := t.TempDir()
	for _, d := range dirs {
		if out, err := exec.Command(binPath, "models", "import", "--data-dir", data, d).CombinedOutput(); err != nil {
			t.Fatalf("import %s: %v\n%s", d, err, out)
		}
	}
	args := []string{"serve", "--data-dir", data, "--node-id", id, "--listen", ip + ":0", "--gossip-listen", ip + ":17946",
		"--rpc-listen", ip + ":17947", "--cluster-secret", meshSecret, "--fast-timers", "--drain-timeout", "60s"}
	if join != "" {
		args = append(args, "--join", join)
	}
	return launch(t, id, append(args, extra...))
}

// opsResult is one answer of POST /v1/images/generations.
type opsResult struct {
	status                  int
	code, param, msg, retry string
	backend                 string
	images                  []*image.NRGBA
	raw                     []string // the b64_json strings
	filtered                *int
}

// opsPost sends body to p's /v1/images/generations and decodes the answer.
func opsPost(t *testing.T, p *proc, body map[string]any) opsResult {
	t.Helper()
	r, err := opsTry(p, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// opsTry is opsPost without the test (for goroutines).
func opsTry(p *proc, body map[string]any) (opsResult, error) {
	b, _ := json.Marshal(body)
	resp, err := http.Post(p.url("/v1/images/generations"), "application/json", bytes.NewReader(b))
	if err != nil {
		return opsResult{}, err
	}
	defer resp.Body.Close()
	r := opsResult{status: resp.StatusCode, retry: resp.Header.Get("Retry-After"), backend: resp.Header.Get("X-Service-Backend")}
	var out struct {
		Data []struct {
			B64JSON string `json:"b64_json"`
		} `json:"data"`
		Filtered *int `json:"safety_filtered"`
		Error    struct {
			Code, Param, Message string
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return r, fmt.Errorf("status %d: decode: %v", resp.StatusCode, err)
	}
	r.code, r.param, r.msg, r.filtered = out.Error.Code, out.Error.Param, out.Error.Message, out.Filtered
	for _, d := range out.Data {
		raw, err := base64.StdEncoding.DecodeString(d.B64JSON)
		if err != nil {
			return r, err
		}
		img, err := png.Decode(bytes.NewReader(raw))
		if err != nil {
			return r, fmt.Errorf("result is not a PNG: %v", err)
		}
		r.images = append(r.images, opsNRGBA(img))
		r.raw = append(r.raw, d.B64JSON)
	}
	return r, nil
}

// ok fails the test unless the answer is 200 with n images of w x h.
func (r opsResult) ok(t *testing.T, what string, n, w, h int) {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("%s: %d %s param=%q: %s", what, r.status, r.code, r.param, r.msg)
	}
	if len(r.images) != n {
		t.Fatalf("%s: %d images, want %d", what, len(r.images), n)
	}
	for i, im := range r.images {
		if im.Rect.Dx() != w || im.Rect.Dy() != h {
			t.Fatalf("%s: image %d is %dx%d, want %dx%d", what, i, im.Rect.Dx(), im.Rect.Dy(), w, h)
		}
	}
}

func opsNRGBA(img image.Image) *image.NRGBA {
	b := img.Bounds()
	out := image.NewNRGBA(image.Rect(0, 0, b.Dx(), b.Dy()))
	xdraw.Draw(out, out.Rect, img, b.Min, xdraw.Src)
	return out
}

func opsPNG(t *testing.T, img image.Image) string {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return dataURL(buf.Bytes())
}

// opsPhoto is skimage's astronaut (512x512), cropped to r.
func opsPhoto(t *testing.T, r image.Rectangle) *image.NRGBA {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(skimagePhoto(t, "astronaut.png")))
	if err != nil {
		t.Fatal(err)
	}
	full := opsNRGBA(img)
	return opsNRGBA(full.SubImage(r))
}

// opsBoxDown shrinks img by the integer factor s, averaging s x s blocks.
func opsBoxDown(img *image.NRGBA, s int) *image.NRGBA {
	w, h := img.Rect.Dx()/s, img.Rect.Dy()/s
	out := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			for c := range 4 {
				sum := 0
				for dy := range s {
					for dx := range s {
						sum += int(img.Pix[(y*s+dy)*img.Stride+4*(x*s+dx)+c])
					}
				}
				out.Pix[y*out.Stride+4*x+c] = uint8((sum + s*s/2) / (s * s))
			}
		}
	}
	return out
}

// opsPSNR is the RGB PSNR of a against b in dB.
func opsPSNR(a, b *image.NRGBA) float64 {
	var se float64
	n := 0
	for y := range a.Rect.Dy() {
		for x := range a.Rect.Dx() {
			for c := range 3 {
				d := float64(a.Pix[y*a.Stride+4*x+c]) - float64(b.Pix[y*b.Stride+4*x+c])
				se += d * d
				n++
			}
		}
	}
	return 10 * math.Log10(255*255/(se/float64(n)))
}

// opsDiff returns the largest and the mean absolute RGB difference of a
// and b over the pixels where in(x, y) holds.
func opsDiff(a, b *image.NRGBA, in func(x, y int) bool) (maxd int, mean float64) {
	sum, n := 0, 0
	for y := range a.Rect.Dy() {
		for x := range a.Rect.Dx() {
			if !in(x, y) {
				continue
			}
			for c := range 3 {
				d := int(a.Pix[y*a.Stride+4*x+c]) - int(b.Pix[y*b.Stride+4*x+c])
				d = max(d, -d)
				maxd = max(maxd, d)
				sum += d
				n++
			}
		}
	}
	return maxd, float64(sum) / float64(max(n, 1))
}

func opsAll(int, int) bool { return true }

// opsSolid is a w x h picture of one colour.
func opsSolid(w, h int, c color.NRGBA) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for i := 0; i < len(img.Pix); i += 4 {
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = c.R, c.G, c.B, c.A
	}
	return img
}

// opsMask is a w x h black mask with r white (repainted).
func opsMask(w, h int, r image.Rectangle) *image.Gray {
	m := image.NewGray(image.Rect(0, 0, w, h))
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			m.Pix[y*m.Stride+x] = 0xff
		}
	}
	return m
}

// TestImagesOpsThroughMesh runs text to image with the OpenAI SDK and
// every image operation with raw requests through a node without models
// that forwards to the holder, then the bad inputs.
func TestImagesOpsThroughMesh(t *testing.T) {
	var dirs []string
	for _, m := range []string{"tiny-sd", "tiny-sd-inpaint", "tiny-sd-pix2pix", "isnet", "esrgan-thick"} {
		dirs = append(dirs, onnxtest.AssetDir(t, m, "manifest.json"))
	}
	dirs = append(dirs, opsTurboDir(t))
	holder := startOpsNode(t, "imgops-a", "127.0.80.1", dirs, "")
	entry := startOpsNode(t, "imgops-b", "127.0.80.2", nil, "127.0.80.1:17946")
	waitMembers(t, []*proc{holder, entry}, 2)
	ctx := context.Background()
	eventually(t, 30*time.Second, "the entry node sees the holder's six models", func() error {
		c := entry.client()
		page, err := c.Models.List(ctx)
		if err != nil {
			return err
		}
		if len(page.Data) != 6 {
			return fmt.Errorf("%d models", len(page.Data))
		}
		return nil
	})
	served := func(t *testing.T, r opsResult) {
		t.Helper()
		if r.backend != "imgops-a" {
			t.Errorf("served by %q, want the holder imgops-a", r.backend)
		}
	}

	t.Run("generate", func(t *testing.T) {
		c := entry.client()
		gen := func(seed int64) ([]*image.NRGBA, []string) {
			t.Helper()
			var resp *http.Response
			res, err := c.Images.Generate(ctx, openai.ImageGenerateParams{
				Model: opsSD, Prompt: "a photo of a cat", N: openai.Int(2), Size: "96x64",
			}, option.WithJSONSet("seed", seed), option.WithResponseInto(&resp))
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			if b := resp.Header.Get("X-Service-Backend"); b != "imgops-a" {
				t.Errorf("served by %q", b)
			}
			if len(res.Data) != 2 {
				t.Fatalf("seed %d: %d images, want 2", seed, len(res.Data))
			}
			var imgs []*image.NRGBA
			var raws []string
			for _, d := range res.Data {
				raw, err := base64.StdEncoding.DecodeString(d.B64JSON)
				if err != nil {
					t.Fatal(err)
				}
				img, err := png.Decode(bytes.NewReader(raw))
				if err != nil {
					t.Fatalf("not a PNG: %v", err)
				}
				if b := img.Bounds(); b.Dx() != 96 || b.Dy() != 64 {
					t.Fatalf("image of %v, want 96x64", b)
				}
				imgs, raws = append(imgs, opsNRGBA(img)), append(raws, d.B64JSON)
			}
			return imgs, raws
		}
		a, ra := gen(7)
		_, rb := gen(7)
		c8, _ := gen(8)
		for i := range ra {
			if ra[i] != rb[i] {
				t.Errorf("image %d differs between two runs with seed 7", i)
			}
		}
		if ra[0] == ra[1] {
			t.Error("the two images of one request are identical")
		}
		_, d0 := opsDiff(a[0], c8[0], opsAll)
		if d0 < 1 {
			t.Errorf("seeds 7 and 8 give nearly the same image (mean |diff| %.2f)", d0)
		}
		t.Logf("seed 7 twice: identical PNGs; seed 7 vs 8: mean |diff| %.1f of 255", d0)
		// The local pipeline's own fields, raw.
		r := opsPost(t, entry, map[string]any{"model": opsSD, "prompt": "a dog", "size": "100x76", "seed": 3,
			"negative_prompt": "blurry", "num_inference_steps": 4, "guidance_scale": 6.5})
		// Text to image rounds each side to the model's multiple (8).
		r.ok(t, "generate with negative_prompt, steps, guidance", 1, 104, 80)
		served(t, r)
	})

	photo := opsBoxDown(opsPhoto(t, image.Rect(128, 40, 384, 296)), 2) // 128x128, the face
	wide := opsBoxDown(opsPhoto(t, image.Rect(0, 0, 500, 380)), 5)     // 100x76
	t.Run("img2img", func(t *testing.T) {
		r := opsPost(t, entry, map[string]any{"model": opsSD, "operation": "img2img", "prompt": "a painting", "image": opsPNG(t, wide), "strength": 0.6, "seed": 1})
		r.ok(t, "img2img", 1, 100, 76)
		served(t, r)
		r = opsPost(t, entry, map[string]any{"model": opsSD, "prompt": "a painting", "image": opsPNG(t, wide), "size": "64x64", "n": 2, "seed": 1})
		r.ok(t, "img2img by image, with a size", 2, 64, 64)
	})
	t.Run("inpaint", func(t *testing.T) {
		hole := image.Rect(40, 40, 88, 96)
		outside := func(x, y int) bool { return !image.Pt(x, y).In(hole) }
		inside := func(x, y int) bool { return image.Pt(x, y).In(hole) }
		for _, model := range []string{opsSD, opsInpaint} {
			r := opsPost(t, entry, map[string]any{"model": model, "operation": "inpaint", "prompt": "a red hat",
				"image": opsPNG(t, photo), "mask": opsPNG(t, opsMask(128, 128, hole)), "seed": 5})
			r.ok(t, "inpaint "+model, 1, 128, 128)
			served(t, r)
			maxOut, meanOut := opsDiff(r.images[0], photo, outside)
			_, meanIn := opsDiff(r.images[0], photo, inside)
			t.Logf("inpaint %s: outside the mask max |diff| %d, mean %.2f; inside mean %.1f", model, maxOut, meanOut, meanIn)
			if maxOut > 2 {
				t.Errorf("inpaint %s changed pixels outside the mask (max |diff| %d)", model, maxOut)
			}
			if meanIn < 5 {
				t.Errorf("inpaint %s left the masked area as it was (mean |diff| %.1f)", model, meanIn)
			}
		}
	})
	t.Run("outpaint", func(t *testing.T) {
		r := opsPost(t, entry, map[string]any{"model": opsSD, "operation": "outpaint", "prompt": "a wide landscape",
			"image": opsPNG(t, wide), "outpaint_percent": 25, "seed": 2})
		r.ok(t, "outpaint 25%", 1, 150, 114) // 100+2*25 x 76+2*19
		centre := opsNRGBA(r.images[0].SubImage(image.Rect(25, 19, 125, 95)))
		if maxd, _ := opsDiff(centre, wide, opsAll); maxd > 2 {
			t.Errorf("outpaint changed the original picture (max |diff| %d)", maxd)
		}
		r = opsPost(t, entry, map[string]any{"model": opsInpaint, "operation": "outpaint", "prompt": "sky", "image": opsPNG(t, photo), "seed": 2})
		r.ok(t, "outpaint by default 25% on the inpainting UNet", 1, 192, 192)
	})
	t.Run("variations", func(t *testing.T) {
		r := opsPost(t, entry, map[string]any{"model": opsSD, "operation": "variations", "image": opsPNG(t, wide), "n": 2, "seed": 4})
		r.ok(t, "variations without a prompt", 2, 100, 76)
		if r.raw[0] == r.raw[1] {
			t.Error("two variations are identical")
		}
	})
	t.Run("edit", func(t *testing.T) {
		r := opsPost(t, entry, map[string]any{"model": opsPix2Pix, "operation": "edit", "prompt": "turn it into winter's snow",
			"image": opsPNG(t, wide), "image_guidance_scale": 1.8, "seed": 6})
		r.ok(t, "edit (InstructPix2Pix)", 1, 100, 76)
		served(t, r)
		r = opsPost(t, entry, map[string]any{"model": opsPix2Pix, "prompt": "a cat", "size": "64x64"})
		if r.status != 400 || r.param != "operation" {
			t.Errorf("text to image on an InstructPix2Pix model: %d param %q, want 400 on operation", r.status, r.param)
		}
	})
	t.Run("layers", func(t *testing.T) {
		r := opsPost(t, entry, map[string]any{"model": opsSD, "operation": "layers", "image": opsPNG(t, photo), "layer_count": 3, "seed": 9})
		r.ok(t, "layers", 3, 128, 128)
		// Alpha "over", bottom first, recomposes the input.
		comp := image.NewNRGBA(photo.Rect)
		transparent, opaque := 0, 0
		for i, l := range r.images {
			for p := 0; p < len(l.Pix); p += 4 {
				a := float64(l.Pix[p+3]) / 255
				if i == 0 && l.Pix[p+3] != 0xff {
					t.Fatalf("the background layer is not opaque at pixel %d", p/4)
				}
				if i == 1 {
					if l.Pix[p+3] == 0 {
						transparent++
					} else if l.Pix[p+3] == 0xff {
						opaque++
					}
				}
				for c := range 3 {
					comp.Pix[p+c] = uint8(math.Round(float64(l.Pix[p+c])*a + float64(comp.Pix[p+c])*(1-a)))
				}
				comp.Pix[p+3] = 0xff
			}
		}
		maxd, mean := opsDiff(comp, photo, opsAll)
		repainted, _ := opsDiff(r.images[0], photo, opsAll)
		t.Logf("layers: foreground layer %d opaque, %d transparent pixels of %d; recomposed vs input max |diff| %d, mean %.3f; background repainted up to %d",
			opaque, transparent, 128*128, maxd, mean, repainted)
		if maxd > 2 {
			t.Errorf("the layers recompose to the input only within %d (mean %.3f)", maxd, mean)
		}
		if opaque < 500 || transparent < 500 {
			t.Errorf("foreground layer: %d opaque and %d transparent pixels; want a person cut from a background", opaque, transparent)
		}
		if repainted == 0 {
			t.Error("the background layer was not repainted under the foreground")
		}
	})
	t.Run("remove-background", func(t *testing.T) {
		a := opsPost(t, entry, map[string]any{"model": opsSD, "operation": "remove-background", "image": opsPNG(t, photo)})
		a.ok(t, "remove-background on the pipeline (the node's ISNet)", 1, 128, 128)
		b := opsPost(t, entry, map[string]any{"model": opsISNet, "operation": "remove-background", "image": opsPNG(t, photo)})
		b.ok(t, "remove-background on ISNet", 1, 128, 128)
		gone := 0
		for p := 3; p < len(a.images[0].Pix); p += 4 {
			if a.images[0].Pix[p] == 0 {
				gone++
			}
		}
		if gone < 500 || gone > 128*128-500 {
			t.Errorf("%d transparent pixels of %d", gone, 128*128)
		}
		if !bytes.Equal(a.images[0].Pix, b.images[0].Pix) {
			t.Error("the pipeline's remove-background differs from ISNet's")
		}
	})
	t.Run("upscale", func(t *testing.T) {
		hr := opsPhoto(t, image.Rect(128, 40, 384, 296))
		for _, s := range []int{2, 4} {
			lr := opsBoxDown(hr, s)
			r := opsPost(t, entry, map[string]any{"model": opsESRGAN, "operation": "upscale", "image": opsPNG(t, lr), "upscale_factor": s})
			r.ok(t, fmt.Sprintf("upscale x%d", s), 1, 256, 256)
			served(t, r)
			cr := image.NewNRGBA(hr.Rect)
			xdraw.CatmullRom.Scale(cr, cr.Rect, lr, lr.Rect, xdraw.Src, nil)
			pm, pc, pb := opsPSNR(r.images[0], hr), opsPSNR(cr, hr), opsPSNR(bicubic(lr, 256, 256), hr)
			t.Logf("x%d (%dx%d -> 256x256): PSNR ESRGAN %.2f dB, bicubic %.2f dB (Catmull-Rom %.2f dB)", s, lr.Rect.Dx(), lr.Rect.Dy(), pm, pb, pc)
			if pm <= pb || pm <= pc {
				t.Errorf("x%d: ESRGAN %.2f dB does not beat bicubic %.2f / Catmull-Rom %.2f dB", s, pm, pb, pc)
			}
		}
	})
	t.Run("controlnet", func(t *testing.T) {
		base := map[string]any{"model": opsTurbo, "prompt": "a portrait", "size": "128x128", "control_image": opsPNG(t, photo), "seed": 11}
		with := func(kv ...any) map[string]any {
			m := map[string]any{}
			for k, v := range base {
				m[k] = v
			}
			for i := 0; i < len(kv); i += 2 {
				m[kv[i].(string)] = kv[i+1]
			}
			return m
		}
		got := map[string]string{}
		for _, c := range []struct {
			name string
			body map[string]any
		}{
			{"canny", with("control_type", "canny")},
			{"canny x0", with("control_type", "canny", "control_scale", 0)},
			{"canny x2", with("control_type", "canny", "control_scale", 2)},
			{"depth", with("control_type", "depth", "control_scale", 1)},
		} {
			r := opsPost(t, entry, c.body)
			r.ok(t, "ControlNet "+c.name, 1, 128, 128)
			got[c.name] = r.raw[0]
		}
		if got["canny"] == got["canny x0"] || got["canny"] == got["canny x2"] || got["canny"] == got["depth"] {
			t.Error("control_scale or control_type does not change the image")
		}
		r := opsPost(t, entry, map[string]any{"model": opsTurbo, "operation": "img2img", "prompt": "x", "image": opsPNG(t, wide),
			"control_type": "depth", "strength": 1, "seed": 1})
		r.ok(t, "img2img guided by the depth of its own image", 1, 100, 76)
		r = opsPost(t, entry, with("model", opsSD, "control_type", "canny"))
		if r.status != 400 || r.param != "control_type" {
			t.Errorf("ControlNet on a model without one: %d param %q, want 400 on control_type", r.status, r.param)
		}
	})
	t.Run("safety_check", func(t *testing.T) {
		r := opsPost(t, entry, map[string]any{"model": opsSD, "prompt": "a cat", "size": "64x64", "n": 2, "seed": 1, "safety_check": true})
		if r.status != 200 || r.filtered == nil || len(r.images)+*r.filtered != 2 {
			t.Fatalf("safety_check: %d, %d images, filtered %v", r.status, len(r.images), r.filtered)
		}
		r.ok(t, "generate with safety_check", len(r.images), 64, 64)
		// The generated checker flags a very red picture: inpainting a
		// corner of one keeps it red (dropped), of a blue one not.
		hole := opsMask(64, 64, image.Rect(0, 0, 8, 8))
		red := opsPost(t, entry, map[string]any{"model": opsSD, "operation": "inpaint", "prompt": "x", "seed": 1, "safety_check": true,
			"image": opsPNG(t, opsSolid(64, 64, color.NRGBA{230, 10, 10, 255})), "mask": opsPNG(t, hole)})
		blue := opsPost(t, entry, map[string]any{"model": opsSD, "operation": "inpaint", "prompt": "x", "seed": 1, "safety_check": true,
			"image": opsPNG(t, opsSolid(64, 64, color.NRGBA{10, 10, 230, 255})), "mask": opsPNG(t, hole)})
		red.ok(t, "a flagged picture", 0, 0, 0)
		blue.ok(t, "an unflagged picture", 1, 64, 64)
		if red.filtered == nil || *red.filtered != 1 || blue.filtered == nil || *blue.filtered != 0 {
			t.Errorf("safety_filtered: red %v, blue %v; want 1 and 0", red.filtered, blue.filtered)
		}
		t.Logf("safety_check: text to image n=2 kept %d, filtered %d; red picture filtered, blue kept", len(r.images), *r.filtered)
		r = opsPost(t, entry, map[string]any{"model": opsInpaint, "prompt": "a cat", "size": "64x64", "safety_check": true})
		if r.status != 400 || r.param != "safety_check" {
			t.Errorf("safety_check on a model without a checker: %d param %q", r.status, r.param)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		tall := opsSolid(8, 4097, color.NRGBA{90, 90, 90, 255})
		for _, c := range []struct {
			name, param string
			body        map[string]any
		}{
			{"a mask of another size", "mask", map[string]any{"model": opsSD, "operation": "inpaint", "prompt": "x",
				"image": opsPNG(t, photo), "mask": opsPNG(t, opsMask(64, 64, image.Rect(0, 0, 8, 8)))}},
			{"strength 1.5", "strength", map[string]any{"model": opsSD, "operation": "img2img", "prompt": "x", "image": opsPNG(t, photo), "strength": 1.5}},
			{"upscale_factor 3", "upscale_factor", map[string]any{"model": opsESRGAN, "operation": "upscale", "image": opsPNG(t, photo), "upscale_factor": 3}},
			{"img2img without an image", "image", map[string]any{"model": opsSD, "operation": "img2img", "prompt": "x"}},
			{"a 4097-pixel side in size", "size", map[string]any{"model": opsSD, "prompt": "x", "size": "4097x512"}},
			{"a 4097-pixel side in the image", "image", map[string]any{"model": opsSD, "operation": "img2img", "prompt": "x", "image": opsPNG(t, tall)}},
			{"outpaint_percent 150", "outpaint_percent", map[string]any{"model": opsSD, "operation": "outpaint", "prompt": "x", "image": opsPNG(t, photo), "outpaint_percent": 150}},
			{"control_scale 3", "control_scale", map[string]any{"model": opsTurbo, "prompt": "x", "control_type": "canny", "control_image": opsPNG(t, photo), "control_scale": 3}},
			{"layer_count 9", "layer_count", map[string]any{"model": opsSD, "operation": "layers", "image": opsPNG(t, photo), "layer_count": 9}},
		} {
			r := opsPost(t, entry, c.body)
			if r.status != http.StatusBadRequest || r.param != c.param {
				t.Errorf("%s: %d %s param=%q (%s); want 400 naming %q", c.name, r.status, r.code, r.param, r.msg, c.param)
				continue
			}
			t.Logf("%s: 400 %s on %s: %s", c.name, r.code, r.param, r.msg)
		}
	})
}

// opsSlowJob is a text-to-image request that runs for seconds (1024x1024
// with 200 denoising steps), so a burst of them overlaps.
func opsSlowJob(seed int) map[string]any {
	return map[string]any{"model": opsSD, "prompt": "a slow picture", "size": "1024x1024", "num_inference_steps": 200, "seed": seed}
}

// opsBurst sends n slow jobs to p at once and counts the outcomes by
// status; every 503 must carry a Retry-After of whole seconds.
func opsBurst(t *testing.T, p *proc, n int) (statuses map[int]int, backends map[string]int, retries []string) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses, backends = map[int]int{}, map[string]int{}
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := opsTry(p, opsSlowJob(i))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			statuses[r.status]++
			switch r.status {
			case http.StatusOK:
				backends[r.backend]++
				if len(r.images) != 1 || r.images[0].Rect.Dx() != 1024 || r.images[0].Rect.Dy() != 1024 {
					t.Errorf("request %d: %d images", i, len(r.images))
				}
			case http.StatusServiceUnavailable:
				retries = append(retries, r.retry)
				if s, err := strconv.Atoi(r.retry); err != nil || s < 1 || r.code != "server_overloaded" {
					t.Errorf("request %d: 503 %s with Retry-After %q", i, r.code, r.retry)
				}
			default:
				t.Errorf("request %d: %d %s %s", i, r.status, r.code, r.msg)
			}
		}()
	}
	close(start)
	wg.Wait()
	return statuses, backends, retries
}

// With one image job at a time and two waiting, a burst of six on a
// one-node mesh: three served, three refused with 503 and Retry-After.
func TestImagesOpsQueueOneNode(t *testing.T) {
	p := startOpsNode(t, "imgq-solo", "127.0.81.1", []string{onnxtest.AssetDir(t, "tiny-sd", "manifest.json")}, "",
		"--image-concurrency", "1", "--image-queue", "2")
	waitMembers(t, []*proc{p}, 1)
	opsPost(t, p, opsSlowJob(99)).ok(t, "warm-up", 1, 1024, 1024)
	statuses, _, retries := opsBurst(t, p, 6)
	t.Logf("burst of 6 on one node (concurrency 1, queue 2): %v, Retry-After %v s", statuses, retries)
	if statuses[200] != 3 || statuses[503] != 3 {
		t.Fatalf("statuses %v, want 3 x 200 and 3 x 503", statuses)
	}
}

// The same burst on a three-node mesh where every node holds the model:
// the refusals of a full node fail over to the others, so all six are
// served, by at least two nodes.
func TestImagesOpsQueueThreeNodes(t *testing.T) {
	sd := []string{onnxtest.AssetDir(t, "tiny-sd", "manifest.json")}
	flags := []string{"--image-concurrency", "1", "--image-queue", "2"}
	ps := []*proc{startOpsNode(t, "imgq-a", "127.0.82.1", sd, "", flags...)}
	for i, ip := range []string{"127.0.82.2", "127.0.82.3"} {
		ps = append(ps, startOpsNode(t, fmt.Sprintf("imgq-%c", 'b'+i), ip, sd, "127.0.82.1:17946", flags...))
	}
	waitMembers(t, ps, 3)
	statuses, backends, _ := opsBurst(t, ps[0], 6)
	t.Logf("burst of 6 into a 3-node mesh: %v, served by %v", statuses, backends)
	if statuses[200] != 6 {
		t.Fatalf("statuses %v, want 6 x 200", statuses)
	}
	if len(backends) < 2 {
		t.Errorf("served by %v; one node can hold only 3", backends)
	}
}

// bicubic returns img resized to w×h with Catmull-Rom (bicubic)
// resampling: the baseline an upscaling model should beat.
func bicubic(img image.Image, w, h int) *image.NRGBA {
	dst := image.NewNRGBA(image.Rect(0, 0, w, h))
	xdraw.CatmullRom.Scale(dst, dst.Rect, img, img.Bounds(), xdraw.Src, nil)
	return dst
}

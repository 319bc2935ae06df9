package diffusion

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

func decodePNG(b []byte) (image.Image, error) { return png.Decode(bytes.NewReader(b)) }

// TestCLIPTokenizerParity compares the Go tokenizer with the encodings the
// generator computed with CLIP's reference BPE algorithm, for both pad
// tokens (<|endoftext|> in the flat folders, "!" in the turbo layout).
func TestCLIPTokenizerParity(t *testing.T) {
	for _, name := range []string{"tiny-sd", "tiny-sd-turbo"} {
		dir := onnxtest.AssetDir(t, name, "tokenizer_expected.json")
		var want map[string][]int64
		raw, _ := os.ReadFile(filepath.Join(dir, "tokenizer_expected.json"))
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatal(err)
		}
		sub := ""
		if name == "tiny-sd-turbo" {
			sub = "tokenizer"
		}
		tok, err := loadCLIP(filepath.Join(dir, sub, "vocab.json"), filepath.Join(dir, sub, "merges.txt"), filepath.Join(dir, sub, "tokenizer_config.json"), 0)
		if err != nil {
			t.Fatal(err)
		}
		for text, ids := range want {
			got, _ := tok.encode(text)
			if len(got) != len(ids) {
				t.Fatalf("%s %q: %d ids, want %d", name, text, len(got), len(ids))
			}
			for i := range ids {
				if got[i] != ids[i] {
					t.Fatalf("%s %q: ids %v, want %v", name, text, got, ids)
				}
			}
		}
	}
}

// TestGenerate: n PNG-ready images of the asked size, repeatable from the
// seed bit for bit, different for another seed, and different from each
// other within one request.
func TestGenerate(t *testing.T) {
	rt := onnxtest.Runtime(t)
	for _, name := range []string{"tiny-sd", "tiny-sd-turbo"} {
		e := loadTiny(t, rt, name)
		ctx := context.Background()
		job := engine.ImageJob{Prompt: "a photo of a cat", N: 3, Width: 96, Height: 64, Seed: seed(42)}
		a, err := e.RunImages(ctx, job)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(a.Images) != 3 || a.Seed != 42 {
			t.Fatalf("%s: %d images, seed %d", name, len(a.Images), a.Seed)
		}
		for _, im := range a.Images {
			if im.Rect.Dx() != 96 || im.Rect.Dy() != 64 {
				t.Fatalf("%s: image %v, want 96x64", name, im.Rect)
			}
		}
		if sameImages(a.Images[:1], a.Images[1:2]) {
			t.Fatalf("%s: two images of one request are identical", name)
		}
		b, err := e.RunImages(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		if !sameImages(a.Images, b.Images) {
			t.Fatalf("%s: the same seed gave different images", name)
		}
		job.Seed = seed(43)
		c, err := e.RunImages(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		if sameImages(a.Images[:1], c.Images[:1]) {
			t.Fatalf("%s: seeds 42 and 43 gave the same image", name)
		}
		// A side that is no multiple of 8 is rounded.
		r, err := e.RunImages(ctx, engine.ImageJob{Prompt: "x", N: 1, Width: 67, Height: 100, Seed: seed(1)})
		if err != nil {
			t.Fatal(err)
		}
		if s := r.Images[0].Rect.Size(); s != image.Pt(64, 104) {
			t.Fatalf("%s: 67x100 gave %v, want 64x104", name, s)
		}
	}
}

// TestOperationSizes runs every operation each generated model supports
// and checks the size of what comes back.
func TestOperationSizes(t *testing.T) {
	rt := onnxtest.Runtime(t)
	isnet := loadISNet(t, rt)
	src := photo(t) // 150x103
	mask := image.NewGray(src.Rect)
	for y := 30; y < 70; y++ {
		for x := 40; x < 100; x++ {
			mask.Pix[y*mask.Stride+x] = 0xff
		}
	}
	ctx := context.Background()
	type tc struct {
		model string
		job   engine.ImageJob
		want  image.Point
		count int
	}
	base := engine.ImageJob{Prompt: "a painting", N: 1, Seed: seed(7), Image: src, Segmenter: isnet}
	with := func(f func(j *engine.ImageJob)) engine.ImageJob { j := base; f(&j); return j }
	cases := []tc{
		{"tiny-sd", with(func(j *engine.ImageJob) { j.Operation = engine.OpImg2Img }), image.Pt(150, 103), 1},
		{"tiny-sd", with(func(j *engine.ImageJob) { j.Operation = engine.OpImg2Img; j.Width, j.Height = 128, 64 }), image.Pt(128, 64), 1},
		{"tiny-sd", with(func(j *engine.ImageJob) { j.Operation = engine.OpVariations; j.Prompt = ""; j.N = 2 }), image.Pt(150, 103), 2},
		{"tiny-sd", with(func(j *engine.ImageJob) { j.Operation = engine.OpInpaint; j.Mask = mask }), image.Pt(150, 103), 1},
		{"tiny-sd", with(func(j *engine.ImageJob) { j.Operation = engine.OpOutpaint; j.OutpaintPercent = 20 }), image.Pt(150+60, 103+42), 1},
		{"tiny-sd", with(func(j *engine.ImageJob) { j.Operation = engine.OpEdit; j.Prompt = "make it winter" }), image.Pt(150, 103), 1},
		{"tiny-sd", with(func(j *engine.ImageJob) { j.Operation = engine.OpRemoveBackground }), image.Pt(150, 103), 1},
		{"tiny-sd", with(func(j *engine.ImageJob) { j.Operation = engine.OpLayers; j.LayerCount = 3 }), image.Pt(150, 103), 3},
		{"tiny-sd-inpaint", with(func(j *engine.ImageJob) { j.Operation = engine.OpInpaint; j.Mask = mask }), image.Pt(150, 103), 1},
		{"tiny-sd-inpaint", with(func(j *engine.ImageJob) { j.Operation = engine.OpOutpaint }), image.Pt(150+76, 103+52), 1},
		{"tiny-sd-inpaint", with(func(j *engine.ImageJob) { j.Operation = engine.OpGenerate; j.Image = nil; j.Width, j.Height = 64, 64 }), image.Pt(64, 64), 1},
		{"tiny-sd-pix2pix", with(func(j *engine.ImageJob) { j.Operation = engine.OpEdit; j.Prompt = "turn it into snow" }), image.Pt(150, 103), 1},
		{"tiny-sd-turbo", with(func(j *engine.ImageJob) {
			j.Operation, j.Image, j.Width, j.Height = engine.OpGenerate, nil, 64, 96
			j.ControlType, j.ControlImage, j.ControlScale = engine.ControlCanny, src, f64(0.8)
		}), image.Pt(64, 96), 1},
		{"tiny-sd-turbo", with(func(j *engine.ImageJob) { j.Operation = engine.OpImg2Img; j.ControlType = engine.ControlDepth }), image.Pt(150, 103), 1},
	}
	engines := map[string]*Engine{}
	for _, c := range cases {
		e := engines[c.model]
		if e == nil {
			e = loadTiny(t, rt, c.model)
			engines[c.model] = e
		}
		res, err := e.RunImages(ctx, c.job)
		if err != nil {
			t.Fatalf("%s %q: %v", c.model, c.job.Operation, err)
		}
		if len(res.Images) != c.count {
			t.Fatalf("%s %q: %d images, want %d", c.model, c.job.Operation, len(res.Images), c.count)
		}
		for _, im := range res.Images {
			if im.Rect.Size() != c.want {
				t.Fatalf("%s %q: image %v, want %v", c.model, c.job.Operation, im.Rect.Size(), c.want)
			}
		}
	}
}

// TestInpaintKeepsOutside: pixels outside the mask come back unchanged,
// inside they change, for the mask-blend method (4-channel UNet) and the
// 9-channel inpainting UNet.
func TestInpaintKeepsOutside(t *testing.T) {
	rt := onnxtest.Runtime(t)
	src := photo(t)
	mask := image.NewGray(src.Rect)
	in := func(x, y int) bool { return x >= 50 && x < 110 && y >= 20 && y < 80 }
	for y := range src.Rect.Dy() {
		for x := range src.Rect.Dx() {
			if in(x, y) {
				mask.Pix[y*mask.Stride+x] = 0xff
			}
		}
	}
	for _, name := range []string{"tiny-sd", "tiny-sd-inpaint"} {
		e := loadTiny(t, rt, name)
		res, err := e.RunImages(context.Background(), engine.ImageJob{Operation: engine.OpInpaint, Prompt: "a cat", N: 1, Seed: seed(3), Image: src, Mask: mask})
		if err != nil {
			t.Fatal(err)
		}
		out := res.Images[0]
		if d := maxDiff(src, out, func(x, y int) bool { return !in(x, y) }); d != 0 {
			t.Fatalf("%s: pixels outside the mask changed by up to %d", name, d)
		}
		if d := maxDiff(src, out, in); d < 20 {
			t.Fatalf("%s: pixels inside the mask changed by only %d", name, d)
		}
	}
}

// TestLayersRecompose: the layers put over each other in order give the
// picture back; the background is opaque and the foreground layers are
// partly transparent.
func TestLayersRecompose(t *testing.T) {
	rt := onnxtest.Runtime(t)
	e := loadTiny(t, rt, "tiny-sd")
	src := photo(t)
	isnet := loadISNet(t, rt)
	for _, k := range []int{2, 4} {
		res, err := e.RunImages(context.Background(), engine.ImageJob{Operation: engine.OpLayers, LayerCount: k, N: 1, Seed: seed(5), Image: src, Segmenter: isnet})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Images) != k {
			t.Fatalf("%d layers, want %d", len(res.Images), k)
		}
		bg := res.Images[0]
		for i := 3; i < len(bg.Pix); i += 4 {
			if bg.Pix[i] != 0xff {
				t.Fatal("the background layer is not opaque")
			}
		}
		if maxDiff(bg, src, nil) == 0 {
			t.Fatal("the background layer is the picture itself: the foreground was not repainted")
		}
		comp := image.NewRGBA(src.Rect)
		for _, l := range res.Images {
			drawOver(comp, l)
		}
		if d := maxDiff(toNRGBA(comp), src, nil); d > 2 {
			t.Fatalf("%d layers recompose with an error of %d", k, d)
		}
		fgAlpha := 0
		for i := 3; i < len(res.Images[1].Pix); i += 4 {
			fgAlpha += int(res.Images[1].Pix[i])
		}
		if fgAlpha == 0 || fgAlpha == 255*src.Rect.Dx()*src.Rect.Dy() {
			t.Fatal("the foreground layer is empty or opaque")
		}
	}
}

// TestSafetyCheck: the generated checker flags very red pictures; an
// img2img of a red picture is dropped and counted, of a blue one kept.
func TestSafetyCheck(t *testing.T) {
	rt := onnxtest.Runtime(t)
	e := loadTiny(t, rt, "tiny-sd")
	ctx := context.Background()
	red, blue := solid(64, 64, color.NRGBA{255, 0, 0, 255}), solid(64, 64, color.NRGBA{0, 0, 255, 255})
	for _, c := range []struct {
		img      image.Image
		filtered int
	}{{red, 1}, {blue, 0}} {
		job := engine.ImageJob{Operation: engine.OpInpaint, Prompt: "x", N: 1, Seed: seed(1), Image: c.img, Mask: image.NewGray(image.Rect(0, 0, 64, 64)), SafetyCheck: true}
		res, err := e.RunImages(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		if res.Filtered != c.filtered || len(res.Images) != 1-c.filtered {
			t.Fatalf("filtered %d, kept %d; want filtered %d", res.Filtered, len(res.Images), c.filtered)
		}
	}
	// A model without a checker refuses the field.
	turbo := loadTiny(t, rt, "tiny-sd-turbo")
	_, err := turbo.RunImages(ctx, engine.ImageJob{Prompt: "x", N: 1, SafetyCheck: true})
	var ie *engine.InputError
	if !errors.As(err, &ie) || ie.Param != "safety_check" {
		t.Fatalf("safety_check on a model without a checker: %v", err)
	}
}

// TestBadInput: each bad field is an InputError naming it.
func TestBadInput(t *testing.T) {
	rt := onnxtest.Runtime(t)
	e := loadTiny(t, rt, "tiny-sd")
	pix := loadTiny(t, rt, "tiny-sd-pix2pix")
	src := solid(64, 64, color.NRGBA{10, 20, 30, 255})
	cases := []struct {
		e     *Engine
		job   engine.ImageJob
		param string
	}{
		{e, engine.ImageJob{Operation: engine.OpInpaint, Prompt: "x", Image: src, Mask: image.NewGray(image.Rect(0, 0, 32, 64))}, "mask"},
		{e, engine.ImageJob{Operation: engine.OpImg2Img, Prompt: "x", Image: src, Strength: f64(1.5)}, "strength"},
		{e, engine.ImageJob{Operation: engine.OpImg2Img, Prompt: "x"}, "image"},
		{e, engine.ImageJob{Prompt: "x", Width: 4097, Height: 64}, "size"},
		{e, engine.ImageJob{Prompt: "x", N: 5}, "n"},
		{e, engine.ImageJob{Operation: engine.OpUpscale, Image: src}, "operation"},
		{e, engine.ImageJob{Prompt: "x", ControlType: engine.ControlCanny, ControlImage: src}, "control_type"},
		{e, engine.ImageJob{Operation: engine.OpOutpaint, Image: solid(3000, 64, color.NRGBA{}), OutpaintPercent: 50}, "outpaint_percent"},
		{e, engine.ImageJob{Operation: engine.OpImg2Img, Prompt: "x", Image: src, Strength: f64(0.1), Steps: 3}, "strength"},
		{pix, engine.ImageJob{Prompt: "x"}, "operation"},
		{pix, engine.ImageJob{Operation: engine.OpInpaint, Prompt: "x", Image: src, Mask: src}, "operation"},
	}
	for i, c := range cases {
		_, err := c.e.RunImages(context.Background(), c.job)
		var ie *engine.InputError
		if !errors.As(err, &ie) || ie.Param != c.param {
			t.Fatalf("case %d: error %v, want an InputError on %q", i, err, c.param)
		}
	}
}

// TestCancel: a cancelled context stops the job with its error.
func TestCancel(t *testing.T) {
	e := loadTiny(t, onnxtest.Runtime(t), "tiny-sd")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.RunImages(ctx, engine.ImageJob{Prompt: "x", N: 1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
}

// TestSchedulers checks the samplers' timesteps and noise levels against
// diffusers' values for SD's scaled-linear betas.
func TestSchedulers(t *testing.T) {
	dir := t.TempDir()
	write := func(class, spacing string) *schedConfig {
		p := filepath.Join(dir, class+spacing+".json")
		os.WriteFile(p, []byte(`{"_class_name":"`+class+`","beta_start":0.00085,"beta_end":0.012,"beta_schedule":"scaled_linear","timestep_spacing":"`+spacing+`","steps_offset":1,"set_alpha_to_one":false}`), 0o644)
		c, err := readSchedConfig(p)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	euler := write(schedEuler, spacingTrail)
	s, err := newSampler(euler, 1, 1, nil)
	if err != nil || len(s.ts) != 1 || s.ts[0] != 999 {
		t.Fatalf("trailing 1 step: %v %v", s, err)
	}
	if d := s.sigmas[0] - 14.6146; d > 1e-3 || d < -1e-3 {
		t.Fatalf("sigma(999) = %v, want 14.6146", s.sigmas[0])
	}
	lead := write(schedEulerA, spacingLead)
	s, _ = newSampler(lead, 4, 1, nil)
	if want := []float64{751, 501, 251, 1}; !equalF(s.ts, want) {
		t.Fatalf("leading 4 steps %v, want %v", s.ts, want)
	}
	s, _ = newSampler(lead, 4, 0.5, nil)
	if want := []float64{251, 1}; !equalF(s.ts, want) {
		t.Fatalf("leading 4 steps at strength 0.5: %v, want %v", s.ts, want)
	}
	lcm := write(schedLCM, spacingTrail)
	s, _ = newSampler(lcm, 4, 1, nil)
	if want := []float64{999, 759, 499, 259}; !equalF(s.ts, want) {
		t.Fatalf("LCM 4 steps %v, want %v", s.ts, want)
	}
	ddim := write(schedDDIM, spacingLead)
	s, _ = newSampler(ddim, 2, 1, nil)
	if want := []float64{501, 1}; !equalF(s.ts, want) || s.stepGap != 500 {
		t.Fatalf("DDIM 2 steps %v gap %d", s.ts, s.stepGap)
	}
	// A DDIM step with the exact noise recovers x0.
	x0, eps := []float32{0.5, -0.25}, []float32{1, -2}
	x := make([]float32, 2)
	s.addNoise(x, x0, eps, 1)
	s.step(1, x, eps, nil)
	a := ddim.trainAlphasCumul[0]
	for i := range x {
		want := float32(math.Sqrt(a))*x0[i] + float32(math.Sqrt(1-a))*eps[i]
		if d := x[i] - want; d > 1e-5 || d < -1e-5 {
			t.Fatalf("DDIM last step %v, want %v", x[i], want)
		}
	}
	// float16 round trip.
	for _, v := range []float32{0, 1, -2.5, 65504, 6.1e-5, 3e-7, 0.1} {
		if got := f16ToF32(f32ToF16(v)); math.Abs(float64(got-v)) > math.Abs(float64(v))*1e-3+6e-8 {
			t.Fatalf("f16(%v) = %v", v, got)
		}
	}
}

func equalF(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

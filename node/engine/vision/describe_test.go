package vision

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx/onnxtest"
)

// describerSpec is the spec of the describer folder's manifest.
func describerSpec(t testing.TB) engine.Spec {
	t.Helper()
	files := map[string]string{
		"detector": "centernet.onnx", "labels": "coco-labels.txt",
		"face_detector": "blazeface-back-256.onnx",
		"ocr_detector":  "ch_PP-OCRv4_det_infer.onnx", "ocr_recognizer": "ch_PP-OCRv4_rec_infer.onnx", "ocr_dictionary": "ppocr_keys_v1.txt",
	}
	var names []string
	for _, f := range files {
		names = append(names, f)
	}
	return engine.Spec{
		ID:      "onnx/composed-describer/v1",
		Task:    engine.TaskImageDescription,
		Dir:     onnxtest.AssetDir(t, "describer", names...),
		Files:   files,
		Options: map[string]string{"detector.confidence_threshold": "0.3", "faces.confidence_threshold": "0.5", "ocr.drop_score": "0.5"},
	}
}

func loadDescriber(t testing.TB) engine.Describer {
	t.Helper()
	d, err := LoadComposedDescriber(onnxtest.Runtime(t), describerSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestComposedDescriber describes the astronaut (CenterNet finds a person
// at 0.61 whose box, x 0-365 of 512, centres in the middle third;
// BlazeFace finds her face) and the page photo (PP-OCR
// reads its heading), at every detail level, and checks that each level
// says at least what the shorter one said.
func TestComposedDescriber(t *testing.T) {
	d := loadDescriber(t)
	ctx := context.Background()
	for _, tc := range []struct {
		photo string
		want  map[string][]string // detail -> phrases
	}{
		{"astronaut.png", map[string][]string{
			engine.DetailCaption:  {"a person"},
			engine.DetailDetailed: {"a person", "There is a person in the centre"},
			engine.DetailMore:     {"a person", "A face is visible", "dominant colours"},
		}},
		{"page.png", map[string][]string{
			engine.DetailCaption:  {"text reading", "segmentation"},
			engine.DetailDetailed: {"segmentation", "lines of text"},
			engine.DetailMore:     {"segmentation", "markers", "histogram", "The text reads"},
		}},
	} {
		img := photo(t, tc.photo)
		prev := 0
		for _, detail := range []string{engine.DetailCaption, engine.DetailDetailed, engine.DetailMore} {
			got, err := d.Describe(ctx, engine.DescribeRequest{Image: img, Detail: detail})
			if err != nil {
				t.Fatalf("%s %s: %v", tc.photo, detail, err)
			}
			t.Logf("%s [%s]: %s", tc.photo, detail, got)
			for _, p := range tc.want[detail] {
				if !strings.Contains(got, p) {
					t.Errorf("%s [%s] does not say %q: %s", tc.photo, detail, p, got)
				}
			}
			if len(got) <= prev {
				t.Errorf("%s [%s] is not longer than the shorter level (%d <= %d chars)", tc.photo, detail, len(got), prev)
			}
			prev = len(got)
			if detail == engine.DetailCaption && strings.Count(got, ". ") > 0 {
				t.Errorf("caption is more than one sentence: %s", got)
			}
		}
	}
	_, err := d.Describe(ctx, engine.DescribeRequest{Image: photo(t, "page.png"), Detail: "novel"})
	var ie *engine.InputError
	if !errors.As(err, &ie) || ie.Param != "detail" {
		t.Errorf("detail \"novel\": got %v, want an InputError for detail", err)
	}
}

// TestDescribeWords checks the template's English on fixed findings.
func TestDescribeWords(t *testing.T) {
	f := findings{w: 300, h: 100, objects: []engine.Detection{
		{Label: "person", Box: [4]float32{10, 0, 40, 100}},
		{Label: "cup", Box: [4]float32{250, 0, 40, 40}},
		{Label: "person", Box: [4]float32{120, 0, 40, 100}},
		{Label: "wine glass", Box: [4]float32{130, 0, 20, 20}},
		{Label: "wine glass", Box: [4]float32{200, 0, 20, 20}},
	}}
	got := f.write(engine.DetailDetailed, false)
	want := "A picture of two people, a cup and two wine glasses. There are two people: one on the left and one in the centre. " +
		"There is a cup on the right. There are two wine glasses: one in the centre and one on the right."
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	for in, want := range map[string]string{"bus": "buses", "knife": "knives", "teddy bear": "teddy bears", "sheep": "sheep", "toothbrush": "toothbrushes", "hair drier": "hair driers"} {
		if got := plural(in); got != want {
			t.Errorf("plural(%q) = %q, want %q", in, got, want)
		}
	}
	for rgb, want := range map[[3]float32]string{{250, 250, 250}: "white", {10, 10, 10}: "black", {128, 128, 128}: "grey", {220, 30, 30}: "red", {30, 60, 200}: "blue", {40, 180, 40}: "green", {240, 220, 40}: "yellow"} {
		if got := colourName(rgb[0], rgb[1], rgb[2]); got != want {
			t.Errorf("colourName(%v) = %s, want %s", rgb, got, want)
		}
	}
}

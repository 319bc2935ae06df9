package vision

import (
	"context"
	"errors"
	"fmt"
	"image"
	"math"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// composed is the composed describer: not a learned captioner but a
// template filled from the real models' results — CenterNet objects
// (labels, counts, horizontal positions), BlazeFace faces, PP-OCR text —
// and the image's dominant colours. Its output is plain, editable English
// whose length follows the request's detail.
type composed struct {
	id    string
	det   engine.Detector
	faces engine.FaceAnalyzer // nil without a face detector
	ocr   engine.TextReader   // nil without the OCR models
	once  sync.Once
	err   error
}

// LoadComposedDescriber loads the composed describer from one folder that
// holds its components' files. spec.Files roles: "detector" and "labels"
// (CenterNet, see LoadDetector; required), "face_detector" and optionally
// "face_embedder" (BlazeFace, see LoadFaces), "ocr_detector",
// "ocr_recognizer" and "ocr_dictionary" (PP-OCR, see LoadOCR); faces and
// OCR are left out when their files are not named. Options prefixed
// "detector.", "faces." and "ocr." are passed to the components without the
// prefix (e.g. "ocr.drop_score": "0.6").
func LoadComposedDescriber(rt *onnx.Runtime, spec engine.Spec) (engine.Describer, error) {
	if err := checkTask(spec, engine.TaskImageDescription); err != nil {
		return nil, err
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, err
	}
	sub := func(task engine.Task, prefix string, roles map[string]string) engine.Spec {
		s := engine.Spec{ID: spec.ID, Task: task, Dir: spec.Dir, Files: map[string]string{}, Options: map[string]string{}}
		for role, from := range roles {
			if f := spec.Files[from]; f != "" {
				s.Files[role] = f
			}
		}
		for k, v := range spec.Options {
			if rest, ok := strings.CutPrefix(k, prefix+"."); ok {
				s.Options[rest] = v
			}
		}
		return s
	}
	c := &composed{id: spec.ID}
	c.det, err = LoadDetector(rt, sub(engine.TaskObjectDetection, "detector", map[string]string{"model": "detector", "labels": "labels"}))
	if err != nil {
		return nil, err
	}
	if spec.Files["face_detector"] != "" {
		c.faces, err = LoadFaces(rt, sub(engine.TaskFaceDetection, "faces", map[string]string{"detector": "face_detector", "embedder": "face_embedder"}))
		if err != nil {
			c.Close()
			return nil, err
		}
	}
	if spec.Files["ocr_detector"] != "" || spec.Files["ocr_recognizer"] != "" {
		c.ocr, err = LoadOCR(rt, sub(engine.TaskTextRecognition, "ocr", map[string]string{"detector": "ocr_detector", "recognizer": "ocr_recognizer", "dictionary": "ocr_dictionary"}))
		if err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// ID returns the canonical model id.
func (c *composed) ID() string { return c.id }

// Close releases the component engines.
func (c *composed) Close() error {
	c.once.Do(func() {
		var errs []error
		for _, e := range []engine.Engine{c.det, c.faces, c.ocr} {
			if e != nil {
				errs = append(errs, e.Close())
			}
		}
		c.err = errors.Join(errs...)
	})
	return c.err
}

// findings is what the components saw in one image.
type findings struct {
	w, h    int
	objects []engine.Detection
	faces   []engine.Face
	text    []engine.TextLine
	colours []string
}

// Describe runs the components the detail level needs (caption: objects and
// text; detailed: the same; more: plus faces and colours), concurrently,
// and fills the template.
func (c *composed) Describe(ctx context.Context, req engine.DescribeRequest) (string, error) {
	detail := req.Detail
	switch detail {
	case "":
		detail = engine.DetailCaption
	case engine.DetailCaption, engine.DetailDetailed, engine.DetailMore:
	default:
		return "", &engine.InputError{Param: "detail", Msg: fmt.Sprintf("detail must be %q, %q or %q", engine.DetailCaption, engine.DetailDetailed, engine.DetailMore)}
	}
	if req.Image == nil || req.Image.Bounds().Empty() {
		return "", &engine.InputError{Param: "image", Msg: "image has no pixels"}
	}
	f := findings{w: req.Image.Bounds().Dx(), h: req.Image.Bounds().Dy()}
	// Convert once: the components read an RGBA image in place.
	img := image.Image(toRGBA(req.Image))
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) {
		f.objects, err = c.det.Detect(gctx, engine.DetectRequest{Image: img})
		return err
	})
	if c.ocr != nil {
		g.Go(func() (err error) {
			f.text, err = c.ocr.Read(gctx, img)
			return err
		})
	}
	if detail == engine.DetailMore {
		if c.faces != nil {
			g.Go(func() (err error) {
				f.faces, err = c.faces.Faces(gctx, engine.FaceRequest{Image: img})
				return err
			})
		}
		g.Go(func() error {
			f.colours = dominantColours(img, 3)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return "", cerr
		}
		return "", err
	}
	return f.write(detail, c.faces != nil), nil
}

// group is the detections of one label.
type group struct {
	label string
	dets  []engine.Detection
}

// groups collects detections by label, in the order of each label's best
// detection (detections come best first).
func groups(dets []engine.Detection) []group {
	var out []group
	at := map[string]int{}
	for _, d := range dets {
		i, ok := at[d.Label]
		if !ok {
			i = len(out)
			at[d.Label] = i
			out = append(out, group{label: d.Label})
		}
		out[i].dets = append(out[i].dets, d)
	}
	return out
}

// maxTextChars bounds the text quoted by the "more" description.
const maxTextChars = 600

// write fills the template for detail.
func (f *findings) write(detail string, haveFaces bool) string {
	gs := groups(f.objects)
	var s []string
	var what []string
	for _, g := range gs {
		what = append(what, countNoun(len(g.dets), g.label))
	}
	first := ""
	if len(f.text) > 0 {
		first = f.text[0].Text
	}
	switch {
	case len(what) > 0 && first != "":
		s = append(s, fmt.Sprintf("A picture of %s, with text reading %q.", joinAnd(what), first))
	case len(what) > 0:
		s = append(s, fmt.Sprintf("A picture of %s.", joinAnd(what)))
	case first != "":
		s = append(s, fmt.Sprintf("A picture of text reading %q.", first))
	default:
		s = append(s, "A picture in which no known object or text was recognised.")
	}
	if detail == engine.DetailCaption {
		return s[0]
	}
	for _, g := range gs {
		s = append(s, f.placeSentence(g))
	}
	if n := len(f.text); n > 0 {
		s = append(s, fmt.Sprintf("It contains %s of text.", countNoun(n, "line")))
	}
	if detail == engine.DetailDetailed {
		return strings.Join(s, " ")
	}
	if haveFaces {
		switch len(f.faces) {
		case 0:
			s = append(s, "No face is visible.")
		default:
			var where []string
			for _, fc := range f.faces {
				where = append(where, f.place(fc.Box))
			}
			verb := "are"
			if len(f.faces) == 1 {
				verb = "is"
			}
			s = append(s, fmt.Sprintf("%s %s visible (%s).", capitalise(countNoun(len(f.faces), "face")), verb, joinAnd(where)))
		}
	}
	if len(f.text) > 0 {
		var lines []string
		for _, l := range f.text {
			lines = append(lines, l.Text)
		}
		all := strings.Join(lines, " / ")
		if r := []rune(all); len(r) > maxTextChars {
			all = string(r[:maxTextChars]) + "…"
		}
		s = append(s, fmt.Sprintf("The text reads: %q.", all))
	}
	if len(f.colours) > 0 {
		s = append(s, fmt.Sprintf("The dominant colours are %s.", joinAnd(f.colours)))
	}
	return strings.Join(s, " ")
}

// place names the horizontal third of the image a box's centre is in.
func (f *findings) place(box [4]float32) string {
	cx := float64(box[0]+box[2]/2) / float64(f.w)
	switch {
	case cx < 1.0/3:
		return "on the left"
	case cx > 2.0/3:
		return "on the right"
	}
	return "in the centre"
}

// placeSentence says where a label's detections are, left to right.
func (f *findings) placeSentence(g group) string {
	dets := append([]engine.Detection(nil), g.dets...)
	sort.SliceStable(dets, func(i, j int) bool { return dets[i].Box[0] < dets[j].Box[0] })
	if len(dets) == 1 {
		return fmt.Sprintf("There is %s %s.", article(g.label), f.place(dets[0].Box))
	}
	count := map[string]int{}
	var order []string
	for _, d := range dets {
		p := f.place(d.Box)
		if count[p] == 0 {
			order = append(order, p)
		}
		count[p]++
	}
	var parts []string
	for _, p := range order {
		parts = append(parts, fmt.Sprintf("%s %s", numberWord(count[p]), p))
	}
	return fmt.Sprintf("There are %s: %s.", countNoun(len(dets), g.label), joinAnd(parts))
}

// countNoun is "a cup", "two cups", "12 people".
func countNoun(n int, noun string) string {
	if n == 1 {
		return article(noun)
	}
	return numberWord(n) + " " + plural(noun)
}

func numberWord(n int) string {
	words := []string{"no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}
	if n >= 0 && n < len(words) {
		return words[n]
	}
	return fmt.Sprint(n)
}

// article prefixes a or an.
func article(noun string) string {
	if noun != "" && strings.ContainsRune("aeiou", rune(noun[0])) {
		return "an " + noun
	}
	return "a " + noun
}

// plural makes an English plural of a COCO label (last word inflected).
func plural(noun string) string {
	irregular := map[string]string{"person": "people", "mouse": "mice", "sheep": "sheep", "skis": "skis",
		"scissors": "scissors", "knife": "knives", "tv": "TVs", "face": "faces", "line": "lines"}
	head, last := "", noun
	if i := strings.LastIndexByte(noun, ' '); i >= 0 {
		head, last = noun[:i+1], noun[i+1:]
	}
	if p, ok := irregular[last]; ok {
		return head + p
	}
	switch {
	case strings.HasSuffix(last, "s"), strings.HasSuffix(last, "sh"), strings.HasSuffix(last, "ch"), strings.HasSuffix(last, "x"):
		return head + last + "es"
	case strings.HasSuffix(last, "y") && len(last) > 1 && !strings.ContainsRune("aeiou", rune(last[len(last)-2])):
		return head + last[:len(last)-1] + "ies"
	}
	return head + last + "s"
}

func joinAnd(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

func capitalise(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// dominantColours names the n most common colours of img (each at least 8 %
// of a 64x64 thumbnail), most common first.
func dominantColours(img image.Image, n int) []string {
	src := toRGBA(img)
	const side = 64
	rgb := make([]float32, side*side*3)
	resampleWindow(src, 0, 0, float64(src.Rect.Dx()), float64(src.Rect.Dy()), side, side, rgb, 1, 0)
	count := map[string]int{}
	for i := 0; i < len(rgb); i += 3 {
		count[colourName(rgb[i], rgb[i+1], rgb[i+2])]++
	}
	names := make([]string, 0, len(count))
	for k := range count {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool {
		if count[names[i]] != count[names[j]] {
			return count[names[i]] > count[names[j]]
		}
		return names[i] < names[j]
	})
	var out []string
	for _, k := range names {
		if len(out) == n || count[k]*100 < 8*side*side {
			break
		}
		out = append(out, k)
	}
	return out
}

// colourName maps an RGB colour (0..255) to a basic colour word by hue,
// saturation and value.
func colourName(r, g, b float32) string {
	mx := max(r, g, b)
	mn := min(r, g, b)
	v := mx / 255
	sat := float32(0)
	if mx > 0 {
		sat = (mx - mn) / mx
	}
	switch {
	case v < 0.2:
		return "black"
	case sat < 0.2 && v > 0.85:
		return "white"
	case sat < 0.2:
		return "grey"
	}
	var hue float64
	d := float64(mx - mn)
	switch mx {
	case r:
		hue = math.Mod(float64(g-b)/d, 6)
	case g:
		hue = float64(b-r)/d + 2
	default:
		hue = float64(r-g)/d + 4
	}
	hue *= 60
	if hue < 0 {
		hue += 360
	}
	switch {
	case hue < 15 || hue >= 345:
		if v < 0.6 && sat > 0.4 {
			return "brown"
		}
		return "red"
	case hue < 40:
		if v < 0.7 {
			return "brown"
		}
		return "orange"
	case hue < 70:
		return "yellow"
	case hue < 165:
		return "green"
	case hue < 260:
		return "blue"
	case hue < 300:
		return "purple"
	}
	return "pink"
}

package vision

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"image"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// PP-OCR model signatures and defaults (PaddleOCR's predict_system
// defaults for PP-OCRv4).
const (
	ocrDetInput  = "x"               // f32[1,3,H,W], BGR, ImageNet mean/std; H, W multiples of 32
	ocrDetOutput = "sigmoid_0.tmp_0" // f32[1,1,H,W] text probability
	ocrRecInput  = "x"               // f32[N,3,48,W], BGR, (v/255-0.5)/0.5
	ocrRecOutput = "softmax_11.tmp_0"

	ocrRecHeight   = 48
	ocrRecMinWidth = 320 // PaddleOCR pads every batch to at least 320 px (ratio 320/48)
	ocrMaxRecWidth = 3200

	// DefaultOCRLimitSide is the longest side of the detection input.
	DefaultOCRLimitSide = 960
	// DefaultOCRMinSide is the shortest side small images are enlarged to
	// before detection (0 turns enlarging off); see DESIGN.md.
	DefaultOCRMinSide = 0
	// DefaultOCRDropScore drops lines read with a lower mean confidence.
	DefaultOCRDropScore = 0.5
)

// ocr is the PP-OCR pipeline: DB text detection on the whole image (resized
// so its longer side is at most det_limit_side, both sides multiples of
// 32), boxes from the binarised probability map (ocr_db.go), each box cut
// out along its rotation, resized to height 48 and read by the CRNN-style
// recogniser with greedy CTC decoding over the dictionary.
type ocr struct {
	id         string
	det, rec   *dynModel
	chars      []string // class id -> text; 0 is the CTC blank
	limitSide  int
	minSide    int
	db         dbParams
	dropScore  float32
	recBatch   int
	maxRecWide int
	done       chan struct{}
	once       sync.Once
	err        error
}

// LoadOCR loads the PP-OCR text reader. spec.Files: "detector" the DB
// detection model (input x f32[1,3,H,W], output sigmoid_0.tmp_0
// f32[1,1,H,W]), "recognizer" the recognition model (input x
// f32[N,3,48,W], output softmax_11.tmp_0 f32[N,W/8,C]) and "dictionary" the
// character list, one per line, in class order from 1 (class 0 is the CTC
// blank; with use_space "true", the default, the last class is a space).
// Options: det_limit_side (960), det_min_side (0: off), det_thresh (0.3),
// box_thresh (0.6), unclip_ratio (1.5), max_candidates (1000), drop_score
// (0.5), rec_batch (1: see recognize), max_rec_width (3200), concurrency (1)
// and thread_spinning (on; see spinning).
func LoadOCR(rt *onnx.Runtime, spec engine.Spec) (engine.TextReader, error) {
	if err := checkTask(spec, engine.TaskTextRecognition); err != nil {
		return nil, err
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, err
	}
	o, nRuns, err := newOCRConfig(spec)
	if err != nil {
		return nil, fmt.Errorf("vision: %s: %w", spec.ID, err)
	}
	for _, role := range []string{"detector", "recognizer"} {
		if spec.Files[role] == "" {
			return nil, fmt.Errorf("vision: %s: spec names no %q file", spec.ID, role)
		}
	}
	spin, err := spinning(spec.Options, true)
	if err != nil {
		return nil, fmt.Errorf("vision: %s: %w", spec.ID, err)
	}
	o.det, err = openDynModel(rt, spec.ID, filepath.Join(spec.Dir, spec.Files["detector"]),
		[]ioSpec{f32(ocrDetInput, -1, 3, -1, -1)}, []ioSpec{f32(ocrDetOutput, -1, 1, -1, -1)}, nRuns, spin)
	if err != nil {
		return nil, fmt.Errorf("vision: %s: detector: %w", spec.ID, err)
	}
	o.rec, err = openDynModel(rt, spec.ID, filepath.Join(spec.Dir, spec.Files["recognizer"]),
		[]ioSpec{f32(ocrRecInput, -1, 3, ocrRecHeight, -1)},
		[]ioSpec{f32(ocrRecOutput, -1, -1, int64(len(o.chars)))}, nRuns, spin)
	if err != nil {
		o.det.close()
		return nil, fmt.Errorf("vision: %s: recognizer: %w", spec.ID, err)
	}
	return o, nil
}

func newOCRConfig(spec engine.Spec) (*ocr, int, error) {
	o := &ocr{id: spec.ID, done: make(chan struct{})}
	var err error
	opt := spec.Options
	if o.limitSide, err = onnx.IntOption(opt, "det_limit_side", DefaultOCRLimitSide, 32, 4096); err != nil {
		return nil, 0, err
	}
	if o.minSide, err = onnx.IntOption(opt, "det_min_side", DefaultOCRMinSide, 0, 4096); err != nil {
		return nil, 0, err
	}
	if o.db.thresh, err = floatOption(opt, "det_thresh", 0.3, 0.01, 0.99); err != nil {
		return nil, 0, err
	}
	if o.db.boxThresh, err = floatOption(opt, "box_thresh", 0.6, 0, 1); err != nil {
		return nil, 0, err
	}
	if o.db.unclip, err = floatOption(opt, "unclip_ratio", 1.5, 0, 10); err != nil {
		return nil, 0, err
	}
	if o.db.maxCandidates, err = onnx.IntOption(opt, "max_candidates", 1000, 1, 100000); err != nil {
		return nil, 0, err
	}
	o.db.minSize = 3
	drop, err := floatOption(opt, "drop_score", DefaultOCRDropScore, 0, 1)
	if err != nil {
		return nil, 0, err
	}
	o.dropScore = float32(drop)
	if o.recBatch, err = onnx.IntOption(opt, "rec_batch", 1, 1, 64); err != nil {
		return nil, 0, err
	}
	if o.maxRecWide, err = onnx.IntOption(opt, "max_rec_width", ocrMaxRecWidth, ocrRecMinWidth, 16384); err != nil {
		return nil, 0, err
	}
	nRuns, err := onnx.IntOption(opt, "concurrency", 1, 1, maxConcurrency)
	if err != nil {
		return nil, 0, err
	}
	if spec.Files["dictionary"] == "" {
		return nil, 0, errors.New("spec names no \"dictionary\" file")
	}
	keys, err := readDictionary(filepath.Join(spec.Dir, spec.Files["dictionary"]))
	if err != nil {
		return nil, 0, err
	}
	o.chars = append([]string{""}, keys...)
	if opt["use_space"] != "false" {
		o.chars = append(o.chars, " ")
	}
	return o, nRuns, nil
}

// readDictionary reads one character (or string) per line, keeping every
// line, blank ones included, since line numbers are class ids.
func readDictionary(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("dictionary: %w", err)
	}
	var keys []string
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		keys = append(keys, strings.TrimRight(sc.Text(), "\r"))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("dictionary: %w", err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("dictionary: %s is empty", path)
	}
	return keys, nil
}

// ID returns the canonical model id.
func (o *ocr) ID() string { return o.id }

// detSize is the detection input size for a w x h image: scaled so the
// longer side is at most limitSide (and, with minSide, the shorter side at
// least minSide without breaking the limit), each side rounded to a
// multiple of 32 (at least 32).
func (o *ocr) detSize(w, h int) (int, int) {
	r := 1.0
	if m := max(w, h); m > o.limitSide {
		r = float64(o.limitSide) / float64(m)
	}
	if o.minSide > 0 && float64(min(w, h))*r < float64(o.minSide) {
		r = math.Min(float64(o.minSide)/float64(min(w, h)), float64(o.limitSide)/float64(max(w, h)))
		r = math.Max(r, 1e-9)
	}
	round := func(v int) int { return max(32, int(math.Round(float64(v)*r/32))*32) }
	return round(w), round(h)
}

// Read finds and reads the text lines of img, in reading order.
func (o *ocr) Read(ctx context.Context, img image.Image) ([]engine.TextLine, error) {
	if img == nil || img.Bounds().Empty() {
		return nil, &engine.InputError{Param: "image", Msg: "image has no pixels"}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case <-o.done:
		return nil, errClosed
	default:
	}
	src := toRGBA(img)
	boxes, err := o.detect(ctx, src)
	if err != nil {
		return nil, err
	}
	if len(boxes) == 0 {
		return []engine.TextLine{}, nil
	}
	return o.recognize(ctx, src, boxes)
}

// ImageNet mean and standard deviation in the order PaddleOCR applies them
// to its BGR array.
var (
	ocrMean = [3]float32{0.485, 0.456, 0.406}
	ocrStd  = [3]float32{0.229, 0.224, 0.225}
)

// detect runs the DB detector and returns the text boxes in image pixels,
// in reading order.
func (o *ocr) detect(ctx context.Context, src *image.RGBA) ([]quad, error) {
	w, h := src.Rect.Dx(), src.Rect.Dy()
	rw, rh := o.detSize(w, h)
	rgb := make([]float32, rw*rh*3)
	resampleWindow(src, 0, 0, float64(w), float64(h), rw, rh, rgb, 1, 0)
	in := make([]float32, len(rgb))
	plane := rw * rh
	for i := range plane {
		for c := range 3 { // c: B, G, R
			in[c*plane+i] = (rgb[3*i+2-c]/255 - ocrMean[c]) / ocrStd[c]
		}
	}
	t, err := ort.NewTensor(ort.NewShape(1, 3, int64(rh), int64(rw)), in)
	if err != nil {
		return nil, fmt.Errorf("vision: %s: tensor: %w", o.id, err)
	}
	defer t.Destroy()
	outs, err := o.det.run(ctx, o.done, []ort.Value{t})
	if err != nil {
		return nil, err
	}
	defer destroyAll(outs)
	prob, shape, err := floats(outs[0])
	if err != nil || len(shape) != 4 || shape[2] != int64(rh) || shape[3] != int64(rw) {
		return nil, fmt.Errorf("vision: %s: detector output %v: %v", o.id, shape, err)
	}
	found := dbBoxes(prob, rw, rh, o.db)
	sx, sy := float64(w)/float64(rw), float64(h)/float64(rh)
	kept := found[:0]
	for _, b := range found {
		// Map pixel i covers [i, i+1) of the resized image: its centre
		// is at i+0.5, (i+0.5)*s in the image's continuous coordinates.
		for i := range b.q {
			b.q[i][0] = math.Min(math.Max((b.q[i][0]+0.5)*sx, 0), float64(w))
			b.q[i][1] = math.Min(math.Max((b.q[i][1]+0.5)*sy, 0), float64(h))
		}
		if bw, bh := b.q.sides(); bw <= 3 || bh <= 3 {
			continue
		}
		kept = append(kept, b)
	}
	sortReading(kept)
	out := make([]quad, len(kept))
	for i, b := range kept {
		out[i] = b.q
	}
	return out, nil
}

// recItem is one box to read: its crop geometry and target width.
type recItem struct {
	idx   int
	q     quad // oriented so that p0->p1 runs along the text
	width int  // resized crop width at height 48
}

// recognize cuts every box out of src and reads it, rec_batch crops per
// run (sorted by aspect ratio, as PaddleOCR batches them), and returns the
// lines scoring at least drop_score in box order. The default batch is one
// crop: PP-OCRv4's recogniser mixes the whole sequence (SVTR), so the grey
// padding a batch adds to its narrower crops changes what they read (on
// page.png, batches of 6 lost the spaces of two lines).
func (o *ocr) recognize(ctx context.Context, src *image.RGBA, boxes []quad) ([]engine.TextLine, error) {
	items := make([]recItem, len(boxes))
	for i, q := range boxes {
		cw, ch := q.sides()
		if ch/math.Max(cw, 1e-9) >= 1.5 {
			// Vertical text: read it rotated a quarter turn (np.rot90).
			q = quad{q[1], q[2], q[3], q[0]}
			cw, ch = ch, cw
		}
		width := int(math.Ceil(ocrRecHeight * cw / math.Max(ch, 1e-9)))
		items[i] = recItem{idx: i, q: q, width: min(max(width, 1), o.maxRecWide)}
	}
	sort.SliceStable(items, func(a, b int) bool { return items[a].width < items[b].width })
	lines := make([]*engine.TextLine, len(boxes))
	for start := 0; start < len(items); start += o.recBatch {
		batch := items[start:min(start+o.recBatch, len(items))]
		if err := o.recBatchRun(ctx, src, batch, boxes, lines); err != nil {
			return nil, err
		}
	}
	out := make([]engine.TextLine, 0, len(lines))
	for _, l := range lines {
		if l != nil {
			out = append(out, *l)
		}
	}
	return out, nil
}

// recBatchRun reads one batch; every crop is padded with zeros (mid-grey)
// to the batch's width, at least 320.
func (o *ocr) recBatchRun(ctx context.Context, src *image.RGBA, batch []recItem, boxes []quad, lines []*engine.TextLine) error {
	bw := ocrRecMinWidth
	for _, it := range batch {
		bw = max(bw, it.width)
	}
	per := 3 * ocrRecHeight * bw
	in := make([]float32, len(batch)*per)
	for i, it := range batch {
		quadCrop(src, it.q, it.width, ocrRecHeight, bw, in[i*per:(i+1)*per])
	}
	t, err := ort.NewTensor(ort.NewShape(int64(len(batch)), 3, ocrRecHeight, int64(bw)), in)
	if err != nil {
		return fmt.Errorf("vision: %s: tensor: %w", o.id, err)
	}
	defer t.Destroy()
	outs, err := o.rec.run(ctx, o.done, []ort.Value{t})
	if err != nil {
		return err
	}
	defer destroyAll(outs)
	probs, shape, err := floats(outs[0])
	if err != nil || len(shape) != 3 || shape[0] != int64(len(batch)) || shape[2] != int64(len(o.chars)) {
		return fmt.Errorf("vision: %s: recognizer output %v: %v", o.id, shape, err)
	}
	steps, nc := int(shape[1]), int(shape[2])
	for i, it := range batch {
		text, conf := ctcGreedy(probs[i*steps*nc:(i+1)*steps*nc], steps, nc, o.chars)
		text = strings.TrimSpace(text)
		if text == "" || conf < o.dropScore {
			continue
		}
		x1, y1, x2, y2 := boxes[it.idx].bounds()
		lines[it.idx] = &engine.TextLine{
			Text:       text,
			Confidence: conf,
			Box:        [4]float32{float32(x1), float32(y1), float32(x2 - x1), float32(y2 - y1)},
		}
	}
	return nil
}

// ctcGreedy decodes steps x nc class probabilities: the best class per
// step, repeats merged, blanks (class 0) dropped. The confidence is the
// mean probability of the kept steps.
func ctcGreedy(p []float32, steps, nc int, chars []string) (string, float32) {
	var sb strings.Builder
	var sum float32
	var n int
	prev := 0
	for t := range steps {
		row := p[t*nc : (t+1)*nc]
		best := 0
		for c, v := range row {
			if v > row[best] {
				best = c
			}
		}
		if best != 0 && best != prev {
			sb.WriteString(chars[best])
			sum += row[best]
			n++
		}
		prev = best
	}
	if n == 0 {
		return "", 0
	}
	return sb.String(), sum / float32(n)
}

// quadCrop samples the rotated rectangle q of src (p0->p1 along the crop's
// x axis, p0->p3 along its y axis) to a cw x ch picture and writes it into
// dst, planar BGR of width stride (columns cw..stride stay 0, which is
// mid-grey after normalisation), as (v/255-0.5)/0.5. Each output pixel
// averages k x k bilinear samples when the crop shrinks, so large text is
// not aliased; pixels outside the image are black.
func quadCrop(src *image.RGBA, q quad, cw, ch, stride int, dst []float32) {
	w, h := src.Rect.Dx(), src.Rect.Dy()
	qw, qh := q.sides()
	ux, uy := unit(q[1][0]-q[0][0], q[1][1]-q[0][1], 1, 0)
	vx, vy := unit(q[3][0]-q[0][0], q[3][1]-q[0][1], -uy, ux)
	stepU, stepV := qw/float64(cw), qh/float64(ch)
	ku, kv := max(1, int(math.Ceil(stepU))), max(1, int(math.Ceil(stepV)))
	inv := 1 / float32(ku*kv)
	at := func(x, y int) (float32, float32, float32) {
		if x < 0 || y < 0 || x >= w || y >= h {
			return 0, 0, 0
		}
		p := src.Pix[y*src.Stride+4*x:]
		return float32(p[0]), float32(p[1]), float32(p[2])
	}
	plane := ch * stride
	for j := range ch {
		for i := range cw {
			var r, g, b float32
			for sj := range kv {
				for si := range ku {
					u := (float64(i) + (float64(si)+0.5)/float64(ku)) * stepU
					v := (float64(j) + (float64(sj)+0.5)/float64(kv)) * stepV
					x := q[0][0] + u*ux + v*vx - 0.5
					y := q[0][1] + u*uy + v*vy - 0.5
					x0, y0 := int(math.Floor(x)), int(math.Floor(y))
					fx, fy := float32(x-float64(x0)), float32(y-float64(y0))
					r00, g00, b00 := at(x0, y0)
					r10, g10, b10 := at(x0+1, y0)
					r01, g01, b01 := at(x0, y0+1)
					r11, g11, b11 := at(x0+1, y0+1)
					r += bilerp(r00, r10, r01, r11, fx, fy)
					g += bilerp(g00, g10, g01, g11, fx, fy)
					b += bilerp(b00, b10, b01, b11, fx, fy)
				}
			}
			o := j*stride + i
			dst[o] = b*inv/127.5 - 1
			dst[plane+o] = g*inv/127.5 - 1
			dst[2*plane+o] = r*inv/127.5 - 1
		}
	}
}

// Close waits for runs in flight, then releases both sessions.
func (o *ocr) Close() error {
	o.once.Do(func() {
		close(o.done)
		o.err = errors.Join(o.det.close(), o.rec.close())
	})
	return o.err
}

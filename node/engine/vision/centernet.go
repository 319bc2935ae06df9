package vision

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// CenterNet model signature (the graph scripts/tfjs2onnx.py converts) and
// defaults.
const (
	centerNetInput   = "tower_0/images"    // f32[1,S,S,3], RGB 0..255
	centerNetHeat    = "tower_0/keypoints" // f32[1,S/4,S/4,classes], sigmoid scores
	centerNetSides   = "tower_0/wh"        // f32[1,S/4,S/4,4]: left, top, right, bottom in input pixels
	centerNetStride  = 4
	centerNetSize    = 512
	centerNetMaxSize = 2048

	// DefaultDetectionThreshold is the CenterNet engine's confidence
	// threshold when neither the request nor the manifest sets one.
	DefaultDetectionThreshold = 0.3
	// DefaultDetectionNMS is the IoU above which a lower-scoring box of the
	// same class is suppressed.
	DefaultDetectionNMS = 0.4
	// maxCandidates bounds the peaks that enter NMS (the best ones), which is
	// quadratic in their number; it is well above MaxResultsLimit.
	maxCandidates = 4 * engine.MaxResultsLimit
)

// detector is the CenterNet object-detection pipeline: the whole image is
// resized (not letterboxed) to S x S, the network gives per-class centre
// heat maps at stride 4 and four box sides per cell; peaks of the heat maps
// (3x3 local maxima, as the original graph's max-pool test) above the
// threshold become boxes, and class-wise NMS removes duplicates.
type detector struct {
	id        string
	labels    []string
	size      int
	grid      int
	threshold float32
	nms       float32
	m         *model
	done      chan struct{}
	once      sync.Once
	err       error
}

// LoadDetector loads a CenterNet object detector. spec.Files["model"] is the
// converted ONNX graph (input tower_0/images f32[1,S,S,3] RGB 0..255; outputs
// tower_0/keypoints f32[1,S/4,S/4,C] and tower_0/wh f32[1,S/4,S/4,4]) and
// spec.Files["labels"] a text file of the C class names, one per line, in
// class order. Options: input_size S (default 512), confidence_threshold
// (default 0.3), nms_iou (default 0.4) and concurrency, the number of
// simultaneous runs (default 1), and thread_spinning (on or off, default
// on; see spinning). Option "format" selects the network:
// "centernet" (the default) or "yolov8" / "yolo11" (see LoadYOLO).
func LoadDetector(rt *onnx.Runtime, spec engine.Spec) (engine.Detector, error) {
	if err := checkTask(spec, engine.TaskObjectDetection); err != nil {
		return nil, err
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, err
	}
	switch f := spec.Options["format"]; f {
	case "", "centernet":
	case "yolov8", "yolo11":
		return LoadYOLO(rt, spec)
	default:
		return nil, fmt.Errorf("vision: %s: option format=%q: want centernet, yolov8 or yolo11", spec.ID, f)
	}
	d, nSlots, err := newDetectorConfig(spec)
	if err != nil {
		return nil, fmt.Errorf("vision: %s: %w", spec.ID, err)
	}
	name := spec.Files["model"]
	if name == "" {
		return nil, fmt.Errorf("vision: %s: spec names no \"model\" file", spec.ID)
	}
	spin, err := spinning(spec.Options, true)
	if err != nil {
		return nil, fmt.Errorf("vision: %s: %w", spec.ID, err)
	}
	s, g, c := int64(d.size), int64(d.grid), int64(len(d.labels))
	d.m, err = openModel(rt, spec.ID, filepath.Join(spec.Dir, name),
		[]tensorSpec{{centerNetInput, []int64{1, s, s, 3}}},
		[]tensorSpec{{centerNetHeat, []int64{1, g, g, c}}, {centerNetSides, []int64{1, g, g, 4}}},
		1, nSlots, spin)
	if err != nil {
		return nil, fmt.Errorf("vision: %s: %w", spec.ID, err)
	}
	return d, nil
}

func newDetectorConfig(spec engine.Spec) (*detector, int, error) {
	size, err := onnx.IntOption(spec.Options, "input_size", centerNetSize, 32, centerNetMaxSize)
	if err != nil {
		return nil, 0, err
	}
	if size%(8*centerNetStride) != 0 {
		return nil, 0, fmt.Errorf("option input_size=%d: want a multiple of %d", size, 8*centerNetStride)
	}
	thr, nms, nSlots, err := detectOptions(spec.Options, DefaultDetectionThreshold, DefaultDetectionNMS)
	if err != nil {
		return nil, 0, err
	}
	labels, err := specLabels(spec)
	if err != nil {
		return nil, 0, err
	}
	return &detector{
		id:        spec.ID,
		labels:    labels,
		size:      size,
		grid:      size / centerNetStride,
		threshold: thr,
		nms:       nms,
		done:      make(chan struct{}),
	}, nSlots, nil
}

// specLabels reads the class names of spec.Files["labels"], which must be
// set.
func specLabels(spec engine.Spec) ([]string, error) {
	if spec.Files["labels"] == "" {
		return nil, errors.New("spec names no \"labels\" file")
	}
	return readLabels(filepath.Join(spec.Dir, spec.Files["labels"]))
}

// readLabels reads one class name per non-empty line.
func readLabels(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("labels: %w", err)
	}
	defer f.Close()
	var labels []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			labels = append(labels, l)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("labels: %w", err)
	}
	if len(labels) == 0 {
		return nil, fmt.Errorf("labels: %s lists no class", path)
	}
	return labels, nil
}

// ID returns the canonical model id.
func (d *detector) ID() string { return d.id }

// candidate is one heat-map peak: class, score and box corners (x1, y1, x2,
// y2) in input pixels.
type candidate struct {
	class int
	score float32
	box   [4]float32
}

// TakesStreamedImages reports that Detect takes a picture still being
// decoded (see resampleImage).
func (d *detector) TakesStreamedImages() bool { return true }

// Detect finds the objects in req.Image. Boxes are in original-image pixels,
// clipped to the image, best first. Cancelling ctx abandons the call while it
// waits for a run slot and stops a run in progress.
func (d *detector) Detect(ctx context.Context, req engine.DetectRequest) ([]engine.Detection, error) {
	thr, maxResults, err := limits(req.Image, req.ConfidenceThreshold, req.MaxResults, d.threshold)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case <-d.done:
		return nil, errClosed
	default:
	}
	s, img, err := d.m.acquireFor(ctx, d.done, req.Image)
	if err != nil {
		return nil, err
	}
	b := img.Bounds()
	src, err := resampleImage(img, 0, 0, float64(b.Dx()), float64(b.Dy()), d.size, d.size, s.in[0], 1, 0)
	if err == nil {
		err = d.m.run(ctx, s, 1)
	}
	var cands []candidate
	if err == nil {
		cands = d.peaks(s.out[0], s.out[1], thr)
	}
	d.m.release(s)
	if err != nil {
		return nil, err
	}
	keep := nmsClasswise(cands, d.nms, maxResults)
	w, h := float32(src.Rect.Dx()), float32(src.Rect.Dy())
	sx, sy := w/float32(d.size), h/float32(d.size)
	out := make([]engine.Detection, 0, len(keep))
	for _, c := range keep {
		box, ok := clipBox(c.box[0]*sx, c.box[1]*sy, c.box[2]*sx, c.box[3]*sy, w, h)
		if !ok {
			continue
		}
		out = append(out, engine.Detection{Label: d.labels[c.class], Confidence: c.score, Box: box})
	}
	return out, nil
}

// peaks returns the heat-map entries that score at least thr and are the
// maximum of their 3x3 neighbourhood in their class (CenterNet's max-pool
// peak test, ties kept), with their boxes, best first and at most
// maxCandidates of them.
func (d *detector) peaks(heat, sides []float32, thr float32) []candidate {
	g, nc := d.grid, len(d.labels)
	// Bands of grid rows (on every core when parallelRows splits the
	// work; one band at the usual sizes); each band's peaks in scan order,
	// joined in band order, so the result is the one of a single scan.
	bands := make([][]candidate, min(runtime.GOMAXPROCS(0), g))
	parallelRows(g, g*g*nc/4, func(y0, y1 int) {
		var out []candidate
		// The entries not below thr come from a vector scan in C (most
		// of the map is far below it), a buffer at a time, in order.
		idx := make([]int32, 1024)
		for next, end := y0*g*nc, y1*g*nc; next < end; {
			var n int
			n, next = scanAbove(heat, next, end, thr, idx)
			for _, i32 := range idx[:n] {
				i := int(i32)
				v := heat[i]
				c := i % nc
				cell := i / nc
				x, y := cell%g, cell/g
				if !isPeak(heat, g, nc, x, y, c, v) {
					continue
				}
				l, t, r, b := sides[4*cell], sides[4*cell+1], sides[4*cell+2], sides[4*cell+3]
				cx, cy := float32(x*centerNetStride), float32(y*centerNetStride)
				out = append(out, candidate{class: c, score: v, box: [4]float32{cx - l, cy - t, cx + r, cy + b}})
			}
		}
		// parallelRows starts band i at floor(g*i/n): i is the ceiling.
		bands[(y0*len(bands)+g-1)/g] = out
	})
	var out []candidate
	for _, b := range bands {
		out = append(out, b...)
	}
	byScoreDesc(out, func(c candidate) float32 { return c.score })
	if len(out) > maxCandidates {
		out = out[:maxCandidates]
	}
	return out
}

// byScoreDesc sorts xs best first by score, equal scores in their original
// order (what a stable sort gives), by sorting indices under a total order:
// much faster than a stable sort of the structs when thousands of
// candidates pass a low threshold.
func byScoreDesc[T any](xs []T, score func(T) float32) {
	if len(xs) < 2 {
		return
	}
	idx := make([]int32, len(xs))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(a, b int32) int {
		sa, sb := score(xs[a]), score(xs[b])
		switch {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		}
		return int(a - b)
	})
	sorted := make([]T, len(xs))
	for i, j := range idx {
		sorted[i] = xs[j]
	}
	copy(xs, sorted)
}

// nmsClasswise keeps, best first, each candidate whose IoU with every kept
// candidate of the same class is at most iou, stopping at limit.
// cands must be sorted best first.
func nmsClasswise(cands []candidate, iou float32, limit int) []candidate {
	var keep []candidate
	for _, c := range cands {
		if len(keep) == limit {
			break
		}
		ok := true
		for _, k := range keep {
			if k.class == c.class && boxIoU(k.box, c.box) > iou {
				ok = false
				break
			}
		}
		if ok {
			keep = append(keep, c)
		}
	}
	return keep
}

// boxIoU is the intersection over union of two x1, y1, x2, y2 boxes.
func boxIoU(a, b [4]float32) float32 {
	iw := min(a[2], b[2]) - max(a[0], b[0])
	ih := min(a[3], b[3]) - max(a[1], b[1])
	if iw <= 0 || ih <= 0 {
		return 0
	}
	inter := iw * ih
	union := (a[2]-a[0])*(a[3]-a[1]) + (b[2]-b[0])*(b[3]-b[1]) - inter
	if union <= 0 {
		return 0
	}
	return inter / union
}

// clipBox clips x1, y1, x2, y2 to a w x h image and returns it as x, y,
// width, height; ok is false when nothing of it is left.
func clipBox(x1, y1, x2, y2, w, h float32) ([4]float32, bool) {
	x1, x2 = min(max(x1, 0), w), min(max(x2, 0), w)
	y1, y2 = min(max(y1, 0), h), min(max(y2, 0), h)
	if x2 <= x1 || y2 <= y1 {
		return [4]float32{}, false
	}
	return [4]float32{x1, y1, x2 - x1, y2 - y1}, true
}

// Close waits for runs in flight, then releases the session. Calls that have
// not started a run fail once Close begins.
func (d *detector) Close() error {
	d.once.Do(func() {
		close(d.done)
		d.err = d.m.close()
	})
	return d.err
}

// isPeak reports whether no 3x3 neighbour of cell (x, y) in class c of the
// g x g x nc heat map scores above v (CenterNet's max-pool test; ties
// kept).
func isPeak(heat []float32, g, nc, x, y, c int, v float32) bool {
	for dy := -1; dy <= 1; dy++ {
		for dx := -1; dx <= 1; dx++ {
			xx, yy := x+dx, y+dy
			if (dx == 0 && dy == 0) || xx < 0 || yy < 0 || xx >= g || yy >= g {
				continue
			}
			if heat[(yy*g+xx)*nc+c] > v {
				return false
			}
		}
	}
	return true
}

package vision

import (
	"context"
	"fmt"
	"image"
	"math"
	"path/filepath"
	"strings"
	"sync"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// Ultralytics YOLOv8 / YOLO11 detection export (`yolo export format=onnx`).
const (
	yoloInput  = "images"  // f32[1,3,S,S], RGB 0..1, letterboxed
	yoloOutput = "output0" // f32[1,4+C,A]: cx, cy, w, h (input pixels), then C class scores
	yoloSize   = 640
	yoloPad    = 114 // Ultralytics' letterbox grey

	// DefaultYOLOThreshold and DefaultYOLONMS are the YOLO engine's
	// defaults (Ultralytics' ONNX Runtime example uses 0.25 / 0.45).
	DefaultYOLOThreshold = 0.25
	DefaultYOLONMS       = 0.45
)

// yolo is the Ultralytics YOLOv8/YOLO11 pipeline: the image is letterboxed
// (aspect kept, centred on grey 114) to S x S, RGB/255 NCHW; the network
// gives, for each of the A = (S/8)² + (S/16)² + (S/32)² anchors, a box
// (centre and size in input pixels) and C sigmoid class scores with no
// objectness; each anchor's best class above the threshold is a candidate,
// class-wise NMS removes duplicates and the boxes are mapped back through
// the letterbox.
type yolo struct {
	id        string
	labels    []string
	size      int
	anchors   int
	threshold float32
	nms       float32
	m         *model
	done      chan struct{}
	once      sync.Once
	err       error
}

// yoloAnchors is the number of anchors of a size x size input (strides 8,
// 16 and 32).
func yoloAnchors(size int) int {
	n := 0
	for _, s := range []int{8, 16, 32} {
		n += (size / s) * (size / s)
	}
	return n
}

// LoadYOLO loads an Ultralytics YOLOv8 or YOLO11 detection export.
// spec.Files["model"] is the ONNX file (input images f32[1,3,S,S], output
// output0 f32[1,4+C,A]) and spec.Files["labels"] the C class names, one per
// line. Options: input_size S (default 640, a multiple of 32),
// confidence_threshold (0.25), nms_iou (0.45), concurrency (1),
// thread_spinning (on; see spinning). LoadDetector
// calls it for a spec whose option "format" is "yolov8" or "yolo11".
func LoadYOLO(rt *onnx.Runtime, spec engine.Spec) (engine.Detector, error) {
	if err := checkTask(spec, engine.TaskObjectDetection); err != nil {
		return nil, err
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, err
	}
	y, nSlots, err := newYOLOConfig(spec)
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
	s := int64(y.size)
	y.m, err = openModel(rt, spec.ID, filepath.Join(spec.Dir, name),
		[]tensorSpec{{yoloInput, []int64{1, 3, s, s}}},
		[]tensorSpec{{yoloOutput, []int64{1, int64(4 + len(y.labels)), int64(y.anchors)}}},
		1, nSlots, spin)
	if err != nil {
		return nil, fmt.Errorf("vision: %s: %w", spec.ID, err)
	}
	return y, nil
}

func newYOLOConfig(spec engine.Spec) (*yolo, int, error) {
	size, err := onnx.IntOption(spec.Options, "input_size", yoloSize, 32, 2048)
	if err != nil {
		return nil, 0, err
	}
	if size%32 != 0 {
		return nil, 0, fmt.Errorf("option input_size=%d: want a multiple of 32", size)
	}
	thr, nms, nSlots, err := detectOptions(spec.Options, DefaultYOLOThreshold, DefaultYOLONMS)
	if err != nil {
		return nil, 0, err
	}
	labels := cocoNames()
	if spec.Files["labels"] != "" {
		if labels, err = specLabels(spec); err != nil {
			return nil, 0, err
		}
	}
	return &yolo{
		id: spec.ID, labels: labels, size: size, anchors: yoloAnchors(size),
		threshold: thr, nms: nms, done: make(chan struct{}),
	}, nSlots, nil
}

// ID returns the canonical model id.
func (y *yolo) ID() string { return y.id }

// cocoNames are the 80 COCO class names in the order of Ultralytics'
// detection exports (their metadata's "names"), the labels of a YOLO model
// whose spec names no labels file ("_" stands for a space).
func cocoNames() []string {
	names := strings.Fields(`person bicycle car motorcycle airplane bus train truck boat traffic_light fire_hydrant
		stop_sign parking_meter bench bird cat dog horse sheep cow elephant bear zebra giraffe backpack umbrella
		handbag tie suitcase frisbee skis snowboard sports_ball kite baseball_bat baseball_glove skateboard
		surfboard tennis_racket bottle wine_glass cup fork knife spoon bowl banana apple sandwich orange
		broccoli carrot hot_dog pizza donut cake chair couch potted_plant bed dining_table toilet tv laptop
		mouse remote keyboard cell_phone microwave oven toaster sink refrigerator book clock vase scissors
		teddy_bear hair_drier toothbrush`)
	for i, n := range names {
		names[i] = strings.ReplaceAll(n, "_", " ")
	}
	return names
}

// letterbox is where an image lands in a square model input: scale r and
// the top-left offset of the resized image.
type letterbox struct {
	r          float64
	left, top  int
	newW, newH int
}

// ultralyticsLetterbox reproduces Ultralytics' LetterBox(auto=False,
// center=True): r = min(S/h, S/w), new size rounded, padding split with
// round(d/2 ∓ 0.1).
func ultralyticsLetterbox(w, h, size int) letterbox {
	r := math.Min(float64(size)/float64(h), float64(size)/float64(w))
	nw, nh := int(math.Round(float64(w)*r)), int(math.Round(float64(h)*r))
	dw, dh := float64(size-nw)/2, float64(size-nh)/2
	return letterbox{r: r, left: int(math.Round(dw - 0.1)), top: int(math.Round(dh - 0.1)), newW: nw, newH: nh}
}

// fillLetterbox writes src letterboxed into dst, planar RGB (NCHW) of a
// size x size canvas, as v*mul with v the 0..255 value; pad is the canvas
// colour. The resized image is written straight into the planes and only
// the canvas around it is painted.
func fillLetterbox(src *image.RGBA, lb letterbox, size int, pad, mul float32, dst []float32) {
	plane := size * size
	// The part of the canvas the image covers: rows [y0, y1), columns
	// [x0, x1).
	x0, x1 := min(max(lb.left, 0), size), min(max(lb.left+lb.newW, 0), size)
	y0, y1 := min(max(lb.top, 0), size), min(max(lb.top+lb.newH, 0), size)
	padV := pad * mul
	for c := range 3 {
		p := dst[c*plane : (c+1)*plane]
		for y := range size {
			line := p[y*size : (y+1)*size]
			if y < y0 || y >= y1 || x1 <= x0 {
				for i := range line {
					line[i] = padV
				}
				continue
			}
			for i := range line[:x0] {
				line[i] = padV
			}
			for i := range line[x1:] {
				line[x1+i] = padV
			}
		}
	}
	resampleRows(src, 0, 0, float64(src.Rect.Dx()), float64(src.Rect.Dy()), lb.newW, lb.newH, mul, 0, bestLevel, nil,
		func(y int, rgb []float32) {
			ty := y + lb.top
			if ty < 0 || ty >= size {
				return
			}
			r, g, b := dst[ty*size:(ty+1)*size], dst[plane+ty*size:plane+(ty+1)*size], dst[2*plane+ty*size:2*plane+(ty+1)*size]
			for x := range lb.newW {
				tx := x + lb.left
				if tx < 0 || tx >= size {
					continue
				}
				r[tx], g[tx], b[tx] = rgb[3*x], rgb[3*x+1], rgb[3*x+2]
			}
		})
}

// Detect finds the objects in req.Image, best first, boxes in image pixels.
func (y *yolo) Detect(ctx context.Context, req engine.DetectRequest) ([]engine.Detection, error) {
	thr, maxResults, err := limits(req.Image, req.ConfidenceThreshold, req.MaxResults, y.threshold)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case <-y.done:
		return nil, errClosed
	default:
	}
	src := toRGBA(req.Image)
	w, h := src.Rect.Dx(), src.Rect.Dy()
	lb := ultralyticsLetterbox(w, h, y.size)
	s, err := y.m.acquire(ctx, y.done)
	if err != nil {
		return nil, err
	}
	fillLetterbox(src, lb, y.size, yoloPad, 1.0/255, s.in[0])
	err = y.m.run(ctx, s, 1)
	var cands []candidate
	if err == nil {
		cands = decodeYOLO(s.out[0], len(y.labels), y.anchors, thr)
	}
	y.m.release(s)
	if err != nil {
		return nil, err
	}
	keep := nmsClasswise(cands, y.nms, maxResults)
	out := make([]engine.Detection, 0, len(keep))
	unmap := func(v float32, off int) float32 { return float32((float64(v) - float64(off)) / lb.r) }
	for _, c := range keep {
		box, ok := clipBox(unmap(c.box[0], lb.left), unmap(c.box[1], lb.top), unmap(c.box[2], lb.left), unmap(c.box[3], lb.top), float32(w), float32(h))
		if !ok {
			continue
		}
		out = append(out, engine.Detection{Label: y.labels[c.class], Confidence: c.score, Box: box})
	}
	return out, nil
}

// decodeYOLO turns the [4+nc, anchors] output into candidates (best class
// per anchor, score >= thr), best first, at most maxCandidates.
func decodeYOLO(out []float32, nc, anchors int, thr float32) []candidate {
	// Class by class, so that the output is read in memory order (anchor
	// by anchor it would stride through 84 rows of 8400 values).
	score := append([]float32(nil), out[4*anchors:5*anchors]...)
	best := make([]int32, anchors)
	for c := 1; c < nc; c++ {
		for j, v := range out[(4+c)*anchors : (5+c)*anchors] {
			if v > score[j] {
				best[j], score[j] = int32(c), v
			}
		}
	}
	var cands []candidate
	for j := range anchors {
		best, score := int(best[j]), score[j]
		if score < thr {
			continue
		}
		cx, cy, bw, bh := out[j], out[anchors+j], out[2*anchors+j], out[3*anchors+j]
		cands = append(cands, candidate{class: best, score: score, box: [4]float32{cx - bw/2, cy - bh/2, cx + bw/2, cy + bh/2}})
	}
	byScoreDesc(cands, func(c candidate) float32 { return c.score })
	if len(cands) > maxCandidates {
		cands = cands[:maxCandidates]
	}
	return cands
}

// Close waits for runs in flight, then releases the session.
func (y *yolo) Close() error {
	y.once.Do(func() {
		close(y.done)
		y.err = y.m.close()
	})
	return y.err
}

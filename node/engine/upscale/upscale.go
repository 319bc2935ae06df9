// Package upscale runs super-resolution models (engine.TaskImageUpscale) in
// the node's in-process ONNX Runtime: the UpscalerJS ESRGAN models that
// scripts/assets-upscale.sh converts (NHWC RGB in 0..1, one file per
// scale) and the Real-ESRGAN style ONNX exports users pull elsewhere
// (NCHW RGB [1,3,H,W] in 0..1 → [1,3,sH,sW]).
//
// Large images run in overlapping tiles whose outputs are blended with
// feathered weights, so the seams do not show; an alpha channel is
// upscaled separately with bicubic (Catmull-Rom) resampling. The output is
// bounded: each side at most MaxOutputSide pixels.
//
// Manifest (engine.Spec) of a model folder:
//
//	files:   "x2", "x4", ... one ONNX file per scale; or "model" with the
//	         option "scale"
//	options: "layout"      "nhwc" or "nchw" (default: read from the input's
//	                       shape, the axis of size 3 is the channel axis)
//	         "input_range" "1" (0..1, default) or "255": the value range the
//	                       model takes and gives
//	         "tile"        tile side in input pixels (default 128)
//	         "overlap"     overlap of neighbouring tiles in input pixels
//	                       (default 16)
//	         "concurrency" concurrent tile runs (default 1)
package upscale

import (
	"context"
	"errors"
	"fmt"
	"image"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/onnx"
)

// MaxOutputSide bounds each side of an upscaled image in pixels; a larger
// result is refused with an InputError on "image".
const MaxOutputSide = 4096

// Defaults of the tiling options.
const (
	DefaultTile    = 128
	DefaultOverlap = 16
)

// errClosed is returned by calls on a closed engine.
var errClosed = errors.New("upscale: engine is closed")

// scaleModel is the session of one scale.
type scaleModel struct {
	scale   int
	sess    *ort.DynamicAdvancedSession
	in, out string
	nchw    bool
}

// Engine is a loaded upscaler: one session per scale sharing a pool of run
// options, which bounds the concurrent tile runs.
type Engine struct {
	id       string
	models   map[int]*scaleModel
	scales   []int
	rangeMax float32
	tile     int
	overlap  int
	runs     chan *ort.RunOptions
	nRuns    int
	done     chan struct{}
	once     sync.Once
}

var _ engine.Upscaler = (*Engine)(nil)

// LoadUpscaler opens the model files of spec (see the package comment for
// the manifest) with the runtime's session options.
func LoadUpscaler(rt *onnx.Runtime, spec engine.Spec) (engine.Upscaler, error) {
	return load(rt, spec)
}

func load(rt *onnx.Runtime, spec engine.Spec) (*Engine, error) {
	if spec.Task != "" && spec.Task != engine.TaskImageUpscale {
		return nil, fmt.Errorf("upscale: %s: task %q is not %q", spec.ID, spec.Task, engine.TaskImageUpscale)
	}
	rt, err := rt.ForModel(spec)
	if err != nil {
		return nil, err
	}
	files := map[int]string{}
	for role, f := range spec.Files {
		if s, ok := strings.CutPrefix(role, "x"); ok {
			n, err := strconv.Atoi(s)
			if err != nil || n < 2 || n > 8 {
				return nil, fmt.Errorf("upscale: %s: file role %q is not x2..x8", spec.ID, role)
			}
			files[n] = f
		}
	}
	if f, ok := spec.Files["model"]; ok {
		n, err := strconv.Atoi(spec.Options["scale"])
		if err != nil || n < 2 || n > 8 {
			return nil, fmt.Errorf("upscale: %s: file role \"model\" needs the option scale 2..8, have %q", spec.ID, spec.Options["scale"])
		}
		files[n] = f
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("upscale: %s: no model file (roles x2, x4, ... or model with option scale)", spec.ID)
	}
	opt := func(name string, def, lo, hi int) (int, error) {
		v, ok := spec.Options[name]
		if !ok || v == "" {
			return def, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return 0, fmt.Errorf("upscale: %s: option %s=%q is not an integer in [%d, %d]", spec.ID, name, v, lo, hi)
		}
		return n, nil
	}
	e := &Engine{id: spec.ID, models: map[int]*scaleModel{}, done: make(chan struct{})}
	if e.tile, err = opt("tile", DefaultTile, 8, 2048); err != nil {
		return nil, err
	}
	if e.overlap, err = opt("overlap", DefaultOverlap, 0, e.tile/2-1); err != nil {
		return nil, err
	}
	conc, err := opt("concurrency", 1, 1, 64)
	if err != nil {
		return nil, err
	}
	switch r := spec.Options["input_range"]; r {
	case "", "1":
		e.rangeMax = 1
	case "255":
		e.rangeMax = 255
	default:
		return nil, fmt.Errorf("upscale: %s: option input_range=%q is not 1 or 255", spec.ID, r)
	}
	layout := spec.Options["layout"]
	if layout != "" && layout != "nhwc" && layout != "nchw" {
		return nil, fmt.Errorf("upscale: %s: option layout=%q is not nhwc or nchw", spec.ID, layout)
	}
	e.runs = make(chan *ort.RunOptions, conc)
	for range conc {
		ro, err := ort.NewRunOptions()
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("upscale: run options: %w", err)
		}
		e.runs <- ro
		e.nRuns++
	}
	for s, f := range files {
		m, err := openScale(rt, filepath.Join(spec.Dir, f), s, layout)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("upscale: %s: x%d: %w", spec.ID, s, err)
		}
		e.models[s] = m
		e.scales = append(e.scales, s)
	}
	slices.Sort(e.scales)
	return e, nil
}

// openScale checks the file's signature (one float32 rank-4 input with 3
// channels and a float32 rank-4 output) and opens its session.
func openScale(rt *onnx.Runtime, path string, scale int, layout string) (*scaleModel, error) {
	ins, outs, err := onnx.ReadSignature(path)
	if err != nil {
		return nil, fmt.Errorf("read model signature: %w", err)
	}
	if len(ins) != 1 || len(outs) < 1 {
		return nil, fmt.Errorf("%s: want one input and an output, have %d and %d", path, len(ins), len(outs))
	}
	in, out := ins[0], outs[0]
	for _, io := range []ort.InputOutputInfo{in, out} {
		if io.OrtValueType != ort.ONNXTypeTensor || io.DataType != ort.TensorElementDataTypeFloat || len(io.Dimensions) != 4 {
			return nil, fmt.Errorf("%s: %q is %s, want a rank-4 float32 tensor", path, io.Name, io.String())
		}
	}
	d := in.Dimensions
	nchw := layout == "nchw"
	if layout == "" {
		switch {
		case d[3] == 3:
			nchw = false
		case d[1] == 3:
			nchw = true
		default:
			return nil, fmt.Errorf("%s: input %q has shape %v; set the option layout", path, in.Name, d)
		}
	}
	if c := map[bool]int64{true: d[1], false: d[3]}[nchw]; c != 3 && c >= 0 {
		return nil, fmt.Errorf("%s: input %q has shape %v, want 3 channels", path, in.Name, d)
	}
	opts, err := rt.SessionOptions()
	if err != nil {
		return nil, fmt.Errorf("session options: %w", err)
	}
	sess, err := ort.NewDynamicAdvancedSession(path, []string{in.Name}, []string{out.Name}, opts)
	opts.Destroy()
	if err != nil {
		return nil, fmt.Errorf("create session for %s: %w", path, err)
	}
	return &scaleModel{scale: scale, sess: sess, in: in.Name, out: out.Name, nchw: nchw}, nil
}

// ID returns the canonical model id.
func (e *Engine) ID() string { return e.id }

// Scales lists the supported factors, ascending.
func (e *Engine) Scales() []int { return slices.Clone(e.scales) }

// Upscale enlarges img scale times per side: RGB through the model in
// overlapping, feather-blended tiles, alpha (when img has any
// transparency) with bicubic resampling. An output side above
// MaxOutputSide is an InputError on "image", a factor the model lacks one
// on "upscale_factor".
func (e *Engine) Upscale(ctx context.Context, img image.Image, scale int) (*image.NRGBA, error) {
	m, ok := e.models[scale]
	if !ok {
		return nil, &engine.InputError{Param: "upscale_factor", Msg: fmt.Sprintf("Model %s upscales by %s, not %d.", e.id, joinScales(e.scales), scale)}
	}
	b := img.Bounds()
	if b.Empty() {
		return nil, &engine.InputError{Param: "image", Msg: "The image is empty."}
	}
	if w, h := b.Dx()*scale, b.Dy()*scale; w > MaxOutputSide || h > MaxOutputSide {
		return nil, &engine.InputError{Param: "image", Msg: fmt.Sprintf(
			"The image is %dx%d pixels; upscaled by %d it would be %dx%d, above the limit of %d pixels per side.",
			b.Dx(), b.Dy(), scale, w, h, MaxOutputSide)}
	}
	return e.upscale(ctx, m, img, e.tile)
}

// upscale runs the whole pipeline with tiles of side tile.
func (e *Engine) upscale(ctx context.Context, m *scaleModel, img image.Image, tile int) (*image.NRGBA, error) {
	src := toNRGBA(img)
	rgb := planes(src, e.rangeMax)
	w, h := src.Rect.Dx(), src.Rect.Dy()
	s := m.scale
	xs, ys := spans(w, tile, e.overlap), spans(h, tile, e.overlap)
	tw, th := min(w, tile), min(h, tile)
	dst := image.NewNRGBA(image.Rect(0, 0, w*s, h*s))
	acc := newBlend(w*s, th*s)
	in := make([]float32, 3*tw*th)
	for _, y0 := range ys {
		acc.flush(dst, y0*s, e.rangeMax)
		for _, x0 := range xs {
			fillTile(in, rgb, w, h, x0, y0, tw, th, m.nchw)
			out, err := e.run(ctx, m, in, tw, th)
			if err != nil {
				return nil, err
			}
			acc.add(out, x0*s, y0*s, tw*s, th*s, m.nchw,
				weights(x0, tw, w, e.overlap, s), weights(y0, th, h, e.overlap, s))
		}
	}
	acc.flush(dst, h*s, e.rangeMax)
	if !opaque(src) {
		upscaleAlpha(dst, src)
	}
	return dst, nil
}

// run executes one tile of tw×th input pixels (in the model's layout and
// range) and returns its output, checked against the expected shape.
func (e *Engine) run(ctx context.Context, m *scaleModel, in []float32, tw, th int) ([]float32, error) {
	var ro *ort.RunOptions
	select {
	case ro = <-e.runs:
		select {
		case <-e.done:
			e.runs <- ro
			return nil, errClosed
		default:
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-e.done:
		return nil, errClosed
	}
	defer func() { e.runs <- ro }()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	shape := ort.NewShape(1, int64(th), int64(tw), 3)
	if m.nchw {
		shape = ort.NewShape(1, 3, int64(th), int64(tw))
	}
	t, err := ort.NewTensor(shape, in)
	if err != nil {
		return nil, fmt.Errorf("upscale: %s: input tensor: %w", e.id, err)
	}
	defer t.Destroy()
	outs := []ort.Value{nil}
	err = onnx.RunCancellable(ctx, ro, func() error {
		return m.sess.RunWithOptions([]ort.Value{t}, outs, ro)
	})
	if outs[0] != nil {
		defer outs[0].Destroy()
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		return nil, fmt.Errorf("upscale: %s: run: %w", e.id, err)
	}
	ot, ok := outs[0].(*ort.Tensor[float32])
	if !ok {
		return nil, fmt.Errorf("upscale: %s: output is %T, want float32", e.id, outs[0])
	}
	s := int64(m.scale)
	want := ort.NewShape(1, int64(th)*s, int64(tw)*s, 3)
	if m.nchw {
		want = ort.NewShape(1, 3, int64(th)*s, int64(tw)*s)
	}
	if got := ot.GetShape(); !slices.Equal(got, want) {
		return nil, fmt.Errorf("upscale: %s: output shape %v, want %v for scale %d", e.id, got, want, m.scale)
	}
	return slices.Clone(ot.GetData()), nil
}

// Close waits for tile runs in flight and releases the sessions.
func (e *Engine) Close() error {
	var err error
	e.once.Do(func() {
		close(e.done)
		for range e.nRuns {
			(<-e.runs).Destroy()
		}
		for _, m := range e.models {
			err = errors.Join(err, m.sess.Destroy())
		}
	})
	return err
}

func joinScales(s []int) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = strconv.Itoa(v)
	}
	return strings.Join(parts, " or ")
}

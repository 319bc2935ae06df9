package onnx

import (
	"context"
	"errors"
	"fmt"
	"image"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/memtrim"
)

// ISNet defaults and bounds for Spec.Options.
const (
	isnetDefaultSize = 1024
	isnetMaxSize     = 4096
	// isnetMaxRuns bounds the "concurrency" option.
	isnetMaxRuns = 64
)

// errEngineClosed is returned by calls on a closed engine.
var errEngineClosed = errors.New("onnx: engine is closed")

// isnetSlot is everything one in-flight inference owns: the input and output
// buffers, the ORT tensors wrapping them and the run options that cancel it.
type isnetSlot struct {
	input, output []float32
	inT, outT     *ort.Tensor[float32]
	run           *ort.RunOptions
}

func (s *isnetSlot) destroy() {
	if s.inT != nil {
		s.inT.Destroy()
	}
	if s.outT != nil {
		s.outT.Destroy()
	}
	if s.run != nil {
		s.run.Destroy()
	}
}

// isnet is the ISNet (DIS) background-removal pipeline.
//
// Concurrency: the model runs in one ort.DynamicAdvancedSession, created once.
// ONNX Runtime allows concurrent Run calls on one session as long as each
// call has its own input and output values; an AdvancedSession binds a single
// set of tensors at creation and would need a lock around fill, run and read.
// Here each of n slots owns preallocated tensors, and the slots channel is
// both the pool of those tensors and the semaphore bounding concurrent runs.
// n defaults to 1: one run already spreads over the intra-op threads, and each
// further concurrent run costs its own activation memory (hundreds of MB at
// 1024x1024) for little extra throughput on CPU. Decoding-side work (pixel
// conversion, mask resize to the caller's size) happens outside the slot.
type isnet struct {
	id      string
	size    int
	session *ort.DynamicAdvancedSession
	slots   chan *isnetSlot
	nSlots  int // slots created; Close collects this many
	done    chan struct{}
	once    sync.Once
	err     error

	// newSession builds a fresh session (no arena memory yet).
	newSession func() (*ort.DynamicAdvancedSession, error)
	// idle > 0: after that long without a run, the session is rebuilt,
	// which gives its arena back (see releaseIdle); idleTimer is armed by
	// every run's end and stopped by Close (guarded by idleMu).
	idle      time.Duration
	idleMu    sync.Mutex
	idleTimer *time.Timer
	// rebuilds counts sessions rebuilt to give the arena back.
	rebuilds atomic.Int64
}

// LoadBackgroundRemover loads an ISNet-style model: one float input
// [1,3,S,S] fed with (pixel-128)/256 per RGB channel, and a [1,1,S,S] mask in
// [0,1] as the output named "output" (else the first output). spec.Files
// ["model"] names the .onnx file inside spec.Dir; spec.Options "input_size"
// sets S (default 1024) and "concurrency" the number of simultaneous runs
// (default 1). With the arena kept and an idle duration (memory_arena
// "5m", or Config.ArenaIdle), the session is rebuilt after that long
// without runs, which gives the arena's memory back (releaseIdle).
func (r *Runtime) LoadBackgroundRemover(spec engine.Spec) (engine.BackgroundRemover, error) {
	r, err := r.checkLoad(spec, engine.TaskBackgroundRemoval)
	if err != nil {
		return nil, err
	}
	size, err := IntOption(spec.Options, "input_size", isnetDefaultSize, 32, isnetMaxSize)
	if err != nil {
		return nil, fmt.Errorf("onnx: %s: %w", spec.ID, err)
	}
	nSlots, err := IntOption(spec.Options, "concurrency", 1, 1, isnetMaxRuns)
	if err != nil {
		return nil, fmt.Errorf("onnx: %s: %w", spec.ID, err)
	}
	name := spec.Files["model"]
	if name == "" {
		return nil, fmt.Errorf("onnx: %s: spec names no \"model\" file", spec.ID)
	}
	path := filepath.Join(spec.Dir, name)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("onnx: %s: model file: %w", spec.ID, err)
	}
	inName, outName, err := isnetIO(path, size)
	if err != nil {
		return nil, fmt.Errorf("onnx: %s: %w", spec.ID, err)
	}
	newSession := func() (*ort.DynamicAdvancedSession, error) {
		opts, err := r.SessionOptions()
		if err != nil {
			return nil, fmt.Errorf("session options: %w", err)
		}
		defer opts.Destroy()
		s, err := ort.NewDynamicAdvancedSession(path, []string{inName}, []string{outName}, opts)
		if err != nil {
			return nil, fmt.Errorf("create session: %w", err)
		}
		return s, nil
	}
	session, err := newSession()
	if err != nil {
		return nil, fmt.Errorf("onnx: %s: %w", spec.ID, err)
	}
	e := &isnet{
		id:         spec.ID,
		size:       size,
		session:    session,
		slots:      make(chan *isnetSlot, nSlots),
		done:       make(chan struct{}),
		newSession: newSession,
		idle:       r.ArenaIdle(),
	}
	for range nSlots {
		s, err := newISNetSlot(size)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("onnx: %s: %w", spec.ID, err)
		}
		e.slots <- s
		e.nSlots++
	}
	return e, nil
}

// isnetIO checks the model's signature against the expected shapes and
// returns its input and output names. The probe session skips graph
// optimisation, so it costs little next to the real one.
func isnetIO(path string, size int) (string, string, error) {
	ins, outs, err := ReadSignature(path)
	if err != nil {
		return "", "", fmt.Errorf("read model signature: %w", err)
	}
	if len(ins) != 1 {
		return "", "", fmt.Errorf("model has %d inputs, want 1 image input", len(ins))
	}
	if len(outs) == 0 {
		return "", "", errors.New("model has no outputs")
	}
	out := outs[0]
	for _, o := range outs {
		if o.Name == "output" {
			out = o
		}
	}
	if err := checkImageTensor(ins[0], 3, size); err != nil {
		return "", "", fmt.Errorf("input %q: %w", ins[0].Name, err)
	}
	if err := checkImageTensor(out, 1, size); err != nil {
		return "", "", fmt.Errorf("output %q: %w", out.Name, err)
	}
	return ins[0].Name, out.Name, nil
}

// checkImageTensor accepts a float tensor [1|?, channels, size|?, size|?].
func checkImageTensor(info ort.InputOutputInfo, channels, size int) error {
	if info.OrtValueType != ort.ONNXTypeTensor || info.DataType != ort.TensorElementDataTypeFloat {
		return fmt.Errorf("is %s, want a float32 tensor", info.String())
	}
	d := info.Dimensions
	want := []int64{1, int64(channels), int64(size), int64(size)}
	if len(d) != len(want) {
		return fmt.Errorf("has shape %v, want %v", d, want)
	}
	for i, w := range want {
		if d[i] >= 0 && d[i] != w {
			if i >= 2 {
				return fmt.Errorf("has shape %v but input_size is %d", d, size)
			}
			return fmt.Errorf("has shape %v, want %v", d, want)
		}
	}
	return nil
}

func newISNetSlot(size int) (*isnetSlot, error) {
	s := &isnetSlot{
		input:  make([]float32, 3*size*size),
		output: make([]float32, size*size),
	}
	var err error
	if s.inT, err = ort.NewTensor(ort.NewShape(1, 3, int64(size), int64(size)), s.input); err != nil {
		return nil, fmt.Errorf("input tensor: %w", err)
	}
	if s.outT, err = ort.NewTensor(ort.NewShape(1, 1, int64(size), int64(size)), s.output); err != nil {
		s.destroy()
		return nil, fmt.Errorf("output tensor: %w", err)
	}
	if s.run, err = ort.NewRunOptions(); err != nil {
		s.destroy()
		return nil, fmt.Errorf("run options: %w", err)
	}
	return s, nil
}

// ID returns the canonical model id.
func (e *isnet) ID() string { return e.id }

// RemoveBackground predicts the foreground mask of img and returns img's
// pixels with that mask as alpha (multiplied by img's own alpha, so pixels
// that were already transparent stay so). Cancelling ctx abandons the call
// while it waits for a run slot, and stops a run in progress.
func (e *isnet) RemoveBackground(ctx context.Context, img image.Image) (*image.NRGBA, error) {
	if img == nil || img.Bounds().Empty() {
		return nil, &engine.InputError{Param: "image", Msg: "image has no pixels"}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case <-e.done:
		return nil, errEngineClosed
	default:
	}
	out := toNRGBA(img)
	mask, err := e.predict(ctx, out)
	if err != nil {
		return nil, err
	}
	applyMask(out, mask, e.size)
	return out, nil
}

// predict runs the model on src and returns a copy of the size x size mask.
func (e *isnet) predict(ctx context.Context, src *image.NRGBA) ([]float32, error) {
	var slot *isnetSlot
	select {
	case slot = <-e.slots:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-e.done:
		return nil, errEngineClosed
	}
	defer func() {
		e.slots <- slot
		e.armIdle()
	}()
	// A slot taken after Close began goes straight back to Close.
	select {
	case <-e.done:
		return nil, errEngineClosed
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	resizeToCHW(src, e.size, slot.input)
	if err := e.run(ctx, slot); err != nil {
		return nil, err
	}
	mask := make([]float32, len(slot.output))
	copy(mask, slot.output)
	return mask, nil
}

// run executes the session on the slot's tensors; ctx's cancellation sets the
// slot's terminate flag, which ORT checks between graph nodes.
func (e *isnet) run(ctx context.Context, slot *isnetSlot) error {
	err := RunCancellable(ctx, slot.run, func() error {
		return e.session.RunWithOptions([]ort.Value{slot.inT}, []ort.Value{slot.outT}, slot.run)
	})
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("onnx: %s: run: %w", e.id, err)
	}
	return nil
}

// Close waits for runs in flight, then releases the tensors and the session.
// Calls that have not started a run fail with an error once Close begins.
func (e *isnet) Close() error {
	e.once.Do(func() {
		close(e.done)
		e.idleMu.Lock()
		if e.idleTimer != nil {
			e.idleTimer.Stop()
		}
		e.idleMu.Unlock()
		var errs []error
		for range e.nSlots {
			(<-e.slots).destroy()
		}
		if e.session != nil {
			errs = append(errs, e.session.Destroy())
		}
		e.err = errors.Join(errs...)
	})
	return e.err
}

// armIdle (re)starts the idle timer after a run, when the model gives its
// arena back after e.idle without runs.
func (e *isnet) armIdle() {
	if e.idle <= 0 {
		return
	}
	e.idleMu.Lock()
	defer e.idleMu.Unlock()
	select {
	case <-e.done:
		return
	default:
	}
	if e.idleTimer == nil {
		e.idleTimer = time.AfterFunc(e.idle, e.releaseIdle)
		return
	}
	e.idleTimer.Reset(e.idle)
}

// releaseIdle gives the session's arena back by replacing the session
// with a fresh one, which holds the weights but no run memory. It needs
// every slot (no run in flight) and takes them without waiting: a run that
// holds one re-arms the timer when it ends. The new session is built
// before the old one goes, so a failure keeps the old one.
func (e *isnet) releaseIdle() {
	held := make([]*isnetSlot, 0, e.nSlots)
	defer func() {
		for _, s := range held {
			e.slots <- s
		}
	}()
	for range e.nSlots {
		select {
		case s := <-e.slots:
			held = append(held, s)
		default:
			return
		}
	}
	select {
	case <-e.done:
		return
	default:
	}
	fresh, err := e.newSession()
	if err != nil {
		return // keep the session and its arena; the next run re-arms
	}
	old := e.session
	e.session = fresh
	_ = old.Destroy()
	e.rebuilds.Add(1)
	// The old arena went back to the C heap: give it to the system too.
	memtrim.Release()
}

package tts

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine/onnx"
)

// maxRuns bounds the "concurrency" option.
const maxRuns = 16

// errClosed is returned by calls on a closed engine.
var errClosed = errors.New("tts: engine is closed")

// model is one ONNX session with a pool of run options.
//
// Input lengths vary from call to call (phoneme counts, spectrogram frames),
// so tensors are made per run and the outputs are allocated by ONNX Runtime;
// what a run must own for itself is its RunOptions, whose terminate flag
// cancels it. The runs channel is both that pool and the semaphore bounding
// concurrent runs on the session (ORT allows concurrent Run calls on one
// session with distinct values).
type model struct {
	id       string
	session  *ort.DynamicAdvancedSession
	inNames  []string
	outNames []string
	runs     chan *ort.RunOptions
	n        int
	done     chan struct{}
	once     sync.Once
	err      error
	// calls counts finished runs (tests use it to check that audio is
	// emitted before the last run).
	calls atomic.Int64
}

// openModel creates the session on path with the runtime's options and n
// run slots.
func openModel(rt *onnx.Runtime, id, path string, ins, outs []string, n int) (*model, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	opts, err := rt.SessionOptions()
	if err != nil {
		return nil, fmt.Errorf("session options: %w", err)
	}
	defer opts.Destroy()
	s, err := ort.NewDynamicAdvancedSession(path, ins, outs, opts)
	if err != nil {
		return nil, fmt.Errorf("create session %s: %w", path, err)
	}
	m := &model{id: id, session: s, inNames: ins, outNames: outs, runs: make(chan *ort.RunOptions, n), done: make(chan struct{})}
	for range n {
		ro, err := ort.NewRunOptions()
		if err != nil {
			m.close()
			return nil, fmt.Errorf("run options: %w", err)
		}
		m.runs <- ro
		m.n++
	}
	return m, nil
}

// modelIO reads the input and output names of the model at path, with
// graph optimisation off so the probe is cheap.
func modelIO(path string) (ins, outs []ort.InputOutputInfo, err error) {
	ins, outs, err = onnx.ReadSignature(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read model signature of %s: %w", path, err)
	}
	return ins, outs, nil
}

// hasIO reports whether infos has a tensor named name of element type dt.
func hasIO(infos []ort.InputOutputInfo, name string, dt ort.TensorElementDataType) bool {
	for _, in := range infos {
		if in.Name == name && in.OrtValueType == ort.ONNXTypeTensor && in.DataType == dt {
			return true
		}
	}
	return false
}

// requireIO checks that infos has every name with its element type.
func requireIO(kind string, infos []ort.InputOutputInfo, want map[string]ort.TensorElementDataType) error {
	for name, dt := range want {
		if !hasIO(infos, name, dt) {
			return fmt.Errorf("model has no %s %q of element type %v (has %v)", kind, name, dt, infos)
		}
	}
	return nil
}

// run executes the session on inputs (in inNames order) and returns the
// float32 data and shape of each output, copied out of ORT. Cancelling ctx
// abandons the wait for a run slot and terminates a run in progress.
func (m *model) run(ctx context.Context, inputs []ort.Value) ([][]float32, []ort.Shape, error) {
	var ro *ort.RunOptions
	select {
	case ro = <-m.runs:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case <-m.done:
		return nil, nil, errClosed
	}
	defer func() { m.runs <- ro }()
	select {
	case <-m.done:
		return nil, nil, errClosed
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	outs := make([]ort.Value, len(m.outNames))
	defer func() {
		for _, o := range outs {
			if o != nil {
				o.Destroy()
			}
		}
	}()
	err := onnx.RunCancellable(ctx, ro, func() error {
		return m.session.RunWithOptions(inputs, outs, ro)
	})
	// The inputs' Go memory backs the ORT tensors: keep it reachable until
	// the run has returned (a collected input was read as garbage once).
	runtime.KeepAlive(inputs)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, nil, cerr
		}
		return nil, nil, fmt.Errorf("tts: %s: run: %w", m.id, err)
	}
	m.calls.Add(1)
	data := make([][]float32, len(outs))
	shapes := make([]ort.Shape, len(outs))
	for i, o := range outs {
		t, ok := o.(*ort.Tensor[float32])
		if !ok {
			return nil, nil, fmt.Errorf("tts: %s: output %q is not a float32 tensor", m.id, m.outNames[i])
		}
		data[i] = append([]float32(nil), t.GetData()...)
		shapes[i] = t.GetShape().Clone()
	}
	return data, shapes, nil
}

// close waits for runs in flight, then releases the session.
func (m *model) close() error {
	m.once.Do(func() {
		close(m.done)
		for range m.n {
			(<-m.runs).Destroy()
		}
		if m.session != nil {
			m.err = m.session.Destroy()
		}
	})
	return m.err
}

// tensors makes ORT tensors over the given slices; destroy them with
// destroyAll.
type tensors []ort.Value

func (ts *tensors) i64(shape ort.Shape, data []int64) error {
	t, err := ort.NewTensor(shape, data)
	if err != nil {
		return err
	}
	*ts = append(*ts, t)
	return nil
}

func (ts *tensors) f32(shape ort.Shape, data []float32) error {
	t, err := ort.NewTensor(shape, data)
	if err != nil {
		return err
	}
	*ts = append(*ts, t)
	return nil
}

func (ts tensors) destroyAll() {
	for _, t := range ts {
		t.Destroy()
	}
}

package vision

import (
	"context"
	"fmt"
	"os"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine/onnx"
)

// ioSpec names one model input or output with its element type and rank;
// dims, when set, are the sizes the file must fix or leave dynamic (-1 in
// dims means any size).
type ioSpec struct {
	name  string
	dtype ort.TensorElementDataType
	dims  []int64
}

// f32 is an ioSpec for a float32 tensor.
func f32(name string, dims ...int64) ioSpec {
	return ioSpec{name: name, dtype: ort.TensorElementDataTypeFloat, dims: dims}
}

// i64 is an ioSpec for an int64 tensor.
func i64(name string, dims ...int64) ioSpec {
	return ioSpec{name: name, dtype: ort.TensorElementDataTypeInt64, dims: dims}
}

// dynModel is one ONNX session whose inputs change shape from run to run
// (OCR crops, token sequences): every run builds its own input tensors and
// lets ONNX Runtime allocate the outputs. The runs channel holds one run
// options value per allowed concurrent run and is the semaphore that bounds
// them, as the slot pool of model does.
type dynModel struct {
	id        string
	sess      *ort.DynamicAdvancedSession
	ins, outs []string
	runs      chan *ort.RunOptions
	nRuns     int
}

// openDynModel checks the file's signature (names, element types, ranks
// and any fixed sizes) and opens a session allowing n concurrent runs.
func openDynModel(rt *onnx.Runtime, id, path string, ins, outs []ioSpec, n int) (*dynModel, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("model file: %w", err)
	}
	if err := checkIO(path, ins, outs); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	opts, err := rt.SessionOptions()
	if err != nil {
		return nil, fmt.Errorf("session options: %w", err)
	}
	inNames, outNames := ioNames(ins), ioNames(outs)
	sess, err := ort.NewDynamicAdvancedSession(path, inNames, outNames, opts)
	opts.Destroy()
	if err != nil {
		return nil, fmt.Errorf("create session for %s: %w", path, err)
	}
	m := &dynModel{id: id, sess: sess, ins: inNames, outs: outNames, runs: make(chan *ort.RunOptions, n)}
	for range n {
		ro, err := ort.NewRunOptions()
		if err != nil {
			m.close()
			return nil, fmt.Errorf("run options: %w", err)
		}
		m.runs <- ro
		m.nRuns++
	}
	return m, nil
}

func ioNames(specs []ioSpec) []string {
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.name
	}
	return out
}

// checkIO reads the model's inputs and outputs without optimising the graph
// and checks each wanted one.
func checkIO(path string, ins, outs []ioSpec) error {
	probe, err := ort.NewSessionOptions()
	if err != nil {
		return err
	}
	defer probe.Destroy()
	if err := probe.SetGraphOptimizationLevel(ort.GraphOptimizationLevelDisableAll); err != nil {
		return err
	}
	fin, fout, err := ort.GetInputOutputInfoWithOptions(path, probe)
	if err != nil {
		return fmt.Errorf("read model signature: %w", err)
	}
	check := func(kind string, want []ioSpec, have []ort.InputOutputInfo) error {
		for _, w := range want {
			var info *ort.InputOutputInfo
			for i := range have {
				if have[i].Name == w.name {
					info = &have[i]
				}
			}
			if info == nil {
				return fmt.Errorf("model has no %s %q", kind, w.name)
			}
			if info.OrtValueType != ort.ONNXTypeTensor || info.DataType != w.dtype {
				return fmt.Errorf("%s %q is %s, want a %s tensor", kind, w.name, info.String(), w.dtype)
			}
			if w.dims == nil {
				continue
			}
			d := info.Dimensions
			if len(d) != len(w.dims) {
				return fmt.Errorf("%s %q has shape %v, want rank %d (%v)", kind, w.name, d, len(w.dims), w.dims)
			}
			for i := range d {
				if d[i] >= 0 && w.dims[i] >= 0 && d[i] != w.dims[i] {
					return fmt.Errorf("%s %q has shape %v, want %v", kind, w.name, d, w.dims)
				}
			}
		}
		return nil
	}
	if err := check("input", ins, fin); err != nil {
		return err
	}
	return check("output", outs, fout)
}

// run executes the session on inputs (in the order of the input specs) and
// returns the outputs, allocated by ONNX Runtime; the caller destroys them
// (destroyAll). It waits for a free run while ctx allows; done is the
// engine's closing signal. Cancelling ctx during the run sets ORT's
// terminate flag.
func (m *dynModel) run(ctx context.Context, done <-chan struct{}, inputs []ort.Value) ([]ort.Value, error) {
	var ro *ort.RunOptions
	select {
	case ro = <-m.runs:
		select {
		case <-done:
			m.runs <- ro
			return nil, errClosed
		default:
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-done:
		return nil, errClosed
	}
	defer func() { m.runs <- ro }()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	outs := make([]ort.Value, len(m.outs))
	terminated := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(terminated)
		ro.Terminate()
	})
	err := m.sess.RunWithOptions(inputs, outs, ro)
	if !stop() {
		<-terminated
		if uerr := ro.UnsetTerminate(); uerr != nil && err == nil {
			err = uerr
		}
	}
	if err != nil {
		destroyAll(outs)
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		return nil, fmt.Errorf("vision: %s: run: %w", m.id, err)
	}
	return outs, nil
}

// destroyAll releases every non-nil value.
func destroyAll(vs []ort.Value) {
	for _, v := range vs {
		if v != nil {
			v.Destroy()
		}
	}
}

// floats returns a float32 output's data and shape (the data belongs to v).
func floats(v ort.Value) ([]float32, []int64, error) {
	t, ok := v.(*ort.Tensor[float32])
	if !ok {
		return nil, nil, fmt.Errorf("output is %T, want a float32 tensor", v)
	}
	return t.GetData(), t.GetShape(), nil
}

// close waits for runs in flight, then releases the run options and the
// session.
func (m *dynModel) close() error {
	for range m.nRuns {
		(<-m.runs).Destroy()
	}
	m.nRuns = 0
	if m.sess == nil {
		return nil
	}
	err := m.sess.Destroy()
	m.sess = nil
	return err
}

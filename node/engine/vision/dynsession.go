package vision

import (
	"context"
	"fmt"

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
// and any fixed sizes) and opens a session allowing n concurrent runs;
// spin lets its intra-op threads spin (see spinning).
func openDynModel(rt *onnx.Runtime, id, path string, ins, outs []ioSpec, n int, spin bool) (*dynModel, error) {
	sess, err := openSession(rt, path, ins, outs, spin)
	if err != nil {
		return nil, err
	}
	inNames, outNames := names(ins), names(outs)
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

// ioName is the input's or output's name.
func (s ioSpec) ioName() string { return s.name }

// check accepts a tensor of s's element type and, when s.dims is set, of
// its rank and of its sizes where both the file and s fix them.
func (s ioSpec) check(kind string, info *ort.InputOutputInfo) error {
	if info.OrtValueType != ort.ONNXTypeTensor || info.DataType != s.dtype {
		return fmt.Errorf("%s %q is %s, want a %s tensor", kind, s.name, info.String(), s.dtype)
	}
	if s.dims == nil {
		return nil
	}
	d := info.Dimensions
	if len(d) != len(s.dims) {
		return fmt.Errorf("%s %q has shape %v, want rank %d (%v)", kind, s.name, d, len(s.dims), s.dims)
	}
	for i := range d {
		if d[i] >= 0 && s.dims[i] >= 0 && d[i] != s.dims[i] {
			return fmt.Errorf("%s %q has shape %v, want %v", kind, s.name, d, s.dims)
		}
	}
	return nil
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
	err := onnx.RunCancellable(ctx, ro, func() error {
		return m.sess.RunWithOptions(inputs, outs, ro)
	})
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

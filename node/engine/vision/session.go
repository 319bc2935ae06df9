package vision

import (
	"context"
	"errors"
	"fmt"
	"image"
	"os"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine/onnx"
)

// allowSpinning is ONNX Runtime's session setting for intra-op threads
// spinning between parallel sections.
const allowSpinning = "session.intra_op.allow_spinning"

// forceSpinningStop makes a session's spinning intra-op threads stop
// spinning (and block) as soon as its last concurrent Run returns, instead
// of spinning on for a while after it. Without it, the threads CenterNet's
// run left spinning held the second core while the request went on: the
// goroutine that resizes the next picture beside its decode found a free
// core in 14-37 of 103 requests, against 86-89 with it, and CenterNet's
// runs were no slower (fastest of 100: 21.7 ms either way).
const forceSpinningStop = "session.force_spinning_stop"

// errClosed is returned by calls on a closed engine.
var errClosed = errors.New("vision: engine is closed")

// tensorSpec names one float32 model input or output and its shape for a
// batch of one; the first axis is the batch axis.
type tensorSpec struct {
	name  string
	shape []int64
}

// size is the number of floats one batch item takes.
func (t tensorSpec) size() int {
	n := 1
	for _, d := range t.shape[1:] {
		n *= int(d)
	}
	return n
}

// slot is everything one in-flight run owns: the input and output buffers
// (for maxBatch items), ORT tensors over them at full batch, and the run
// options that cancel it.
type slot struct {
	in, out   [][]float32
	inT, outT []ort.Value
	run       *ort.RunOptions
}

func (s *slot) destroy() {
	for _, v := range append(s.inT, s.outT...) {
		if v != nil {
			v.Destroy()
		}
	}
	if s.run != nil {
		s.run.Destroy()
	}
}

// model is one ONNX session with a pool of run slots, in the style of the
// onnx package's ISNet engine. ONNX Runtime allows concurrent Run calls on
// one session as long as each has its own input and output values; the
// slots channel is both the pool of those buffers and the semaphore that
// bounds concurrent runs (the "concurrency" option, default 1: one run
// already spreads over the intra-op threads).
type model struct {
	id        string
	sess      *ort.DynamicAdvancedSession
	ins, outs []tensorSpec
	maxBatch  int
	slots     chan *slot
	nSlots    int
}

// openModel checks the file's signature against ins and outs (a dimension
// the file leaves dynamic is accepted) and opens a session with nSlots slots
// of maxBatch items each; spin lets its intra-op threads spin (see
// spinning).
func openModel(rt *onnx.Runtime, id, path string, ins, outs []tensorSpec, maxBatch, nSlots int, spin bool) (*model, error) {
	sess, err := openSession(rt, path, ins, outs, spin)
	if err != nil {
		return nil, err
	}
	m := &model{id: id, sess: sess, ins: ins, outs: outs, maxBatch: maxBatch, slots: make(chan *slot, nSlots)}
	for range nSlots {
		s, err := m.newSlot()
		if err != nil {
			m.close()
			return nil, err
		}
		m.slots <- s
		m.nSlots++
	}
	return m, nil
}

// ioSig is a wanted model input or output (tensorSpec or ioSpec): its name
// and the check of the file's entry of that name.
type ioSig interface {
	ioName() string
	check(kind string, info *ort.InputOutputInfo) error
}

// openSession checks that path exists and that its signature has ins and
// outs (read without optimising the graph), then opens a session over them
// with the runtime's session options, its intra-op threads spinning only
// when spin is set.
func openSession[S ioSig](rt *onnx.Runtime, path string, ins, outs []S, spin bool) (*ort.DynamicAdvancedSession, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("model file: %w", err)
	}
	if err := checkSignature(path, ins, outs); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	opts, err := rt.SessionOptions()
	if err != nil {
		return nil, fmt.Errorf("session options: %w", err)
	}
	if !spin {
		if err := opts.AddSessionConfigEntry(allowSpinning, "0"); err != nil {
			opts.Destroy()
			return nil, fmt.Errorf("session option %s: %w", allowSpinning, err)
		}
	} else if err := opts.AddSessionConfigEntry(forceSpinningStop, "1"); err != nil {
		opts.Destroy()
		return nil, fmt.Errorf("session option %s: %w", forceSpinningStop, err)
	}
	sess, err := ort.NewDynamicAdvancedSession(path, names(ins), names(outs), opts)
	opts.Destroy()
	if err != nil {
		return nil, fmt.Errorf("create session for %s: %w", path, err)
	}
	return sess, nil
}

// names lists the specs' names in order.
func names[S ioSig](specs []S) []string {
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.ioName()
	}
	return out
}

// checkSignature reads the model's inputs and outputs without optimising
// the graph and checks each wanted one against the file's entry of its name.
func checkSignature[S ioSig](path string, ins, outs []S) error {
	fin, fout, err := onnx.ReadSignature(path)
	if err != nil {
		return fmt.Errorf("read model signature: %w", err)
	}
	check := func(kind string, want []S, have []ort.InputOutputInfo) error {
		for _, w := range want {
			var info *ort.InputOutputInfo
			for i := range have {
				if have[i].Name == w.ioName() {
					info = &have[i]
				}
			}
			if info == nil {
				return fmt.Errorf("model has no %s %q", kind, w.ioName())
			}
			if err := w.check(kind, info); err != nil {
				return err
			}
		}
		return nil
	}
	if err := check("input", ins, fin); err != nil {
		return err
	}
	return check("output", outs, fout)
}

// ioName is the tensor's name.
func (t tensorSpec) ioName() string { return t.name }

// check accepts a float32 tensor of t's shape where the file fixes it (the
// batch axis is free).
func (t tensorSpec) check(kind string, info *ort.InputOutputInfo) error {
	if info.OrtValueType != ort.ONNXTypeTensor || info.DataType != ort.TensorElementDataTypeFloat {
		return fmt.Errorf("%s %q is %s, want a float32 tensor", kind, t.name, info.String())
	}
	d := info.Dimensions
	if len(d) != len(t.shape) {
		return fmt.Errorf("%s %q has shape %v, want %v", kind, t.name, d, t.shape)
	}
	for i := 1; i < len(d); i++ {
		if d[i] >= 0 && d[i] != t.shape[i] {
			return fmt.Errorf("%s %q has shape %v, want %v", kind, t.name, d, t.shape)
		}
	}
	return nil
}

func (m *model) newSlot() (*slot, error) {
	s := &slot{}
	mk := func(specs []tensorSpec) ([][]float32, []ort.Value, error) {
		bufs := make([][]float32, len(specs))
		vals := make([]ort.Value, len(specs))
		for i, t := range specs {
			bufs[i] = make([]float32, m.maxBatch*t.size())
			v, err := ort.NewTensor(batchShape(t, m.maxBatch), bufs[i])
			if err != nil {
				return nil, nil, fmt.Errorf("tensor %q: %w", t.name, err)
			}
			vals[i] = v
		}
		return bufs, vals, nil
	}
	var err error
	if s.in, s.inT, err = mk(m.ins); err != nil {
		s.destroy()
		return nil, err
	}
	if s.out, s.outT, err = mk(m.outs); err != nil {
		s.destroy()
		return nil, err
	}
	if s.run, err = ort.NewRunOptions(); err != nil {
		s.destroy()
		return nil, fmt.Errorf("run options: %w", err)
	}
	return s, nil
}

func batchShape(t tensorSpec, n int) ort.Shape {
	s := append(ort.Shape{int64(n)}, t.shape[1:]...)
	return s
}

// acquire takes a free slot, waiting for one; it fails when ctx ends or the
// engine closes (done).
func (m *model) acquire(ctx context.Context, done <-chan struct{}) (*slot, error) {
	select {
	case s := <-m.slots:
		// A slot taken after Close began goes straight back to Close.
		select {
		case <-done:
			m.slots <- s
			return nil, errClosed
		default:
		}
		return s, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-done:
		return nil, errClosed
	}
}

// acquireFor is acquire for a request on img. When img is a JPEG still to
// be decoded (a rowStream) and no slot is free, it decodes it first and
// returns the picture: the slot is then held for the resize and the run
// only, as when the API decoded the picture, so a queue of requests keeps
// the model busy; with a free slot the stream comes back, for the resize
// to run beside the decode (resampleImage). (Another request may take
// that slot first; this one then waits with its picture still to decode,
// and decodes it once it holds the slot.)
func (m *model) acquireFor(ctx context.Context, done <-chan struct{}, img image.Image) (*slot, image.Image, error) {
	if st, ok := img.(rowStream); ok && len(m.slots) == 0 {
		final, _, err := st.Decode()
		if err != nil {
			return nil, nil, err
		}
		img = final
	}
	s, err := m.acquire(ctx, done)
	return s, img, err
}

func (m *model) release(s *slot) { m.slots <- s }

// run executes the session on the first n items of s's buffers (n <=
// maxBatch); the caller has filled s.in and reads s.out afterwards. ctx's
// cancellation sets the slot's terminate flag, which ORT checks between graph
// nodes.
func (m *model) run(ctx context.Context, s *slot, n int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ins, outs := s.inT, s.outT
	if n != m.maxBatch {
		// A smaller batch runs on temporary tensors over the same buffers.
		var tmp []ort.Value
		defer func() {
			for _, v := range tmp {
				v.Destroy()
			}
		}()
		view := func(specs []tensorSpec, bufs [][]float32) ([]ort.Value, error) {
			vals := make([]ort.Value, len(specs))
			for i, t := range specs {
				v, err := ort.NewTensor(batchShape(t, n), bufs[i][:n*t.size()])
				if err != nil {
					return nil, fmt.Errorf("vision: %s: tensor %q: %w", m.id, t.name, err)
				}
				tmp = append(tmp, v)
				vals[i] = v
			}
			return vals, nil
		}
		var err error
		if ins, err = view(m.ins, s.in); err != nil {
			return err
		}
		if outs, err = view(m.outs, s.out); err != nil {
			return err
		}
	}
	err := onnx.RunCancellable(ctx, s.run, func() error {
		return m.sess.RunWithOptions(ins, outs, s.run)
	})
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("vision: %s: run: %w", m.id, err)
	}
	return nil
}

// close waits for runs in flight (every slot back in the pool), then
// releases the buffers' tensors and the session.
func (m *model) close() error {
	for range m.nSlots {
		(<-m.slots).destroy()
	}
	m.nSlots = 0
	if m.sess == nil {
		return nil
	}
	err := m.sess.Destroy()
	m.sess = nil
	return err
}

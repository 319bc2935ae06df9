package diffusion

import (
	"context"
	"fmt"
	"math"
	"os"
	"unsafe"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine/onnx"
)

// ftensor is a float tensor in the dtype a graph wants (float32 or
// float16), filled from and read into float32 slices. Float32 tensors are
// written in place; float16 ones are converted on the way in and out.
type ftensor struct {
	f32   *ort.Tensor[float32]
	f16   *ort.CustomDataTensor
	sc    *ort.Scalar[float32] // a rank-0 float32 tensor
	n     int
	shape ort.Shape
}

// newFTensor allocates a zeroed tensor of shape in dtype.
func newFTensor(dtype ort.TensorElementDataType, shape ort.Shape) (*ftensor, error) {
	t := &ftensor{n: int(shape.FlattenedSize()), shape: shape.Clone()}
	var err error
	if len(shape) == 0 {
		// ORT's Go binding makes rank-0 tensors as Scalars only, which
		// cannot hold float16.
		if dtype != ort.TensorElementDataTypeFloat {
			return nil, fmt.Errorf("rank-0 %s tensors are not supported", dtype)
		}
		t.n = 1
		if t.sc, err = ort.NewEmptyScalar[float32](); err != nil {
			return nil, err
		}
		return t, nil
	}
	switch dtype {
	case ort.TensorElementDataTypeFloat:
		t.f32, err = ort.NewEmptyTensor[float32](shape)
	case ort.TensorElementDataTypeFloat16:
		t.f16, err = ort.NewCustomDataTensor(shape, make([]byte, 2*t.n), ort.TensorElementDataTypeFloat16)
	default:
		err = fmt.Errorf("tensor type %s is not float32 or float16", dtype)
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// value is the ORT value to pass to a run.
func (t *ftensor) value() ort.Value {
	if t.sc != nil {
		return t.sc
	}
	if t.f32 != nil {
		return t.f32
	}
	return t.f16
}

// data returns the float32 backing slice, or nil for a float16 tensor.
func (t *ftensor) data() []float32 {
	if t.f32 != nil {
		return t.f32.GetData()
	}
	return nil
}

// halves is a float16 tensor's elements as native-order uint16s (ORT
// reads them in the host's byte order).
func (t *ftensor) halves() []uint16 {
	b := t.f16.GetData()
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/2)
}

// set copies src (len n) into the tensor.
func (t *ftensor) set(src []float32) {
	if t.sc != nil {
		t.sc.Set(src[0])
		return
	}
	t.setAt(0, src[:t.n])
}

// get copies the tensor into dst (len n).
func (t *ftensor) get(dst []float32) {
	if t.sc != nil {
		dst[0] = t.sc.GetData()
		return
	}
	t.getAt(0, dst[:t.n])
}

// setAt copies src into the k-th batch entry (len(src) elements each).
func (t *ftensor) setAt(k int, src []float32) {
	t.put(k*len(src), src)
}

// put copies src into the elements from off on.
func (t *ftensor) put(off int, src []float32) {
	if t.f32 != nil {
		copy(t.f32.GetData()[off:], src)
		return
	}
	toF16(t.halves()[off:], src)
}

// sameType reports whether t and u hold the same dtype.
func (t *ftensor) sameType(u *ftensor) bool {
	return (t.f32 != nil) == (u.f32 != nil) && (t.f16 != nil) == (u.f16 != nil)
}

// getAt copies the k-th batch entry (len(dst) elements) into dst.
func (t *ftensor) getAt(k int, dst []float32) {
	if t.f32 != nil {
		copy(dst, t.f32.GetData()[k*len(dst):])
		return
	}
	fromF16(dst, t.halves()[k*len(dst):])
}

// setScaled writes src[i]*k into the elements from off on: the same values,
// bit for bit, as scaling into a buffer and copying it in.
func (t *ftensor) setScaled(off int, src []float32, k float32) {
	if t.f32 != nil {
		dst := t.f32.GetData()[off:]
		dst = dst[:len(src)]
		for i, v := range src {
			dst[i] = v * k
		}
		return
	}
	dst := t.halves()[off:]
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = f32ToF16(v * k)
	}
}

// copyFrom copies n elements of src from sOff into t at off, converting
// only when the two dtypes differ.
func (t *ftensor) copyFrom(off int, src *ftensor, sOff, n int) {
	switch {
	case t.f32 != nil && src.f32 != nil:
		copy(t.f32.GetData()[off:off+n], src.f32.GetData()[sOff:])
	case t.f16 != nil && src.f16 != nil:
		copy(t.halves()[off:off+n], src.halves()[sOff:])
	case t.f32 != nil:
		fromF16(t.f32.GetData()[off:off+n], src.halves()[sOff:])
	default:
		toF16(t.halves()[off:off+n], src.f32.GetData()[sOff:])
	}
}

// fill sets every element to v.
func (t *ftensor) fill(v float32) {
	switch {
	case t.sc != nil:
		t.sc.Set(v)
	case t.f32 != nil:
		d := t.f32.GetData()
		for i := range d {
			d[i] = v
		}
	default:
		d, h := t.halves(), f32ToF16(v)
		for i := range d {
			d[i] = h
		}
	}
}

// scale multiplies every element by k in place (rounded back to the
// tensor's dtype).
func (t *ftensor) scale(k float32) {
	switch {
	case t.sc != nil:
		t.sc.Set(t.sc.GetData() * k)
	case t.f32 != nil:
		d := t.f32.GetData()
		for i := range d {
			d[i] *= k
		}
	default:
		d := t.halves()
		for i, h := range d {
			d[i] = f32ToF16(f16ToF32(h) * k)
		}
	}
}

// toF16 converts src into dst[:len(src)].
func toF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = f32ToF16(v)
	}
}

// fromF16 converts src[:len(dst)] into dst.
func fromF16(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, h := range src {
		dst[i] = f16ToF32(h)
	}
}

func (t *ftensor) destroy() {
	if t == nil {
		return
	}
	if t.f32 != nil {
		t.f32.Destroy()
	}
	if t.f16 != nil {
		t.f16.Destroy()
	}
	if t.sc != nil {
		t.sc.Destroy()
	}
}

// f32ToF16 converts to IEEE half precision, rounding to nearest even. The
// half-normal range takes a branch-free path; the rest goes to f32ToF16Slow.
func f32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	a := b & 0x7fffffff
	if a-0x38800000 < 0x47800000-0x38800000 {
		// |f| in [2^-14, 65536): rebias the exponent (127-15 = 112) and
		// round the 13 dropped mantissa bits to nearest even; a carry into
		// the exponent (up to infinity) is still correct.
		a += 0xfff + (a>>13)&1
		return uint16(b>>16)&0x8000 | uint16((a-0x38000000)>>13)
	}
	return f32ToF16Slow(b)
}

// f32ToF16Slow converts the bits of a float32 outside the half-normal
// range: zeros, half subnormals, overflow, infinities and NaN.
func f32ToF16Slow(b uint32) uint16 {
	sign := uint16(b>>16) & 0x8000
	exp := int((b>>23)&0xff) - 127 + 15
	man := b & 0x7fffff
	switch {
	case (b>>23)&0xff == 0xff: // Inf or NaN
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp >= 0x1f:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		man |= 0x800000
		shift := uint(14 - exp)
		h := man >> shift
		rem := man & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(exp)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // may carry into the exponent, which is still correct
	}
	return sign | uint16(h)
}

// f16ToF32 widens an IEEE half; normal halves take a branch-free path.
func f16ToF32(h uint16) float32 {
	if e := h & 0x7c00; e != 0 && e != 0x7c00 {
		return math.Float32frombits(uint32(h&0x8000)<<16 | (uint32(h&0x7fff)+(127-15)<<10)<<13)
	}
	return f16ToF32Slow(h)
}

// f16ToF32Slow widens zeros, subnormals, infinities and NaN.
func f16ToF32Slow(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0 && man == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		e := uint32(127 - 15 + 1)
		for man&0x400 == 0 {
			man <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (man&0x3ff)<<13)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | man<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// component is one ONNX graph of the pipeline on its session.
type component struct {
	name string
	path string
	sess *ort.DynamicAdvancedSession
	ins  []ort.InputOutputInfo
	outs []ort.InputOutputInfo
}

// openComponent reads the graph's signature and creates its session with
// all inputs and the outputs named in want (all when want is empty).
func openComponent(rt *onnx.Runtime, name, path string, want ...string) (*component, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	ins, outs, err := onnx.ReadSignature(path)
	if err != nil {
		return nil, fmt.Errorf("%s: read signature: %w", name, err)
	}
	c := &component{name: name, path: path, ins: ins}
	if len(want) == 0 {
		c.outs = outs
	} else {
		for _, w := range want {
			o, ok := findIO(outs, w)
			if !ok {
				return nil, fmt.Errorf("%s: the graph has no output %q", name, w)
			}
			c.outs = append(c.outs, o)
		}
	}
	opts, err := rt.SessionOptions()
	if err != nil {
		return nil, fmt.Errorf("%s: session options: %w", name, err)
	}
	defer opts.Destroy()
	c.sess, err = ort.NewDynamicAdvancedSession(path, ioNames(c.ins), ioNames(c.outs), opts)
	if err != nil {
		return nil, fmt.Errorf("%s: create session: %w", name, err)
	}
	return c, nil
}

func ioNames(infos []ort.InputOutputInfo) []string {
	out := make([]string, len(infos))
	for i, in := range infos {
		out[i] = in.Name
	}
	return out
}

func findIO(infos []ort.InputOutputInfo, name string) (ort.InputOutputInfo, bool) {
	for _, in := range infos {
		if in.Name == name {
			return in, true
		}
	}
	return ort.InputOutputInfo{}, false
}

// input returns the named input's info or an error naming the component.
func (c *component) input(name string) (ort.InputOutputInfo, error) {
	in, ok := findIO(c.ins, name)
	if !ok {
		return in, fmt.Errorf("%s: the graph has no input %q (has %v)", c.name, name, ioNames(c.ins))
	}
	return in, nil
}

// floatType checks that info is a float32 or float16 tensor.
func floatType(c *component, info ort.InputOutputInfo) (ort.TensorElementDataType, error) {
	switch info.DataType {
	case ort.TensorElementDataTypeFloat, ort.TensorElementDataTypeFloat16:
		return info.DataType, nil
	}
	return 0, fmt.Errorf("%s: %s is %s, want float32 or float16", c.name, info.Name, info.DataType)
}

// staticDim is dimension i of info when the graph fixes it, else 0.
func staticDim(info ort.InputOutputInfo, i int) int {
	if i < len(info.Dimensions) && info.Dimensions[i] > 0 {
		return int(info.Dimensions[i])
	}
	return 0
}

// run executes the session; ctx's cancellation terminates the run.
func (c *component) run(ctx context.Context, ro *ort.RunOptions, ins, outs []ort.Value) error {
	err := onnx.RunCancellable(ctx, ro, func() error { return c.sess.RunWithOptions(ins, outs, ro) })
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("%s: run: %w", c.name, err)
	}
	return nil
}

func (c *component) close() error {
	if c == nil || c.sess == nil {
		return nil
	}
	return c.sess.Destroy()
}

// timestepTensor is the UNet's (or ControlNet's) timestep input in its
// dtype: int64, int32, float32 or float16, of shape [] or [batch].
type timestepTensor struct {
	dtype ort.TensorElementDataType
	i64   *ort.Tensor[int64]
	i32   *ort.Tensor[int32]
	s64   *ort.Scalar[int64] // rank-0 int64
	s32   *ort.Scalar[int32] // rank-0 int32
	f     *ftensor
}

func newTimestep(info ort.InputOutputInfo, batch int) (*timestepTensor, error) {
	shape := ort.NewShape(int64(batch))
	if len(info.Dimensions) == 0 {
		shape = ort.NewShape()
		batch = 1
	}
	t := &timestepTensor{dtype: info.DataType}
	var err error
	switch rank0 := len(shape) == 0; {
	case rank0 && info.DataType == ort.TensorElementDataTypeInt64:
		t.s64, err = ort.NewEmptyScalar[int64]()
	case rank0 && info.DataType == ort.TensorElementDataTypeInt32:
		t.s32, err = ort.NewEmptyScalar[int32]()
	case info.DataType == ort.TensorElementDataTypeInt64:
		t.i64, err = ort.NewEmptyTensor[int64](shape)
	case info.DataType == ort.TensorElementDataTypeInt32:
		t.i32, err = ort.NewEmptyTensor[int32](shape)
	case info.DataType == ort.TensorElementDataTypeFloat, info.DataType == ort.TensorElementDataTypeFloat16:
		t.f, err = newFTensor(info.DataType, shape)
	default:
		err = fmt.Errorf("timestep is %s, want int64, int32 or float", info.DataType)
	}
	return t, err
}

// set writes timestep v into every entry.
func (t *timestepTensor) set(v float64) {
	switch {
	case t.s64 != nil:
		t.s64.Set(int64(math.Round(v)))
	case t.s32 != nil:
		t.s32.Set(int32(math.Round(v)))
	case t.i64 != nil:
		d := t.i64.GetData()
		for i := range d {
			d[i] = int64(math.Round(v))
		}
	case t.i32 != nil:
		d := t.i32.GetData()
		for i := range d {
			d[i] = int32(math.Round(v))
		}
	default:
		t.f.fill(float32(v))
	}
}

func (t *timestepTensor) value() ort.Value {
	switch {
	case t.s64 != nil:
		return t.s64
	case t.s32 != nil:
		return t.s32
	case t.i64 != nil:
		return t.i64
	case t.i32 != nil:
		return t.i32
	}
	return t.f.value()
}

func (t *timestepTensor) destroy() {
	switch {
	case t == nil:
	case t.s64 != nil:
		t.s64.Destroy()
	case t.s32 != nil:
		t.s32.Destroy()
	case t.i64 != nil:
		t.i64.Destroy()
	case t.i32 != nil:
		t.i32.Destroy()
	default:
		t.f.destroy()
	}
}

// Package gguf reads the header of GGUF model files (llama.cpp's format):
// the metadata key/values and the tensor table, checked against the file's
// size before anything is allocated, so a truncated, corrupt or hostile
// file is refused with an error and never makes a reader allocate or read
// past the file. Tensor data is not read; llama.cpp maps it.
package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// Magic is the first four bytes of a GGUF file.
const Magic = "GGUF"

// Limits on what a header may declare. Real models have a few dozen keys,
// a few thousand tensors and vocabularies up to ~260k tokens.
const (
	maxKV       = 1 << 16
	maxTensors  = 1 << 20
	maxArray    = 1 << 24
	maxString   = 1 << 26
	maxDims     = 4
	maxNameLen  = 1 << 12
	maxKeyLen   = 1 << 16
	defaultAlig = 32
)

// Value types of metadata.
const (
	TypeUint8   = 0
	TypeInt8    = 1
	TypeUint16  = 2
	TypeInt16   = 3
	TypeUint32  = 4
	TypeInt32   = 5
	TypeFloat32 = 6
	TypeBool    = 7
	TypeString  = 8
	TypeArray   = 9
	TypeUint64  = 10
	TypeInt64   = 11
	TypeFloat64 = 12
)

// Value is one metadata value: a scalar (Int for integer and bool types,
// Float for floats, Str for strings) or an array (Elem is the element
// type; Ints, Floats or Strs holds the elements).
type Value struct {
	Type   uint32
	Elem   uint32
	Int    int64
	Float  float64
	Str    string
	Ints   []int64
	Floats []float64
	Strs   []string
}

// Tensor is one entry of the tensor table.
type Tensor struct {
	Name   string
	Dims   []uint64
	Type   uint32
	Offset uint64 // from the start of the data section
	Size   uint64 // bytes
}

// File is a GGUF header.
type File struct {
	Version   uint32
	KV        map[string]Value
	Keys      []string // in file order
	Tensors   []Tensor
	DataStart int64 // file offset of the data section
	Size      int64 // the file's size
}

// ReadFile reads the header of the GGUF file at path.
func ReadFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return Read(f, st.Size())
}

// reader reads little-endian values and never past size bytes.
type reader struct {
	r    *bufio.Reader
	off  int64
	size int64
}

var errTruncated = errors.New("gguf: the file ends inside its header (truncated?)")

func (r *reader) need(n uint64) error {
	if n > uint64(r.size-r.off) {
		return errTruncated
	}
	return nil
}

func (r *reader) bytes(n uint64) ([]byte, error) {
	if err := r.need(n); err != nil {
		return nil, err
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r.r, b); err != nil {
		return nil, errTruncated
	}
	r.off += int64(n)
	return b, nil
}

func (r *reader) u8() (uint8, error) {
	b, err := r.bytes(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (r *reader) u16() (uint16, error) {
	b, err := r.bytes(2)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(b), nil
}

func (r *reader) u32() (uint32, error) {
	b, err := r.bytes(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (r *reader) u64() (uint64, error) {
	b, err := r.bytes(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

func (r *reader) str(limit uint64) (string, error) {
	n, err := r.u64()
	if err != nil {
		return "", err
	}
	if n > limit {
		return "", fmt.Errorf("gguf: a string of %d bytes (limit %d)", n, limit)
	}
	b, err := r.bytes(n)
	return string(b), err
}

// scalarSize is the encoded size of a scalar type (0: not fixed-size).
func scalarSize(t uint32) uint64 {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// scalar reads one fixed-size value of type t as an integer or float.
func (r *reader) scalar(t uint32) (int64, float64, error) {
	switch t {
	case TypeUint8, TypeBool:
		v, err := r.u8()
		return int64(v), 0, err
	case TypeInt8:
		v, err := r.u8()
		return int64(int8(v)), 0, err
	case TypeUint16:
		v, err := r.u16()
		return int64(v), 0, err
	case TypeInt16:
		v, err := r.u16()
		return int64(int16(v)), 0, err
	case TypeUint32:
		v, err := r.u32()
		return int64(v), 0, err
	case TypeInt32:
		v, err := r.u32()
		return int64(int32(v)), 0, err
	case TypeFloat32:
		v, err := r.u32()
		return 0, float64(math.Float32frombits(v)), err
	case TypeUint64:
		v, err := r.u64()
		if v > math.MaxInt64 {
			return 0, 0, fmt.Errorf("gguf: uint64 value %d too large", v)
		}
		return int64(v), 0, err
	case TypeInt64:
		v, err := r.u64()
		return int64(v), 0, err
	case TypeFloat64:
		v, err := r.u64()
		return 0, math.Float64frombits(v), err
	}
	return 0, 0, fmt.Errorf("gguf: unknown value type %d", t)
}

func isFloat(t uint32) bool { return t == TypeFloat32 || t == TypeFloat64 }

func (r *reader) value(t uint32) (Value, error) {
	v := Value{Type: t}
	switch {
	case t == TypeString:
		s, err := r.str(maxString)
		v.Str = s
		return v, err
	case t == TypeArray:
		et, err := r.u32()
		if err != nil {
			return v, err
		}
		n, err := r.u64()
		if err != nil {
			return v, err
		}
		v.Elem = et
		if n > maxArray {
			return v, fmt.Errorf("gguf: an array of %d elements (limit %d)", n, maxArray)
		}
		switch {
		case et == TypeString:
			// Every string takes at least its 8-byte length.
			if err := r.need(n * 8); err != nil {
				return v, err
			}
			v.Strs = make([]string, n)
			for i := range v.Strs {
				if v.Strs[i], err = r.str(maxString); err != nil {
					return v, err
				}
			}
		case scalarSize(et) > 0:
			if err := r.need(n * scalarSize(et)); err != nil {
				return v, err
			}
			if isFloat(et) {
				v.Floats = make([]float64, n)
			} else {
				v.Ints = make([]int64, n)
			}
			for i := range n {
				iv, fv, err := r.scalar(et)
				if err != nil {
					return v, err
				}
				if isFloat(et) {
					v.Floats[i] = fv
				} else {
					v.Ints[i] = iv
				}
			}
		default:
			return v, fmt.Errorf("gguf: arrays of type %d are not supported", et)
		}
		return v, nil
	default:
		iv, fv, err := r.scalar(t)
		v.Int, v.Float = iv, fv
		return v, err
	}
}

// Read parses the header of a GGUF file of size bytes from r and checks
// every tensor lies within the file.
func Read(r io.Reader, size int64) (*File, error) {
	rd := &reader{r: bufio.NewReaderSize(r, 1<<16), size: size}
	magic, err := rd.bytes(4)
	if err != nil {
		return nil, errors.New("gguf: not a GGUF file (shorter than its magic)")
	}
	if string(magic) != Magic {
		return nil, fmt.Errorf("gguf: not a GGUF file (magic %q, want %q)", magic, Magic)
	}
	f := &File{KV: map[string]Value{}, Size: size}
	if f.Version, err = rd.u32(); err != nil {
		return nil, err
	}
	if f.Version != 2 && f.Version != 3 {
		return nil, fmt.Errorf("gguf: version %d is not supported (2 or 3)", f.Version)
	}
	nt, err := rd.u64()
	if err != nil {
		return nil, err
	}
	nkv, err := rd.u64()
	if err != nil {
		return nil, err
	}
	if nt > maxTensors {
		return nil, fmt.Errorf("gguf: the header declares %d tensors (limit %d)", nt, maxTensors)
	}
	if nkv > maxKV {
		return nil, fmt.Errorf("gguf: the header declares %d metadata keys (limit %d)", nkv, maxKV)
	}
	// A key takes at least 12 bytes (length, type), a tensor entry 24.
	if err := rd.need(nkv*12 + nt*24); err != nil {
		return nil, fmt.Errorf("gguf: %d keys and %d tensors cannot fit in a %d-byte file (truncated?)", nkv, nt, size)
	}
	for range nkv {
		k, err := rd.str(maxKeyLen)
		if err != nil {
			return nil, err
		}
		t, err := rd.u32()
		if err != nil {
			return nil, err
		}
		v, err := rd.value(t)
		if err != nil {
			return nil, fmt.Errorf("%w (key %q)", err, k)
		}
		if _, dup := f.KV[k]; dup {
			return nil, fmt.Errorf("gguf: key %q appears twice", k)
		}
		f.KV[k] = v
		f.Keys = append(f.Keys, k)
	}
	align := uint64(defaultAlig)
	if v, ok := f.KV["general.alignment"]; ok {
		if v.Type != TypeUint32 || v.Int == 0 || v.Int&(v.Int-1) != 0 || v.Int > 1<<16 {
			return nil, fmt.Errorf("gguf: general.alignment must be a power of two uint32")
		}
		align = uint64(v.Int)
	}
	f.Tensors = make([]Tensor, 0, nt)
	names := make(map[string]bool, nt)
	for range nt {
		var t Tensor
		if t.Name, err = rd.str(maxNameLen); err != nil {
			return nil, err
		}
		nd, err := rd.u32()
		if err != nil {
			return nil, err
		}
		if nd == 0 || nd > maxDims {
			return nil, fmt.Errorf("gguf: tensor %q has %d dimensions (1 to %d)", t.Name, nd, maxDims)
		}
		elems := uint64(1)
		for range nd {
			d, err := rd.u64()
			if err != nil {
				return nil, err
			}
			if d == 0 || d > 1<<40 || elems > math.MaxUint64/d {
				return nil, fmt.Errorf("gguf: tensor %q has an absurd dimension %d", t.Name, d)
			}
			elems *= d
			t.Dims = append(t.Dims, d)
		}
		if t.Type, err = rd.u32(); err != nil {
			return nil, err
		}
		if t.Offset, err = rd.u64(); err != nil {
			return nil, err
		}
		blk, bytes, ok := TypeBlock(t.Type)
		if !ok {
			return nil, fmt.Errorf("gguf: tensor %q has unknown type %d", t.Name, t.Type)
		}
		if t.Dims[0]%blk != 0 {
			return nil, fmt.Errorf("gguf: tensor %q: %d columns are not whole blocks of %d", t.Name, t.Dims[0], blk)
		}
		if elems/blk > math.MaxUint64/bytes {
			return nil, fmt.Errorf("gguf: tensor %q is absurdly large", t.Name)
		}
		t.Size = elems / blk * bytes
		if t.Offset%align != 0 {
			return nil, fmt.Errorf("gguf: tensor %q is not aligned to %d bytes", t.Name, align)
		}
		if names[t.Name] {
			return nil, fmt.Errorf("gguf: tensor %q appears twice", t.Name)
		}
		names[t.Name] = true
		f.Tensors = append(f.Tensors, t)
	}
	f.DataStart = int64((uint64(rd.off) + align - 1) / align * align)
	for _, t := range f.Tensors {
		if t.Offset > uint64(size) || t.Size > uint64(size) || uint64(f.DataStart)+t.Offset+t.Size > uint64(size) {
			return nil, fmt.Errorf("gguf: tensor %q (%d bytes at %d) lies past the end of the %d-byte file (truncated?)", t.Name, t.Size, t.Offset, size)
		}
	}
	return f, nil
}

// TypeBlock returns the block size in elements and bytes of a ggml tensor
// type, and whether the type is known.
func TypeBlock(t uint32) (elems, bytes uint64, ok bool) {
	switch t {
	case 0: // F32
		return 1, 4, true
	case 1, 30: // F16, BF16
		return 1, 2, true
	case 2: // Q4_0
		return 32, 18, true
	case 3: // Q4_1
		return 32, 20, true
	case 6: // Q5_0
		return 32, 22, true
	case 7: // Q5_1
		return 32, 24, true
	case 8: // Q8_0
		return 32, 34, true
	case 9: // Q8_1
		return 32, 36, true
	case 10: // Q2_K
		return 256, 84, true
	case 11: // Q3_K
		return 256, 110, true
	case 12: // Q4_K
		return 256, 144, true
	case 13: // Q5_K
		return 256, 176, true
	case 14: // Q6_K
		return 256, 210, true
	case 15: // Q8_K
		return 256, 292, true
	case 16: // IQ2_XXS
		return 256, 66, true
	case 17: // IQ2_XS
		return 256, 74, true
	case 18: // IQ3_XXS
		return 256, 98, true
	case 19: // IQ1_S
		return 256, 50, true
	case 20: // IQ4_NL
		return 32, 18, true
	case 21: // IQ3_S
		return 256, 110, true
	case 22: // IQ2_S
		return 256, 82, true
	case 23: // IQ4_XS
		return 256, 136, true
	case 24: // I8
		return 1, 1, true
	case 25: // I16
		return 1, 2, true
	case 26: // I32
		return 1, 4, true
	case 27, 28: // I64, F64
		return 1, 8, true
	case 29: // IQ1_M
		return 256, 56, true
	case 34: // TQ1_0
		return 256, 54, true
	case 35: // TQ2_0
		return 256, 66, true
	case 39: // MXFP4
		return 32, 17, true
	}
	return 0, 0, false
}

// String returns a string value of key ("" when absent or not a string).
func (f *File) String(key string) string {
	if v, ok := f.KV[key]; ok && v.Type == TypeString {
		return v.Str
	}
	return ""
}

// Int returns an integer value of key and whether it is there.
func (f *File) Int(key string) (int64, bool) {
	v, ok := f.KV[key]
	if !ok || v.Type == TypeString || v.Type == TypeArray || isFloat(v.Type) {
		return 0, false
	}
	return v.Int, true
}

// Architecture is general.architecture.
func (f *File) Architecture() string { return f.String("general.architecture") }

// Architectures the gguf engine serves: decoder-only chat models and
// encoder embedding models whose graphs llama.cpp builds.
func supportedArch(a string) bool {
	switch a {
	case "llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "mistral3", "granite", "olmo2", "smollm3",
		"bert", "nomic-bert", "jina-bert-v2":
		return true
	}
	return false
}

// Check refuses files the engine cannot serve: an architecture outside
// the supported list, no tensors, or no tokenizer vocabulary.
func (f *File) Check() error {
	a := f.Architecture()
	if a == "" {
		return errors.New("gguf: general.architecture is missing")
	}
	if !supportedArch(a) {
		return fmt.Errorf("gguf: architecture %q is not supported", a)
	}
	if len(f.Tensors) == 0 {
		return errors.New("gguf: the file has no tensors")
	}
	if v, ok := f.KV["tokenizer.ggml.tokens"]; !ok || len(v.Strs) == 0 {
		return errors.New("gguf: the file has no tokenizer (tokenizer.ggml.tokens)")
	}
	return nil
}

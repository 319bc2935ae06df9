package gguf

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// builder writes GGUF headers for tests.
type builder struct{ bytes.Buffer }

func (b *builder) u32(v uint32) { binary.Write(&b.Buffer, binary.LittleEndian, v) }
func (b *builder) u64(v uint64) { binary.Write(&b.Buffer, binary.LittleEndian, v) }
func (b *builder) str(s string) { b.u64(uint64(len(s))); b.WriteString(s) }
func (b *builder) kvStr(k, v string) {
	b.str(k)
	b.u32(TypeString)
	b.str(v)
}

// small returns a valid GGUF with one 8-float F32 tensor, architecture
// arch, and a one-token vocabulary.
func small(arch string) []byte {
	var b builder
	b.WriteString("GGUF")
	b.u32(3)
	b.u64(1) // tensors
	b.u64(2) // keys
	b.kvStr("general.architecture", arch)
	b.str("tokenizer.ggml.tokens")
	b.u32(TypeArray)
	b.u32(TypeString)
	b.u64(1)
	b.str("a")
	b.str("w")
	b.u32(1)
	b.u64(8)
	b.u32(0) // F32
	b.u64(0)
	for b.Len()%32 != 0 {
		b.WriteByte(0)
	}
	b.Write(make([]byte, 32))
	return b.Bytes()
}

func read(data []byte) (*File, error) { return Read(bytes.NewReader(data), int64(len(data))) }

func TestReadSmall(t *testing.T) {
	f, err := read(small("llama"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Architecture() != "llama" || len(f.Tensors) != 1 || f.Tensors[0].Size != 32 || f.DataStart != int64(len(small("llama"))-32) {
		t.Fatalf("read %+v", f)
	}
	if err := f.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestBadFiles: every kind of broken file is refused with an error saying
// what is wrong.
func TestBadFiles(t *testing.T) {
	good := small("llama")
	absurdTensors := bytes.Clone(good)
	binary.LittleEndian.PutUint64(absurdTensors[8:], 1<<40)
	manyTensors := bytes.Clone(good)
	binary.LittleEndian.PutUint64(manyTensors[8:], 1<<19)
	hugeString := bytes.Clone(good)
	binary.LittleEndian.PutUint64(hugeString[24:], 1<<62)
	bigDim := bytes.Clone(good)
	i := bytes.Index(bigDim, []byte("w")) + 1 + 4
	binary.LittleEndian.PutUint64(bigDim[i:], 1<<39)
	badType := bytes.Clone(good)
	binary.LittleEndian.PutUint32(badType[i+8:], 99)
	cases := []struct {
		name string
		data []byte
		want string
		arch bool // the header reads; Check refuses it
	}{
		{"empty", nil, "not a GGUF file", false},
		{"wrong magic", append([]byte("GGML"), good[4:]...), "magic", false},
		{"truncated header", good[:40], "truncated", false},
		{"truncated data", good[:len(good)-1], "past the end", false},
		{"absurd tensor count", absurdTensors, "tensors", false},
		{"tensor count beyond the file", manyTensors, "cannot fit", false},
		{"absurd string length", hugeString, "string", false},
		{"absurd tensor size", bigDim, "past the end", false},
		{"unknown tensor type", badType, "unknown type", false},
		{"version 1", append(append([]byte("GGUF"), 1, 0, 0, 0), good[8:]...), "version", false},
		{"unsupported architecture", small("rwkv9"), "architecture \"rwkv9\" is not supported", true},
	}
	for _, c := range cases {
		f, err := read(c.data)
		if c.arch {
			if err != nil {
				t.Fatalf("%s: header: %v", c.name, err)
			}
			err = f.Check()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// FuzzRead: no input makes Read panic, allocate beyond limits or accept
// a tensor outside the file.
func FuzzRead(f *testing.F) {
	f.Add(small("llama"))
	f.Add(small("qwen2")[:50])
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := read(data)
		if err != nil {
			return
		}
		for _, tn := range g.Tensors {
			if uint64(g.DataStart)+tn.Offset+tn.Size > uint64(len(data)) {
				t.Fatalf("tensor %q outside the file", tn.Name)
			}
		}
		_ = g.Check()
		_, _, _ = g.Tokenizer()
	})
}

package onnx

import (
	"fmt"
	"path/filepath"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/infermesh/infermesh/node/engine"
	"github.com/infermesh/infermesh/node/engine/tokenizer"
)

// The sparse-input encoders (TensorFlow's Universal Sentence Encoder lite,
// converted by scripts/tfjs2onnx.py) take a batch as a sparse matrix of
// piece ids: indices [N, 2] int64 holds (row, position) pairs and values [N]
// int64 the ids, row-major. They pool inside the model and return one
// L2-normalised [batch, hidden] float vector per row.
const (
	sparseIndices = "indices"
	sparseValues  = "values"
)

// textEncoder is what the embedder needs of a tokenizer: a Hugging Face
// tokenizer.json (*tokenizer.Tokenizer) or a piece vocabulary
// (*tokenizer.PieceTokenizer).
type textEncoder interface {
	Encode(text string, maxTokens int) (tokenizer.Encoding, error)
	VocabSize() int
	SpecialTokens() int
	TokenToID(token string) (int64, bool)
}

// loadTextEncoder reads spec.Files["tokenizer"] (tokenizer.json) or
// spec.Files["vocab"] (a [piece, score] array), exactly one of them.
func loadTextEncoder(spec engine.Spec) (textEncoder, error) {
	tj, vocab := spec.Files["tokenizer"], spec.Files["vocab"]
	switch {
	case spec.Files["model"] == "" || (tj == "") == (vocab == ""):
		return nil, fmt.Errorf("spec needs files \"model\" and one of \"tokenizer\" or \"vocab\"")
	case vocab != "":
		return tokenizer.LoadPieceVocab(filepath.Join(spec.Dir, vocab))
	}
	return tokenizer.Load(filepath.Join(spec.Dir, tj))
}

// isSparseSignature reports whether the model's inputs are exactly the
// sparse pair.
func isSparseSignature(ins []ort.InputOutputInfo) bool {
	if len(ins) != 2 {
		return false
	}
	names := map[string]bool{ins[0].Name: true, ins[1].Name: true}
	return names[sparseIndices] && names[sparseValues]
}

// openSparseSession checks the sparse model's signature and creates the
// session; the vocabulary must be a piece vocabulary.
func (e *embedder) openSparseSession(r *Runtime, path string, ins []ort.InputOutputInfo, outs []ort.InputOutputInfo, dimsOption string) error {
	if _, ok := e.tok.(*tokenizer.PieceTokenizer); !ok {
		return fmt.Errorf("sparse (indices, values) model %s needs files.vocab, a piece vocabulary", path)
	}
	for _, in := range ins {
		if in.DataType != ort.TensorElementDataTypeInt64 {
			return fmt.Errorf("model input %q is %s, want int64", in.Name, in.DataType)
		}
	}
	if len(outs) != 1 || outs[0].DataType != ort.TensorElementDataTypeFloat || len(outs[0].Dimensions) != 2 {
		return fmt.Errorf("sparse model %s must have one float [batch, hidden] output", path)
	}
	if err := e.setHidden(outs[0], 1, dimsOption); err != nil {
		return err
	}
	e.sparse = true
	e.inputs = []string{sparseIndices, sparseValues}
	return e.createSession(r, path, outs[0].Name)
}

// inferSparse runs seqs (none empty) as one sparse batch and returns one
// vector per sequence.
func (e *embedder) inferSparse(seqs []sequence) ([][]float32, error) {
	total := 0
	for _, q := range seqs {
		total += len(q.ids)
	}
	indices := make([]int64, 0, 2*total)
	values := make([]int64, 0, total)
	for i, q := range seqs {
		for j, id := range q.ids {
			indices = append(indices, int64(i), int64(j))
			values = append(values, id)
		}
	}
	it, err := ort.NewTensor(ort.NewShape(int64(total), 2), indices)
	if err != nil {
		return nil, fmt.Errorf("onnx: %s: input tensor: %w", e.id, err)
	}
	defer it.Destroy()
	vt, err := ort.NewTensor(ort.NewShape(int64(total)), values)
	if err != nil {
		return nil, fmt.Errorf("onnx: %s: input tensor: %w", e.id, err)
	}
	defer vt.Destroy()
	n, h := len(seqs), e.hidden
	flat := make([]float32, n*h)
	out, err := ort.NewTensor(ort.NewShape(int64(n), int64(h)), flat)
	if err != nil {
		return nil, fmt.Errorf("onnx: %s: output tensor: %w", e.id, err)
	}
	defer out.Destroy()
	if err := e.run([]ort.Value{it, vt}, out); err != nil {
		return nil, err
	}
	vecs := make([][]float32, n)
	for i := range vecs {
		vecs[i] = flat[i*h : (i+1)*h : (i+1)*h]
	}
	return vecs, nil
}

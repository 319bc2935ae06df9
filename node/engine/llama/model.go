package llama

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Model is a loaded GGUF model (weights mmap'd by llama.cpp).
type Model struct {
	lib   *Lib
	m     unsafe.Pointer
	vocab unsafe.Pointer
	nVoc  int
	nEmbd int
}

// LoadModel loads the GGUF file at path with the library's default model
// parameters (CPU, weights mmap'd).
func (l *Lib) LoadModel(path string) (*Model, error) {
	if !l.open() {
		return nil, errClosed
	}
	p := l.modelParams()
	cp := p.cbytes()
	defer C.free(cp)
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	m := C.lm_model_load(l.api, cpath, cp)
	if m == nil {
		return nil, fmt.Errorf("llama: llama.cpp could not load %s (its log above says why)", path)
	}
	l.hold()
	mod := &Model{lib: l, m: m}
	mod.vocab = unsafe.Pointer(C.lm_vocab(l.api, m))
	mod.nVoc = int(C.lm_n_vocab(l.api, mod.vocab))
	mod.nEmbd = int(C.lm_n_embd(l.api, m))
	return mod, nil
}

// Free releases the model. Contexts made from it must be freed first.
func (m *Model) Free() {
	if m.m != nil {
		C.lm_model_free(m.lib.api, m.m)
		m.m = nil
		m.lib.release()
	}
}

// VocabSize is the number of tokens (rows of the logits).
func (m *Model) VocabSize() int { return m.nVoc }

// EmbeddingSize is the model's hidden size.
func (m *Model) EmbeddingSize() int { return m.nEmbd }

// Tokenize runs llama.cpp's own tokenizer (llama_tokenize) over text:
// addSpecial adds BOS/EOS as the model's metadata asks, parseSpecial
// reads control tokens written in the text as such.
func (m *Model) Tokenize(text string, addSpecial, parseSpecial bool) ([]int32, error) {
	ctext := C.CString(text)
	defer C.free(unsafe.Pointer(ctext))
	n := len(text) + 8
	for range 2 {
		buf := (*C.int32_t)(C.malloc(C.size_t(4 * n)))
		got := int(C.lm_tokenize(m.lib.api, m.vocab, ctext, C.int32_t(len(text)), buf, C.int32_t(n), C.bool(addSpecial), C.bool(parseSpecial)))
		if got >= 0 {
			out := make([]int32, got)
			copy(out, unsafe.Slice((*int32)(unsafe.Pointer(buf)), got))
			C.free(unsafe.Pointer(buf))
			return out, nil
		}
		C.free(unsafe.Pointer(buf))
		n = -got
	}
	return nil, fmt.Errorf("llama: tokenize: output size changed between calls")
}

// Piece returns the bytes of one token (llama_token_to_piece), special
// tokens rendered as their text when special is true.
func (m *Model) Piece(id int32, special bool) []byte {
	var buf [256]byte
	n := int(C.lm_piece(m.lib.api, m.vocab, C.int32_t(id), (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf)), C.bool(special)))
	if n < 0 {
		big := make([]byte, -n)
		n = int(C.lm_piece(m.lib.api, m.vocab, C.int32_t(id), (*C.char)(unsafe.Pointer(&big[0])), C.int32_t(len(big)), C.bool(special)))
		if n < 0 {
			return nil
		}
		return big[:n]
	}
	return append([]byte(nil), buf[:n]...)
}

// Quantize writes src quantised to ftype (a llama_ftype: 2 Q4_0, 7 Q8_0,
// 15 Q4_K_M, ...) into dst with llama_model_quantize.
func (l *Lib) Quantize(src, dst string, ftype, threads int) error {
	if !l.open() {
		return errClosed
	}
	p := l.quantParams()
	p.setInt("ftype", int32(ftype))
	p.setInt("nthread", int32(threads))
	cp := p.cbytes()
	defer C.free(cp)
	csrc, cdst := C.CString(src), C.CString(dst)
	defer C.free(unsafe.Pointer(csrc))
	defer C.free(unsafe.Pointer(cdst))
	if rc := C.lm_quantize(l.api, csrc, cdst, cp); rc != 0 {
		return fmt.Errorf("llama: quantize %s to type %d failed (%d)", src, ftype, rc)
	}
	return nil
}

// FileTypes maps GGUF file type names to llama_ftype values, for Quantize.
func FileTypes() map[string]int {
	return map[string]int{"f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k_s": 11,
		"q3_k_m": 12, "q3_k_l": 13, "q4_k_s": 14, "q4_k_m": 15, "q5_k_s": 16, "q5_k_m": 17, "q6_k": 18}
}

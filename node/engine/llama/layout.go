package llama

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unsafe"
)

// The by-value structs, as the shipped build lays them out. They are
// never declared field by field: each is a block the library's own
// *_default_params() fills, in which this package writes only the fields
// listed here. The shipped build differs from the public header of the
// nearest llama.cpp release: its llama_context_params has a 4-byte field
// more at offset 24 (n_threads is at 28, not 24) and 8 bytes more at the
// end (160 bytes, not 152); its llama_model_params is 80 bytes.
const (
	ctxParamsSize   = 160
	modelParamsSize = 80
	tpParamsSize    = 528
	quantParamsSize = 64
)

// field is one struct member this package reads or writes: its offset,
// its size in bytes (1: bool, 4: int32/uint32/enum/float) and the value
// the library's defaults put there (want), by which Open recognises it.
type field struct {
	name string
	off  int
	size int
	want int64
}

// layout holds the offsets of the fields written; checkLayout fills it
// only when every one holds its expected default.
type layout struct {
	ctx   map[string]field
	tp    map[string]field
	quant map[string]field
}

// ctxFields are the llama_context_params members used, with their
// defaults (llama_context_default_params).
func ctxFields() []field {
	return []field{
		{"n_ctx", 0, 4, 512},
		{"n_batch", 4, 4, 2048},
		{"n_ubatch", 8, 4, 512},
		{"n_seq_max", 12, 4, 1},
		{"n_threads", 28, 4, 4},       // GGML_DEFAULT_N_THREADS
		{"n_threads_batch", 32, 4, 4}, // GGML_DEFAULT_N_THREADS
		{"pooling_type", 44, 4, -1},   // LLAMA_POOLING_TYPE_UNSPECIFIED
		{"attention_type", 48, 4, -1}, // LLAMA_ATTENTION_TYPE_UNSPECIFIED
		{"flash_attn_type", 52, 4, -1},
		{"type_k", 104, 4, 1}, // GGML_TYPE_F16
		{"type_v", 108, 4, 1},
		{"embeddings", 128, 1, 0},
		{"offload_kqv", 129, 1, 1},
		{"no_perf", 130, 1, 1},
		{"op_offload", 131, 1, 1},
		{"swa_full", 132, 1, 1},
		{"kv_unified", 133, 1, 0},
	}
}

// tpFields are ggml_threadpool_params members (after a 512-byte CPU
// mask), checked on ggml_threadpool_params_default(3).
func tpFields() []field {
	return []field{
		{"n_threads", 512, 4, 3},
		{"prio", 516, 4, 0},
		{"poll", 520, 4, 50},
		{"strict_cpu", 524, 1, 0},
		{"paused", 525, 1, 0},
	}
}

// quantFields are llama_model_quantize_params members used.
func quantFields() []field {
	return []field{
		{"nthread", 0, 4, 0},
		{"ftype", 4, 4, 7}, // LLAMA_FTYPE_MOSTLY_Q8_0
	}
}

// sretExtent calls fill twice on buffers pre-set to two patterns and
// returns the buffer and the number of bytes up to the last one written.
func sretExtent(fill func(p unsafe.Pointer)) ([]byte, int) {
	const n = 1024
	var last int
	var out []byte
	for _, pat := range []byte{0xAA, 0x55} {
		buf := C.malloc(n)
		b := unsafe.Slice((*byte)(buf), n)
		for i := range b {
			b[i] = pat
		}
		fill(buf)
		for i := n - 1; i >= 0; i-- {
			if b[i] != pat {
				last = max(last, i+1)
				break
			}
		}
		if out == nil {
			out = bytes.Clone(b)
		}
		C.free(buf)
	}
	return out, last
}

// checkStruct compares a default-filled block with fields and the size.
func checkStruct(name string, b []byte, extent, size int, fields []field) (map[string]field, error) {
	if extent > size || extent <= size-8 {
		return nil, fmt.Errorf("%s: the library writes %d bytes, want a %d-byte struct", name, extent, size)
	}
	m := make(map[string]field, len(fields))
	for _, f := range fields {
		got := readField(b, f)
		if got != f.want {
			return nil, fmt.Errorf("%s.%s: at offset %d the library's default is %d, want %d (the struct layout differs)", name, f.name, f.off, got, f.want)
		}
		m[f.name] = f
	}
	return m, nil
}

func readField(b []byte, f field) int64 {
	switch f.size {
	case 1:
		return int64(b[f.off])
	default:
		return int64(int32(binary.LittleEndian.Uint32(b[f.off:])))
	}
}

// checkLayout reads every by-value struct's defaults from the library and
// checks the fields this package writes.
func (l *Lib) checkLayout() (layout, error) {
	var lay layout
	var err error
	b, n := sretExtent(func(p unsafe.Pointer) { C.lm_ctx_default(l.api, p) })
	if lay.ctx, err = checkStruct("llama_context_params", b, n, ctxParamsSize, ctxFields()); err != nil {
		return lay, err
	}
	b, n = sretExtent(func(p unsafe.Pointer) { C.lm_model_default(l.api, p) })
	if _, err = checkStruct("llama_model_params", b, n, modelParamsSize, nil); err != nil {
		return lay, err
	}
	b, n = sretExtent(func(p unsafe.Pointer) { C.lm_tp_default(l.api, p, 3) })
	if lay.tp, err = checkStruct("ggml_threadpool_params", b, n, tpParamsSize, tpFields()); err != nil {
		return lay, err
	}
	b, n = sretExtent(func(p unsafe.Pointer) { C.lm_quant_default(l.api, p) })
	if lay.quant, err = checkStruct("llama_model_quantize_params", b, n, quantParamsSize, quantFields()); err != nil {
		return lay, err
	}
	// llama_batch: llama_batch_get_one(tokens, 7) sets n_tokens and token
	// and leaves the other pointers NULL.
	toks := (*C.int32_t)(C.malloc(4 * 7))
	defer C.free(unsafe.Pointer(toks))
	bt := C.lm_batch_get_one(l.api, toks, 7)
	if bt.n_tokens != 7 || bt.token != toks || bt.embd != nil || bt.pos != nil || bt.n_seq_id != nil || bt.seq_id != nil || bt.logits != nil {
		return lay, fmt.Errorf("llama_batch: llama_batch_get_one did not return {n_tokens, token, NULL...} at the expected offsets")
	}
	return lay, nil
}

// params is a by-value struct block: the library's defaults with fields
// set by name (offsets checked by Open).
type params struct {
	b      []byte
	fields map[string]field
}

func (p *params) setInt(name string, v int32) {
	f, ok := p.fields[name]
	if !ok || f.size != 4 {
		panic("llama: unknown int field " + name)
	}
	binary.LittleEndian.PutUint32(p.b[f.off:], uint32(v))
}

func (p *params) setBool(name string, v bool) {
	f, ok := p.fields[name]
	if !ok || f.size != 1 {
		panic("llama: unknown bool field " + name)
	}
	p.b[f.off] = 0
	if v {
		p.b[f.off] = 1
	}
}

// cbytes copies the block into C memory (freed by the caller).
func (p *params) cbytes() unsafe.Pointer { return C.CBytes(p.b) }

func (l *Lib) ctxParams() *params {
	b, _ := sretExtent(func(p unsafe.Pointer) { C.lm_ctx_default(l.api, p) })
	return &params{b: b[:ctxParamsSize], fields: l.layout.ctx}
}

func (l *Lib) modelParams() *params {
	b, _ := sretExtent(func(p unsafe.Pointer) { C.lm_model_default(l.api, p) })
	return &params{b: b[:modelParamsSize]}
}

func (l *Lib) tpParams(threads int) *params {
	b, _ := sretExtent(func(p unsafe.Pointer) { C.lm_tp_default(l.api, p, C.int(threads)) })
	return &params{b: b[:tpParamsSize], fields: l.layout.tp}
}

func (l *Lib) quantParams() *params {
	b, _ := sretExtent(func(p unsafe.Pointer) { C.lm_quant_default(l.api, p) })
	return &params{b: b[:quantParamsSize], fields: l.layout.quant}
}

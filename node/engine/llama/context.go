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

// Pooling types (llama_pooling_type) for embedding contexts.
const (
	PoolingUnspecified = -1
	PoolingNone        = 0
	PoolingMean        = 1
	PoolingCLS         = 2
	PoolingLast        = 3
)

// ContextConfig sets up a llama_context.
type ContextConfig struct {
	// Context is the total number of KV cells (n_ctx), shared out over
	// Sequences; each sequence gets Context/Sequences positions.
	Context int
	// Sequences is the number of sequence ids (n_seq_max), each with its
	// own KV memory.
	Sequences int
	// Batch is the most tokens one Decode may carry (n_batch = n_ubatch).
	Batch int
	// Threads is the number of compute threads.
	Threads int
	// Poll is how busily idle threads wait for the next graph (ggml's
	// threadpool poll level, 0-100): 0 lets them sleep at once, 50 is
	// llama.cpp's default of spinning a while first.
	Poll int
	// Embeddings makes Decode produce pooled embeddings instead of logits.
	Embeddings bool
	// Pooling is the pooling for Embeddings (Pooling*).
	Pooling int
	// Unified puts every sequence's keys and values in one buffer of
	// Context cells (kv_unified) instead of a stream of Context/Sequences
	// cells per sequence. A decode over several separate streams is
	// split into one pass per run of consecutive sequence ids, so a batch
	// whose sequences are not 0..n-1 in order costs several passes over
	// the weights; a unified buffer always takes one.
	Unified bool
}

// Context is a llama_context with its own thread pool and a reusable
// batch. It is not safe for concurrent use.
type Context struct {
	model *Model
	c     unsafe.Pointer
	tp    unsafe.Pointer
	batch Batch
	nVoc  int
}

// NewContext makes a context for model.
func (m *Model) NewContext(cfg ContextConfig) (*Context, error) {
	if cfg.Sequences < 1 || cfg.Context < cfg.Sequences || cfg.Batch < 1 || cfg.Threads < 1 || cfg.Poll < 0 || cfg.Poll > 100 {
		return nil, fmt.Errorf("llama: bad context config %+v", cfg)
	}
	l := m.lib
	p := l.ctxParams()
	p.setInt("n_ctx", int32(cfg.Context))
	p.setInt("n_batch", int32(cfg.Batch))
	p.setInt("n_ubatch", int32(cfg.Batch))
	p.setInt("n_seq_max", int32(cfg.Sequences))
	p.setInt("n_threads", int32(cfg.Threads))
	p.setInt("n_threads_batch", int32(cfg.Threads))
	p.setBool("embeddings", cfg.Embeddings)
	p.setBool("no_perf", true)
	p.setBool("kv_unified", cfg.Unified)
	if cfg.Embeddings {
		p.setInt("pooling_type", int32(cfg.Pooling))
	}
	cp := p.cbytes()
	defer C.free(cp)
	c := C.lm_init_from_model(l.api, m.m, cp)
	if c == nil {
		return nil, fmt.Errorf("llama: could not create a context (n_ctx %d, %d sequences)", cfg.Context, cfg.Sequences)
	}
	ctx := &Context{model: m, c: c, nVoc: m.nVoc}
	if got := int(C.lm_n_seq_max(l.api, c)); got != cfg.Sequences {
		C.lm_free_ctx(l.api, c)
		return nil, fmt.Errorf("llama: context has %d sequences, asked for %d (params layout?)", got, cfg.Sequences)
	}
	tpp := l.tpParams(cfg.Threads)
	tpp.setInt("poll", int32(cfg.Poll))
	ctp := tpp.cbytes()
	ctx.tp = C.lm_tp_new(l.api, ctp)
	C.free(ctp)
	if ctx.tp == nil {
		C.lm_free_ctx(l.api, c)
		return nil, fmt.Errorf("llama: could not create a thread pool of %d threads", cfg.Threads)
	}
	C.lm_attach(l.api, c, ctx.tp)
	ctx.batch.alloc(cfg.Batch)
	return ctx, nil
}

// Free releases the context, its thread pool and its batch.
func (c *Context) Free() {
	if c.c == nil {
		return
	}
	api := c.model.lib.api
	C.lm_free_ctx(api, c.c)
	C.lm_tp_free(api, c.tp)
	c.batch.free()
	c.c, c.tp = nil, nil
}

// Batch returns the context's batch, emptied.
func (c *Context) Batch() *Batch {
	c.batch.n = 0
	return &c.batch
}

// Decode runs the batch (llama_decode).
func (c *Context) Decode() error {
	if c.c == nil {
		return errClosed
	}
	if c.batch.n == 0 {
		return nil
	}
	c.batch.c.n_tokens = C.int32_t(c.batch.n)
	if rc := C.lm_decode(c.model.lib.api, c.c, &c.batch.c); rc != 0 {
		return fmt.Errorf("llama: llama_decode returned %d", rc)
	}
	return nil
}

// Logits returns the logits of the batch's i-th token (which must have
// been added with logits on). The slice is llama.cpp's and valid until
// the next Decode.
func (c *Context) Logits(i int) []float32 {
	p := C.lm_logits_ith(c.model.lib.api, c.c, C.int32_t(i))
	if p == nil {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(p)), c.nVoc)
}

// SequenceEmbedding returns the pooled embedding of sequence seq after a
// Decode in an embeddings context (valid until the next Decode).
func (c *Context) SequenceEmbedding(seq int) []float32 {
	p := C.lm_embeddings_seq(c.model.lib.api, c.c, C.int32_t(seq))
	if p == nil {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(p)), c.model.nEmbd)
}

// RemoveSequence drops positions [from, to) of seq from the KV memory
// (to < 0: to the end; seq < 0: every sequence).
func (c *Context) RemoveSequence(seq, from, to int) bool {
	return bool(C.lm_seq_rm(c.model.lib.api, c.c, C.int32_t(seq), C.int32_t(from), C.int32_t(to)))
}

// CopySequence makes positions [from, to) of src part of dst too.
func (c *Context) CopySequence(src, dst, from, to int) {
	C.lm_seq_cp(c.model.lib.api, c.c, C.int32_t(src), C.int32_t(dst), C.int32_t(from), C.int32_t(to))
}

// Clear empties the KV memory of every sequence.
func (c *Context) Clear() { C.lm_mem_clear(c.model.lib.api, c.c) }

// Batch is a llama_batch in C memory with one sequence id per token.
type Batch struct {
	c    C.lm_batch
	seqs *C.int32_t // backing of the seq_id pointers
	n    int
	max  int
}

func (b *Batch) alloc(n int) {
	b.max = n
	b.c.token = (*C.int32_t)(C.calloc(C.size_t(n), 4))
	b.c.pos = (*C.int32_t)(C.calloc(C.size_t(n), 4))
	b.c.n_seq_id = (*C.int32_t)(C.calloc(C.size_t(n), 4))
	b.c.seq_id = (**C.int32_t)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(uintptr(0)))))
	b.c.logits = (*C.int8_t)(C.calloc(C.size_t(n), 1))
	b.seqs = (*C.int32_t)(C.calloc(C.size_t(n), 4))
	ptrs := unsafe.Slice(b.c.seq_id, n)
	seqs := unsafe.Slice(b.seqs, n)
	nseq := unsafe.Slice(b.c.n_seq_id, n)
	for i := range ptrs {
		ptrs[i] = &seqs[i]
		nseq[i] = 1
	}
}

func (b *Batch) free() {
	for _, p := range []unsafe.Pointer{unsafe.Pointer(b.c.token), unsafe.Pointer(b.c.pos), unsafe.Pointer(b.c.n_seq_id),
		unsafe.Pointer(b.c.seq_id), unsafe.Pointer(b.c.logits), unsafe.Pointer(b.seqs)} {
		C.free(p)
	}
	b.c = C.lm_batch{}
	b.seqs = nil
}

// Add appends token id at position pos of sequence seq; logits asks for
// its output row. It returns the token's index in the batch.
func (b *Batch) Add(id int32, pos, seq int, logits bool) int {
	i := b.n
	if i >= b.max {
		panic("llama: batch full")
	}
	unsafe.Slice(b.c.token, b.max)[i] = C.int32_t(id)
	unsafe.Slice(b.c.pos, b.max)[i] = C.int32_t(pos)
	unsafe.Slice(b.seqs, b.max)[i] = C.int32_t(seq)
	var o C.int8_t
	if logits {
		o = 1
	}
	unsafe.Slice(b.c.logits, b.max)[i] = o
	b.n++
	return i
}

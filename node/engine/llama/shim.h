// Declarations of the C side of package llama (see lib.go).
#ifndef INFERMESH_LLAMA_SHIM_H
#define INFERMESH_LLAMA_SHIM_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

// By-value blocks of the sizes the shipped build uses (checked by Open
// against what the *_default_params functions write).
typedef struct { uint64_t w[20]; } lm_ctx_params;   // 160 bytes
typedef struct { uint64_t w[10]; } lm_model_params; // 80 bytes
typedef struct { uint64_t w[66]; } lm_tp_params;    // 528 bytes
typedef struct { uint64_t w[8]; } lm_quant_params;  // 64 bytes

typedef struct {
	int32_t n_tokens;
	int32_t *token;
	float *embd;
	int32_t *pos;
	int32_t *n_seq_id;
	int32_t **seq_id;
	int8_t *logits;
} lm_batch;

typedef struct {
	void *h_llama, *h_ggml, *h_base;
	void (*backend_init)(void);
	void (*log_set)(void *cb, void *ud);
	void (*load_all_from_path)(const char *);
	void *(*dev_by_type)(int);
	void *(*dev_backend_reg)(void *);
	void *(*reg_get_proc_address)(void *, const char *);
	void (*ctx_default_sret)(void *out);
	void (*model_default_sret)(void *out);
	void (*quant_default_sret)(void *out);
	void (*tp_default_sret)(void *out, int n);
	lm_batch (*batch_get_one)(int32_t *, int32_t);
	const char *(*version)(void);
	void *(*model_load)(const char *, lm_model_params);
	void (*model_free)(void *);
	uint32_t (*model_quantize)(const char *, const char *, const void *);
	void *(*init_from_model)(void *, lm_ctx_params);
	void (*free_ctx)(void *);
	int32_t (*decode)(void *, lm_batch);
	float *(*get_logits_ith)(void *, int32_t);
	float *(*get_embeddings_seq)(void *, int32_t);
	void *(*get_memory)(void *);
	bool (*memory_seq_rm)(void *, int32_t, int32_t, int32_t);
	void (*memory_seq_cp)(void *, int32_t, int32_t, int32_t, int32_t);
	void (*memory_clear)(void *, bool);
	const void *(*model_get_vocab)(const void *);
	int32_t (*vocab_n_tokens)(const void *);
	int32_t (*model_n_embd)(const void *);
	int32_t (*tokenize)(const void *, const char *, int32_t, int32_t *, int32_t, bool, bool);
	int32_t (*token_to_piece)(const void *, int32_t, char *, int32_t, int32_t, bool);
	void (*attach_threadpool)(void *, void *, void *);
	void *(*threadpool_new)(lm_tp_params *);
	void (*threadpool_free)(void *);
	uint32_t (*n_seq_max)(const void *);
} lm_api;


const char *lm_open(lm_api *a, const char *base, const char *ggml, const char *llama, char **missing);
const char *lm_load_backends(lm_api *a, const char *dir);
void lm_ctx_default(lm_api *a, void *out);
void lm_model_default(lm_api *a, void *out);
void lm_quant_default(lm_api *a, void *out);
void lm_tp_default(lm_api *a, void *out, int n);
lm_batch lm_batch_get_one(lm_api *a, int32_t *t, int32_t n);
const char *lm_version(lm_api *a);
void *lm_model_load(lm_api *a, const char *path, const void *p);
void lm_model_free(lm_api *a, void *m);
uint32_t lm_quantize(lm_api *a, const char *in, const char *out, const void *p);
void *lm_init_from_model(lm_api *a, void *m, const void *p);
void lm_free_ctx(lm_api *a, void *c);
int32_t lm_decode(lm_api *a, void *c, lm_batch *b);
float *lm_logits_ith(lm_api *a, void *c, int32_t i);
float *lm_embeddings_seq(lm_api *a, void *c, int32_t s);
bool lm_seq_rm(lm_api *a, void *c, int32_t s, int32_t p0, int32_t p1);
void lm_seq_cp(lm_api *a, void *c, int32_t s, int32_t d, int32_t p0, int32_t p1);
void lm_mem_clear(lm_api *a, void *c);
const void *lm_vocab(lm_api *a, const void *m);
int32_t lm_n_vocab(lm_api *a, const void *v);
int32_t lm_n_embd(lm_api *a, const void *m);
int32_t lm_tokenize(lm_api *a, const void *v, const char *t, int32_t n, int32_t *out, int32_t max, bool add, bool special);
int32_t lm_piece(lm_api *a, const void *v, int32_t tok, char *buf, int32_t n, bool special);
void *lm_tp_new(lm_api *a, void *p);
void lm_tp_free(lm_api *a, void *tp);
void lm_attach(lm_api *a, void *c, void *tp);
uint32_t lm_n_seq_max(lm_api *a, const void *c);

#endif

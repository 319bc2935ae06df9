// The C side of package llama: dlopen/dlsym of llama.cpp and trampolines
// that call its function pointers (see lib.go).
#include "shim.h"

// lm_log passes llama.cpp's errors on to stderr and drops the rest (model
// loading logs hundreds of lines at info level).
static void lm_log(int level, const char *text, void *ud) {
	if (level == 4) fputs(text, stderr);
}

static void *lm_sym(void *h, const char *name, char **missing) {
	void *p = dlsym(h, name);
	if (!p && !*missing) *missing = (char *)name;
	return p;
}

// lm_open fills a from the libraries in dir; on failure it returns a
// message (or from dlerror) and leaves nothing loaded it needs.
const char *lm_open(lm_api *a, const char *base, const char *ggml, const char *llama, char **missing) {
	a->h_base = dlopen(base, RTLD_NOW | RTLD_GLOBAL);
	if (!a->h_base) return dlerror();
	a->h_ggml = dlopen(ggml, RTLD_NOW | RTLD_GLOBAL);
	if (!a->h_ggml) return dlerror();
	a->h_llama = dlopen(llama, RTLD_NOW | RTLD_LOCAL);
	if (!a->h_llama) return dlerror();
	void *l = a->h_llama, *g = a->h_ggml, *b = a->h_base;
	a->backend_init = lm_sym(l, "llama_backend_init", missing);
	a->log_set = lm_sym(l, "llama_log_set", missing);
	a->load_all_from_path = lm_sym(g, "ggml_backend_load_all_from_path", missing);
	a->dev_by_type = lm_sym(g, "ggml_backend_dev_by_type", missing);
	a->dev_backend_reg = lm_sym(b, "ggml_backend_dev_backend_reg", missing);
	a->reg_get_proc_address = lm_sym(b, "ggml_backend_reg_get_proc_address", missing);
	a->ctx_default_sret = lm_sym(l, "llama_context_default_params", missing);
	a->model_default_sret = lm_sym(l, "llama_model_default_params", missing);
	a->quant_default_sret = lm_sym(l, "llama_model_quantize_default_params", missing);
	a->tp_default_sret = lm_sym(b, "ggml_threadpool_params_default", missing);
	a->batch_get_one = lm_sym(l, "llama_batch_get_one", missing);
	a->version = lm_sym(l, "llama_version", missing);
	a->model_load = lm_sym(l, "llama_model_load_from_file", missing);
	a->model_free = lm_sym(l, "llama_model_free", missing);
	a->model_quantize = lm_sym(l, "llama_model_quantize", missing);
	a->init_from_model = lm_sym(l, "llama_init_from_model", missing);
	a->free_ctx = lm_sym(l, "llama_free", missing);
	a->decode = lm_sym(l, "llama_decode", missing);
	a->get_logits_ith = lm_sym(l, "llama_get_logits_ith", missing);
	a->get_embeddings_seq = lm_sym(l, "llama_get_embeddings_seq", missing);
	a->get_memory = lm_sym(l, "llama_get_memory", missing);
	a->memory_seq_rm = lm_sym(l, "llama_memory_seq_rm", missing);
	a->memory_seq_cp = lm_sym(l, "llama_memory_seq_cp", missing);
	a->memory_clear = lm_sym(l, "llama_memory_clear", missing);
	a->model_get_vocab = lm_sym(l, "llama_model_get_vocab", missing);
	a->vocab_n_tokens = lm_sym(l, "llama_vocab_n_tokens", missing);
	a->model_n_embd = lm_sym(l, "llama_model_n_embd", missing);
	a->tokenize = lm_sym(l, "llama_tokenize", missing);
	a->token_to_piece = lm_sym(l, "llama_token_to_piece", missing);
	a->attach_threadpool = lm_sym(l, "llama_attach_threadpool", missing);
	a->n_seq_max = lm_sym(l, "llama_n_seq_max", missing);
	if (*missing) return "missing symbol";
	a->log_set((void *)lm_log, NULL);
	a->backend_init();
	return NULL;
}

// lm_load_backends loads the CPU backend that fits this machine from dir,
// once per process (the backend registry is the library's own).
const char *lm_load_backends(lm_api *a, const char *dir) {
	if (!a->dev_by_type(0)) a->load_all_from_path(dir);
	void *dev = a->dev_by_type(0);
	if (!dev) return "no CPU backend could be loaded (no libggml-cpu-*.so for this CPU?)";
	void *reg = a->dev_backend_reg(dev);
	a->threadpool_new = reg ? a->reg_get_proc_address(reg, "ggml_threadpool_new") : NULL;
	a->threadpool_free = reg ? a->reg_get_proc_address(reg, "ggml_threadpool_free") : NULL;
	if (!a->threadpool_new || !a->threadpool_free) return "the CPU backend does not export ggml_threadpool_new/free";
	return NULL;
}

void lm_ctx_default(lm_api *a, void *out) { a->ctx_default_sret(out); }
void lm_model_default(lm_api *a, void *out) { a->model_default_sret(out); }
void lm_quant_default(lm_api *a, void *out) { a->quant_default_sret(out); }
void lm_tp_default(lm_api *a, void *out, int n) { a->tp_default_sret(out, n); }
lm_batch lm_batch_get_one(lm_api *a, int32_t *t, int32_t n) { return a->batch_get_one(t, n); }
const char *lm_version(lm_api *a) { return a->version(); }

void *lm_model_load(lm_api *a, const char *path, const void *p) {
	lm_model_params mp; memcpy(&mp, p, sizeof mp);
	return a->model_load(path, mp);
}
void lm_model_free(lm_api *a, void *m) { a->model_free(m); }
uint32_t lm_quantize(lm_api *a, const char *in, const char *out, const void *p) { return a->model_quantize(in, out, p); }
void *lm_init_from_model(lm_api *a, void *m, const void *p) {
	lm_ctx_params cp; memcpy(&cp, p, sizeof cp);
	return a->init_from_model(m, cp);
}
void lm_free_ctx(lm_api *a, void *c) { a->free_ctx(c); }
int32_t lm_decode(lm_api *a, void *c, lm_batch *b) { return a->decode(c, *b); }
float *lm_logits_ith(lm_api *a, void *c, int32_t i) { return a->get_logits_ith(c, i); }
float *lm_embeddings_seq(lm_api *a, void *c, int32_t s) { return a->get_embeddings_seq(c, s); }
bool lm_seq_rm(lm_api *a, void *c, int32_t s, int32_t p0, int32_t p1) { return a->memory_seq_rm(a->get_memory(c), s, p0, p1); }
void lm_seq_cp(lm_api *a, void *c, int32_t s, int32_t d, int32_t p0, int32_t p1) { a->memory_seq_cp(a->get_memory(c), s, d, p0, p1); }
void lm_mem_clear(lm_api *a, void *c) { a->memory_clear(a->get_memory(c), true); }
const void *lm_vocab(lm_api *a, const void *m) { return a->model_get_vocab(m); }
int32_t lm_n_vocab(lm_api *a, const void *v) { return a->vocab_n_tokens(v); }
int32_t lm_n_embd(lm_api *a, const void *m) { return a->model_n_embd(m); }
int32_t lm_tokenize(lm_api *a, const void *v, const char *t, int32_t n, int32_t *out, int32_t max, bool add, bool special) {
	return a->tokenize(v, t, n, out, max, add, special);
}
int32_t lm_piece(lm_api *a, const void *v, int32_t tok, char *buf, int32_t n, bool special) {
	return a->token_to_piece(v, tok, buf, n, 0, special);
}
void *lm_tp_new(lm_api *a, void *p) { return a->threadpool_new((lm_tp_params *)p); }
void lm_tp_free(lm_api *a, void *tp) { a->threadpool_free(tp); }
void lm_attach(lm_api *a, void *c, void *tp) { a->attach_threadpool(c, tp, tp); }
uint32_t lm_n_seq_max(lm_api *a, const void *c) { return a->n_seq_max(c); }

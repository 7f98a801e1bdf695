/* profile.c — see profile.h. The wrappers are generated one per op (see the
 * list in backend.h); each times its call between two synchronisations of the
 * inner backend. A profiled backend is an instance: its counters live in its
 * own context, so two can run side by side. */
#include "backend/profile.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"

enum {
    OP_alloc, OP_alloc_f32, OP_free, OP_upload, OP_download, OP_upload_f32, OP_download_f32, OP_copy, OP_gather_rows, OP_scatter_rows, OP_linear, OP_rmsnorm, OP_rope, OP_kv_store, OP_attention, OP_swiglu, OP_add, OP_embedding, OP_zero, OP_zero_f32, OP_linear_backward, OP_rmsnorm_backward, OP_rope_backward, OP_kv_gather, OP_attention_backward, OP_swiglu_backward, OP_embedding_backward, OP_log_softmax_target, OP_log_softmax_target_backward, OP_adamw, OP_sum_squares, OP_scale, OP_embedding_i32, OP_rope_i32, OP_gather_rows_i32, OP_paged_kv_store, OP_paged_attention, OP_sample, OP_add_rmsnorm, OP_qkv_rope_store, OP_swiglu_gate_up, OP_log_softmax_entropy_backward, OP_log_softmax_shard_entropy_backward, OP_add_scaled, OP_apply_token_bitmask, OP_apply_penalties, OP_COUNT
};
static const char *OP_NAMES[OP_COUNT] = {"alloc", "alloc_f32", "free", "upload", "download", "upload_f32", "download_f32", "copy", "gather_rows", "scatter_rows", "linear", "rmsnorm", "rope", "kv_store", "attention", "swiglu", "add", "embedding", "zero", "zero_f32", "linear_backward", "rmsnorm_backward", "rope_backward", "kv_gather", "attention_backward", "swiglu_backward", "embedding_backward", "log_softmax_target", "log_softmax_target_backward", "adamw", "sum_squares", "scale", "embedding_i32", "rope_i32", "gather_rows_i32", "paged_kv_store", "paged_attention", "sample", "add_rmsnorm", "qkv_rope_store", "swiglu_gate_up", "log_softmax_entropy_backward", "log_softmax_shard_entropy_backward", "add_scaled", "apply_token_bitmask", "apply_penalties"};

typedef struct ProfileContext {
    const Backend *inner;
    double seconds[OP_COUNT];
    long calls[OP_COUNT];
} ProfileContext;

static double op_begin(const ProfileContext *p) {
    if (p->inner->synchronize) p->inner->synchronize(p->inner);
    return time_now();
}

static void op_end(ProfileContext *p, int op, double t0) {
    if (p->inner->synchronize) p->inner->synchronize(p->inner);
    p->seconds[op] += time_now() - t0;
    p->calls[op]++;
}

static void *prof_alloc(const Backend *be, size_t n_elements) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    void *r = prof->inner->alloc(prof->inner, n_elements);
    op_end(prof, OP_alloc, t0);
    return r;
}

static void *prof_alloc_f32(const Backend *be, size_t n_elements) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    void *r = prof->inner->alloc_f32(prof->inner, n_elements);
    op_end(prof, OP_alloc_f32, t0);
    return r;
}

static void prof_free(const Backend *be, void *buf) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->free(prof->inner, buf);
    op_end(prof, OP_free, t0);
}

static void prof_upload(const Backend *be, void *dst, const float *src, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->upload(prof->inner, dst, src, n);
    op_end(prof, OP_upload, t0);
}

static void prof_download(const Backend *be, float *dst, const void *src, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->download(prof->inner, dst, src, n);
    op_end(prof, OP_download, t0);
}

static void prof_upload_f32(const Backend *be, void *dst, const float *src, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->upload_f32(prof->inner, dst, src, n);
    op_end(prof, OP_upload_f32, t0);
}

static void prof_download_f32(const Backend *be, float *dst, const void *src, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->download_f32(prof->inner, dst, src, n);
    op_end(prof, OP_download_f32, t0);
}

static void prof_copy(const Backend *be, void *dst, size_t dst_offset, const void *src, size_t src_offset, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->copy(prof->inner, dst, dst_offset, src, src_offset, n);
    op_end(prof, OP_copy, t0);
}

static void prof_gather_rows(const Backend *be, void *dst, const void *src, const int *rows, int n, int dim) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->gather_rows(prof->inner, dst, src, rows, n, dim);
    op_end(prof, OP_gather_rows, t0);
}

static void prof_scatter_rows(const Backend *be, void *dst, const void *src, const int *rows, int n, int dim) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->scatter_rows(prof->inner, dst, src, rows, n, dim);
    op_end(prof, OP_scatter_rows, t0);
}

static void prof_linear(const Backend *be, void *out, const void *x, const void *w, const void *bias, int n, int in_dim, int out_dim) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->linear(prof->inner, out, x, w, bias, n, in_dim, out_dim);
    op_end(prof, OP_linear, t0);
}

static void prof_rmsnorm(const Backend *be, void *out, const void *x, const void *w, int n, int dim, float eps) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->rmsnorm(prof->inner, out, x, w, n, dim, eps);
    op_end(prof, OP_rmsnorm, t0);
}

static void prof_rope(const Backend *be, void *x, const int *pos, int n, int n_heads, int head_dim, const float *inv_freq) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->rope(prof->inner, x, pos, n, n_heads, head_dim, inv_freq);
    op_end(prof, OP_rope, t0);
}

static void prof_kv_store(const Backend *be, void *k_cache, void *v_cache, const void *k, const void *v, const int *slot, const int *pos, int n, int kv_dim, int max_len) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->kv_store(prof->inner, k_cache, v_cache, k, v, slot, pos, n, kv_dim, max_len);
    op_end(prof, OP_kv_store, t0);
}

static void prof_attention(const Backend *be, void *out, void *lse, const void *q, const void *k_cache, const void *v_cache, const int *slot, const int *pos, int n, int n_heads, int n_kv_heads, int head_dim, int max_len) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->attention(prof->inner, out, lse, q, k_cache, v_cache, slot, pos, n, n_heads, n_kv_heads, head_dim, max_len);
    op_end(prof, OP_attention, t0);
}

static void prof_swiglu(const Backend *be, void *out, const void *gate, const void *up, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->swiglu(prof->inner, out, gate, up, n);
    op_end(prof, OP_swiglu, t0);
}

static void prof_add(const Backend *be, void *out, const void *a, const void *b, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->add(prof->inner, out, a, b, n);
    op_end(prof, OP_add, t0);
}

static void prof_add_scaled(const Backend *be, void *out, const void *a, const void *b, float s, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->add_scaled(prof->inner, out, a, b, s, n);
    op_end(prof, OP_add_scaled, t0);
}

static void prof_embedding(const Backend *be, void *out, const void *table, const int *ids, int n, int dim) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->embedding(prof->inner, out, table, ids, n, dim);
    op_end(prof, OP_embedding, t0);
}

static void prof_zero(const Backend *be, void *x, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->zero(prof->inner, x, n);
    op_end(prof, OP_zero, t0);
}

static void prof_zero_f32(const Backend *be, void *x, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->zero_f32(prof->inner, x, n);
    op_end(prof, OP_zero_f32, t0);
}

static void prof_linear_backward(const Backend *be, void *dx, void *dw, void *db, const void *dy, const void *x, const void *w, int n, int in_dim, int out_dim, int accumulate_dx) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->linear_backward(prof->inner, dx, dw, db, dy, x, w, n, in_dim, out_dim, accumulate_dx);
    op_end(prof, OP_linear_backward, t0);
}

static void prof_rmsnorm_backward(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int n, int dim, float eps) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->rmsnorm_backward(prof->inner, dx, dw, dy, x, w, n, dim, eps);
    op_end(prof, OP_rmsnorm_backward, t0);
}

static void prof_rope_backward(const Backend *be, void *dx, const int *pos, int n, int n_heads, int head_dim, const float *inv_freq) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->rope_backward(prof->inner, dx, pos, n, n_heads, head_dim, inv_freq);
    op_end(prof, OP_rope_backward, t0);
}

static void prof_kv_gather(const Backend *be, void *k, void *v, const void *k_cache, const void *v_cache, const int *slot, const int *pos, int n, int kv_dim, int max_len) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->kv_gather(prof->inner, k, v, k_cache, v_cache, slot, pos, n, kv_dim, max_len);
    op_end(prof, OP_kv_gather, t0);
}

static void prof_attention_backward(const Backend *be, void *dq, void *dk_cache, void *dv_cache, const void *dout, const void *q, const void *out, const void *lse, const void *k_cache, const void *v_cache, const int *slot, const int *pos, int n, int n_heads, int n_kv_heads, int head_dim, int n_slots, int max_len) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->attention_backward(prof->inner, dq, dk_cache, dv_cache, dout, q, out, lse, k_cache, v_cache, slot, pos, n, n_heads, n_kv_heads, head_dim, n_slots, max_len);
    op_end(prof, OP_attention_backward, t0);
}

static void prof_swiglu_backward(const Backend *be, void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->swiglu_backward(prof->inner, dgate, dup, dout, gate, up, n);
    op_end(prof, OP_swiglu_backward, t0);
}

static void prof_embedding_backward(const Backend *be, void *dtable, const void *dout, const int *ids, int n, int dim) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->embedding_backward(prof->inner, dtable, dout, ids, n, dim);
    op_end(prof, OP_embedding_backward, t0);
}

static void prof_log_softmax_target(const Backend *be, void *logprobs, void *entropy, const void *logits, const int *targets, int n, int vocab, float temperature) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->log_softmax_target(prof->inner, logprobs, entropy, logits, targets, n, vocab, temperature);
    op_end(prof, OP_log_softmax_target, t0);
}

static void prof_log_softmax_target_backward(const Backend *be, void *dlogits, const void *logits, const int *targets, const void *dlogprobs, int n, int vocab, float temperature) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->log_softmax_target_backward(prof->inner, dlogits, logits, targets, dlogprobs, n, vocab, temperature);
    op_end(prof, OP_log_softmax_target_backward, t0);
}

static void prof_log_softmax_entropy_backward(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                              const void *dlogprobs, const void *dentropy, int n, int vocab,
                                              float temperature) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->log_softmax_entropy_backward(prof->inner, dlogits, logits, targets, dlogprobs, dentropy, n, vocab,
                                              temperature);
    op_end(prof, OP_log_softmax_entropy_backward, t0);
}

static void prof_log_softmax_shard_entropy_backward(const Backend *be, void *dlogits, const void *logits,
                                                    const int *targets, const void *dlogprobs, const void *dentropy,
                                                    const void *lse, const void *pz, int n, int vocab,
                                                    float temperature) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->log_softmax_shard_entropy_backward(prof->inner, dlogits, logits, targets, dlogprobs, dentropy, lse, pz,
                                                    n, vocab, temperature);
    op_end(prof, OP_log_softmax_shard_entropy_backward, t0);
}

static void prof_adamw(const Backend *be, void *param, void *master, const void *grad, void *m, void *v, size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float bias_correction1, float bias_correction2) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->adamw(prof->inner, param, master, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2);
    op_end(prof, OP_adamw, t0);
}

static double prof_sum_squares(const Backend *be, const void *x, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    double r = prof->inner->sum_squares(prof->inner, x, n);
    op_end(prof, OP_sum_squares, t0);
    return r;
}

static void prof_scale(const Backend *be, void *x, float s, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->scale(prof->inner, x, s, n);
    op_end(prof, OP_scale, t0);
}

static void prof_embedding_i32(const Backend *be, void *out, const void *table, const void *ids, int n, int dim) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->embedding_i32(prof->inner, out, table, ids, n, dim);
    op_end(prof, OP_embedding_i32, t0);
}

static void prof_rope_i32(const Backend *be, void *x, const void *pos, int n, int n_heads, int head_dim, const float *inv_freq) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->rope_i32(prof->inner, x, pos, n, n_heads, head_dim, inv_freq);
    op_end(prof, OP_rope_i32, t0);
}

static void prof_gather_rows_i32(const Backend *be, void *dst, const void *src, const void *rows, int n, int dim) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->gather_rows_i32(prof->inner, dst, src, rows, n, dim);
    op_end(prof, OP_gather_rows_i32, t0);
}

static void prof_paged_kv_store(const Backend *be, void *k_pool, void *v_pool, const void *k, const void *v, const void *slot_mapping, int n, int kv_dim) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->paged_kv_store(prof->inner, k_pool, v_pool, k, v, slot_mapping, n, kv_dim);
    op_end(prof, OP_paged_kv_store, t0);
}

static void prof_paged_attention(const Backend *be, void *out, const void *q, const void *k_pool, const void *v_pool, const void *block_tables, const void *seq, const void *pos, int n, int n_heads, int n_kv_heads, int head_dim, int block_size, int max_blocks) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->paged_attention(prof->inner, out, q, k_pool, v_pool, block_tables, seq, pos, n, n_heads, n_kv_heads, head_dim, block_size, max_blocks);
    op_end(prof, OP_paged_attention, t0);
}

static void prof_sample(const Backend *be, void *tokens, void *logprobs, void *logits, int n, int vocab, const struct SamplingParams *p, const void *seq, const void *streams, const void *counters, void *history, void *history_len, int history_stride) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->sample(prof->inner, tokens, logprobs, logits, n, vocab, p, seq, streams, counters, history, history_len, history_stride);
    op_end(prof, OP_sample, t0);
}

static void prof_apply_penalties(const Backend *be, void *logits, int n, int vocab, const struct SamplingParams *p,
                                 const void *seq, const void *history, const void *history_len, const void *prompt_len,
                                 int history_stride, const void *bias_ids, const void *bias_values,
                                 const void *bias_len, int bias_stride) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->apply_penalties(prof->inner, logits, n, vocab, p, seq, history, history_len, prompt_len,
                                 history_stride, bias_ids, bias_values, bias_len, bias_stride);
    op_end(prof, OP_apply_penalties, t0);
}

static void prof_apply_token_bitmask(const Backend *be, void *logits, const void *bitmask, int n, int vocab) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->apply_token_bitmask(prof->inner, logits, bitmask, n, vocab);
    op_end(prof, OP_apply_token_bitmask, t0);
}

static void prof_add_rmsnorm(const Backend *be, void *x, void *xn, const void *delta, const void *w, int n, int dim, float eps) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->add_rmsnorm(prof->inner, x, xn, delta, w, n, dim, eps);
    op_end(prof, OP_add_rmsnorm, t0);
}

static void prof_qkv_rope_store(const Backend *be, void *q, void *k_pool, void *v_pool, const void *qkv, const void *pos, const void *slot_mapping, int n, int n_heads, int n_kv_heads, int head_dim, const float *inv_freq) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->qkv_rope_store(prof->inner, q, k_pool, v_pool, qkv, pos, slot_mapping, n, n_heads, n_kv_heads, head_dim, inv_freq);
    op_end(prof, OP_qkv_rope_store, t0);
}

static void prof_swiglu_gate_up(const Backend *be, void *out, const void *gate_up, int n, int f) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->swiglu_gate_up(prof->inner, out, gate_up, n, f);
    op_end(prof, OP_swiglu_gate_up, t0);
}

/* Identity and streams are the inner instance's: its ctx, not the wrapper's. */
static void prof_device_id(const Backend *be, char *out, size_t size) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    in->device_id(in, out, size);
}
static void *prof_compute_stream(const Backend *be) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    return in->compute_stream(in);
}
static void *prof_comm_stream(const Backend *be) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    return in->comm_stream(in);
}
static void prof_comm_after_compute(const Backend *be) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    in->comm_after_compute(in);
}
static size_t prof_reserved_bytes(const Backend *be) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    return in->reserved_bytes(in);
}

/* Settings go to the inner instance: its context is the one they change. */
static void prof_set_threads(const Backend *be, int threads) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    in->set_threads(in, threads);
}

Backend *backend_profile_wrap(const Backend *inner) {
    Backend *w = xmalloc(sizeof *w);
    ProfileContext *p = xcalloc(1, sizeof *p);
    p->inner = inner;
    *w = *inner;
    w->name = "profiled";
    w->ctx = p;
    if (inner->set_threads) w->set_threads = prof_set_threads;
    if (inner->device_id) w->device_id = prof_device_id;
    if (inner->compute_stream) w->compute_stream = prof_compute_stream;
    if (inner->comm_stream) w->comm_stream = prof_comm_stream;
    if (inner->comm_after_compute) w->comm_after_compute = prof_comm_after_compute;
    if (inner->reserved_bytes) w->reserved_bytes = prof_reserved_bytes;
    if (inner->alloc) w->alloc = prof_alloc;
    if (inner->alloc_f32) w->alloc_f32 = prof_alloc_f32;
    if (inner->free) w->free = prof_free;
    if (inner->upload) w->upload = prof_upload;
    if (inner->download) w->download = prof_download;
    if (inner->upload_f32) w->upload_f32 = prof_upload_f32;
    if (inner->download_f32) w->download_f32 = prof_download_f32;
    if (inner->copy) w->copy = prof_copy;
    if (inner->gather_rows) w->gather_rows = prof_gather_rows;
    if (inner->scatter_rows) w->scatter_rows = prof_scatter_rows;
    if (inner->linear) w->linear = prof_linear;
    if (inner->rmsnorm) w->rmsnorm = prof_rmsnorm;
    if (inner->rope) w->rope = prof_rope;
    if (inner->kv_store) w->kv_store = prof_kv_store;
    if (inner->attention) w->attention = prof_attention;
    if (inner->swiglu) w->swiglu = prof_swiglu;
    if (inner->add) w->add = prof_add;
    if (inner->add_scaled) w->add_scaled = prof_add_scaled;
    if (inner->embedding) w->embedding = prof_embedding;
    if (inner->zero) w->zero = prof_zero;
    if (inner->zero_f32) w->zero_f32 = prof_zero_f32;
    if (inner->linear_backward) w->linear_backward = prof_linear_backward;
    if (inner->rmsnorm_backward) w->rmsnorm_backward = prof_rmsnorm_backward;
    if (inner->rope_backward) w->rope_backward = prof_rope_backward;
    if (inner->kv_gather) w->kv_gather = prof_kv_gather;
    if (inner->attention_backward) w->attention_backward = prof_attention_backward;
    if (inner->swiglu_backward) w->swiglu_backward = prof_swiglu_backward;
    if (inner->embedding_backward) w->embedding_backward = prof_embedding_backward;
    if (inner->log_softmax_target) w->log_softmax_target = prof_log_softmax_target;
    if (inner->log_softmax_target_backward) w->log_softmax_target_backward = prof_log_softmax_target_backward;
    if (inner->log_softmax_entropy_backward) w->log_softmax_entropy_backward = prof_log_softmax_entropy_backward;
    if (inner->log_softmax_shard_entropy_backward)
        w->log_softmax_shard_entropy_backward = prof_log_softmax_shard_entropy_backward;
    if (inner->adamw) w->adamw = prof_adamw;
    if (inner->sum_squares) w->sum_squares = prof_sum_squares;
    if (inner->scale) w->scale = prof_scale;
    if (inner->embedding_i32) w->embedding_i32 = prof_embedding_i32;
    if (inner->rope_i32) w->rope_i32 = prof_rope_i32;
    if (inner->gather_rows_i32) w->gather_rows_i32 = prof_gather_rows_i32;
    if (inner->paged_kv_store) w->paged_kv_store = prof_paged_kv_store;
    if (inner->paged_attention) w->paged_attention = prof_paged_attention;
    if (inner->sample) w->sample = prof_sample;
    if (inner->apply_token_bitmask) w->apply_token_bitmask = prof_apply_token_bitmask;
    if (inner->apply_penalties) w->apply_penalties = prof_apply_penalties;
    if (inner->add_rmsnorm) w->add_rmsnorm = prof_add_rmsnorm;
    if (inner->qkv_rope_store) w->qkv_rope_store = prof_qkv_rope_store;
    if (inner->swiglu_gate_up) w->swiglu_gate_up = prof_swiglu_gate_up;
    /* Every op synchronises here: nothing can be captured into a graph. */
    w->capture_begin = NULL;
    return w;
}

void backend_profile_free(Backend *profiled) {
    if (!profiled) return;
    free(profiled->ctx);
    free(profiled);
}

void backend_profile_report(const Backend *profiled, FILE *fp) {
    ProfileContext *p = profiled->ctx;
    double total = 0;
    int order[OP_COUNT];
    for (int i = 0; i < OP_COUNT; i++) total += p->seconds[i], order[i] = i;
    for (int i = 0; i < OP_COUNT; i++)  /* a small insertion sort, slowest first */
        for (int j = i; j > 0 && p->seconds[order[j]] > p->seconds[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    fprintf(fp, "| op | calls | ms | share |\n|---|---:|---:|---:|\n");
    for (int k = 0; k < OP_COUNT; k++) {
        int i = order[k];
        if (!p->calls[i]) continue;
        fprintf(fp, "| %s | %ld | %.2f | %.1f%% |\n", OP_NAMES[i], p->calls[i], p->seconds[i] * 1e3,
                total > 0 ? 100.0 * p->seconds[i] / total : 0.0);
    }
    memset(p->seconds, 0, sizeof p->seconds);
    memset(p->calls, 0, sizeof p->calls);
}

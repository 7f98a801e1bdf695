/* profile.c — see profile.h. The wrappers are generated one per op (see the
 * list in backend.h); each times its call between two synchronisations of the
 * inner backend. A profiled backend is an instance: its counters live in its
 * own context, so two can run side by side. */
#include "backend/profile.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"

enum {
    OP_alloc, OP_alloc_f32, OP_free, OP_upload, OP_download, OP_upload_f32, OP_download_f32, OP_copy, OP_gather_rows, OP_scatter_rows, OP_linear, OP_rmsnorm, OP_rope, OP_kv_store, OP_attention, OP_swiglu, OP_add, OP_embedding, OP_zero, OP_zero_f32, OP_linear_backward, OP_rmsnorm_backward, OP_rope_backward, OP_kv_gather, OP_attention_backward, OP_swiglu_backward, OP_embedding_backward, OP_log_softmax_target, OP_log_softmax_target_backward, OP_adamw, OP_sum_squares, OP_scale, OP_embedding_i32, OP_rope_i32, OP_gather_rows_i32, OP_paged_kv_store, OP_paged_attention, OP_sample, OP_add_rmsnorm, OP_qkv_rope_store, OP_swiglu_gate_up, OP_log_softmax_entropy_backward, OP_log_softmax_shard_entropy_backward, OP_add_scaled, OP_apply_token_bitmask, OP_apply_penalties, OP_alloc_i32, OP_upload_i32, OP_download_i32, OP_copy_to_host, OP_copy_from_host, OP_copy_2d, OP_mul_scalar, OP_add_f32, OP_dropout, OP_logits_shard_stats, OP_log_softmax_shard_backward, OP_vocab_shard_ids_i32, OP_paged_attention_rope, OP_decode_layers, OP_graph_launch, OP_COUNT
};
static const char *OP_NAMES[OP_COUNT] = {"alloc", "alloc_f32", "free", "upload", "download", "upload_f32", "download_f32", "copy", "gather_rows", "scatter_rows", "linear", "rmsnorm", "rope", "kv_store", "attention", "swiglu", "add", "embedding", "zero", "zero_f32", "linear_backward", "rmsnorm_backward", "rope_backward", "kv_gather", "attention_backward", "swiglu_backward", "embedding_backward", "log_softmax_target", "log_softmax_target_backward", "adamw", "sum_squares", "scale", "embedding_i32", "rope_i32", "gather_rows_i32", "paged_kv_store", "paged_attention", "sample", "add_rmsnorm", "qkv_rope_store", "swiglu_gate_up", "log_softmax_entropy_backward", "log_softmax_shard_entropy_backward", "add_scaled", "apply_token_bitmask", "apply_penalties", "alloc_i32", "upload_i32", "download_i32", "copy_to_host", "copy_from_host", "copy_2d", "mul_scalar", "add_f32", "dropout", "logits_shard_stats", "log_softmax_shard_backward", "vocab_shard_ids_i32", "paged_attention_rope", "decode_layers", "graph_launch"};

typedef struct ProfileContext {
    const Backend *inner;
    bool capturing; /* between capture_begin and capture_end: ops are recorded, not run */
    double seconds[OP_COUNT];
    long calls[OP_COUNT];
} ProfileContext;

/* No synchronize while capturing: it is illegal inside a CUDA graph capture,
 * and a recorded op takes no time anyway (graph_launch is timed instead). */
static double op_begin(const ProfileContext *p) {
    if (p->capturing) return 0;
    if (p->inner->synchronize) p->inner->synchronize(p->inner);
    return time_now();
}

static void op_end(ProfileContext *p, int op, double t0) {
    if (p->capturing) return;
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

static void *prof_alloc_i32(const Backend *be, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    void *r = prof->inner->alloc_i32(prof->inner, n);
    op_end(prof, OP_alloc_i32, t0);
    return r;
}

static void prof_upload_i32(const Backend *be, void *dst, const int *src, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->upload_i32(prof->inner, dst, src, n);
    op_end(prof, OP_upload_i32, t0);
}

static void prof_download_i32(const Backend *be, int *dst, const void *src, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->download_i32(prof->inner, dst, src, n);
    op_end(prof, OP_download_i32, t0);
}

static void prof_copy_to_host(const Backend *be, void *dst, const void *src, size_t bytes) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->copy_to_host(prof->inner, dst, src, bytes);
    op_end(prof, OP_copy_to_host, t0);
}

static void prof_copy_from_host(const Backend *be, void *dst, const void *src, size_t bytes) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->copy_from_host(prof->inner, dst, src, bytes);
    op_end(prof, OP_copy_from_host, t0);
}

static void prof_copy_2d(const Backend *be, void *dst, size_t dst_stride, const void *src, size_t src_stride, int rows,
                         int cols) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->copy_2d(prof->inner, dst, dst_stride, src, src_stride, rows, cols);
    op_end(prof, OP_copy_2d, t0);
}

static void prof_mul_scalar(const Backend *be, void *out, const void *x, float s, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->mul_scalar(prof->inner, out, x, s, n);
    op_end(prof, OP_mul_scalar, t0);
}

static void prof_add_f32(const Backend *be, void *y, const void *x, size_t n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->add_f32(prof->inner, y, x, n);
    op_end(prof, OP_add_f32, t0);
}

static void prof_dropout(const Backend *be, void *out, const void *x, size_t n, float p, uint64_t seed,
                         uint64_t stream) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->dropout(prof->inner, out, x, n, p, seed, stream);
    op_end(prof, OP_dropout, t0);
}

static void prof_logits_shard_stats(const Backend *be, void *stats, const void *logits, const int *targets, int n,
                                    int vocab, float temperature) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->logits_shard_stats(prof->inner, stats, logits, targets, n, vocab, temperature);
    op_end(prof, OP_logits_shard_stats, t0);
}

static void prof_log_softmax_shard_backward(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                            const void *dlogprobs, const void *lse, int n, int vocab,
                                            float temperature) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->log_softmax_shard_backward(prof->inner, dlogits, logits, targets, dlogprobs, lse, n, vocab,
                                            temperature);
    op_end(prof, OP_log_softmax_shard_backward, t0);
}

static void prof_vocab_shard_ids_i32(const Backend *be, void *out, const void *ids, int n, int lo, int hi) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->vocab_shard_ids_i32(prof->inner, out, ids, n, lo, hi);
    op_end(prof, OP_vocab_shard_ids_i32, t0);
}

static void prof_paged_attention_rope(const Backend *be, void *out, void *q, void *k_pool, void *v_pool,
                                      const void *qkv, const void *block_tables, const void *seq, const void *pos,
                                      const void *slot_mapping, int n, int n_heads, int n_kv_heads, int head_dim,
                                      const float *inv_freq, int block_size, int max_blocks) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->paged_attention_rope(prof->inner, out, q, k_pool, v_pool, qkv, block_tables, seq, pos, slot_mapping, n,
                                      n_heads, n_kv_heads, head_dim, inv_freq, block_size, max_blocks);
    op_end(prof, OP_paged_attention_rope, t0);
}

/* All layers of a decode step, timed as one op; a declined call (false) did nothing and is not counted. */
static bool prof_decode_layers(const Backend *be, void *plan, void *x, const void *pos, const void *seq,
                               const void *slot_mapping, const void *block_tables, int n) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    bool r = prof->inner->decode_layers(prof->inner, plan, x, pos, seq, slot_mapping, block_tables, n);
    if (r) op_end(prof, OP_decode_layers, t0);
    return r;
}

/* A replayed graph is one op: its ops run on the device without the host. */
static void prof_graph_launch(const Backend *be, void *graph) {
    ProfileContext *prof = be->ctx;
    double t0 = op_begin(prof);
    prof->inner->graph_launch(prof->inner, graph);
    op_end(prof, OP_graph_launch, t0);
}

static void prof_capture_begin(const Backend *be) {
    ProfileContext *prof = be->ctx;
    prof->inner->capture_begin(prof->inner);
    prof->capturing = true;
}

static void *prof_capture_end(const Backend *be) {
    ProfileContext *prof = be->ctx;
    prof->capturing = false;
    return prof->inner->capture_end(prof->inner);
}

/* Bookkeeping, untimed: forwarded with the inner instance, whose ctx they read. */
static void prof_graph_free(const Backend *be, void *graph) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    in->graph_free(in, graph);
}
static uint64_t prof_buffers_epoch(const Backend *be) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    return in->buffers_epoch(in);
}
static void *prof_alloc_host(const Backend *be, size_t bytes) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    return in->alloc_host(in, bytes);
}
static void prof_free_host(const Backend *be, void *p) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    in->free_host(in, p);
}
static void prof_memory_stats(const Backend *be, size_t *in_use, size_t *peak, bool reset_peak) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    in->memory_stats(in, in_use, peak, reset_peak);
}
static void prof_set_alloc_label(const Backend *be, const char *label) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    in->set_alloc_label(in, label);
}
static void prof_memory_info(const Backend *be, size_t *free_bytes, size_t *total_bytes) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    in->memory_info(in, free_bytes, total_bytes);
}
static void prof_synchronize(const Backend *be) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    in->synchronize(in);
}
static void *prof_decode_layers_create(const Backend *be, const DecodeLayerWeights *layers, const DecodeDims *dims) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    return in->decode_layers_create(in, layers, dims);
}
static void prof_decode_layers_free(const Backend *be, void *plan) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    in->decode_layers_free(in, plan);
}
static void prof_set_batch_invariant(const Backend *be, int on) {
    const Backend *in = ((ProfileContext *)be->ctx)->inner;
    in->set_batch_invariant(in, on);
}
/* backend_close on the wrapper frees the wrapper alone: it does not own inner
 * (wrap takes it const; the caller closes it). */
static void prof_close_instance(Backend *be) { backend_profile_free(be); }

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

/* An op left as inner's own function would run with the wrapper as its
 * instance and read the ProfileContext as its own state. So every op must be
 * replaced: the ops are every field from alloc to the end of Backend (all
 * function pointers; backend.h keeps new ones there) and close_instance. */
typedef void (*AnyOp)(void);
_Static_assert((sizeof(Backend) - offsetof(Backend, alloc)) % sizeof(AnyOp) == 0,
               "Backend from alloc on must be function pointers only");

static void check_all_wrapped(const Backend *w, const Backend *inner) {
    COLT_ASSERT(w->close_instance != inner->close_instance);
    for (size_t off = offsetof(Backend, alloc); off < sizeof(Backend); off += sizeof(AnyOp)) {
        AnyOp mine, theirs;
        memcpy(&mine, (const char *)w + off, sizeof mine);
        memcpy(&theirs, (const char *)inner + off, sizeof theirs);
        if (theirs && mine == theirs) {
            char msg[160];
            snprintf(msg, sizeof msg, "backend_profile_wrap: the op at byte %zu of Backend is not wrapped (add it to "
                     "profile.c)", off);
            colt_abort(__FILE__, __LINE__, msg);
        }
    }
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
    if (inner->alloc_i32) w->alloc_i32 = prof_alloc_i32;
    if (inner->upload_i32) w->upload_i32 = prof_upload_i32;
    if (inner->download_i32) w->download_i32 = prof_download_i32;
    if (inner->copy_to_host) w->copy_to_host = prof_copy_to_host;
    if (inner->copy_from_host) w->copy_from_host = prof_copy_from_host;
    if (inner->copy_2d) w->copy_2d = prof_copy_2d;
    if (inner->mul_scalar) w->mul_scalar = prof_mul_scalar;
    if (inner->add_f32) w->add_f32 = prof_add_f32;
    if (inner->dropout) w->dropout = prof_dropout;
    if (inner->logits_shard_stats) w->logits_shard_stats = prof_logits_shard_stats;
    if (inner->log_softmax_shard_backward) w->log_softmax_shard_backward = prof_log_softmax_shard_backward;
    if (inner->vocab_shard_ids_i32) w->vocab_shard_ids_i32 = prof_vocab_shard_ids_i32;
    if (inner->paged_attention_rope) w->paged_attention_rope = prof_paged_attention_rope;
    if (inner->decode_layers) w->decode_layers = prof_decode_layers;
    if (inner->decode_layers_create) w->decode_layers_create = prof_decode_layers_create;
    if (inner->decode_layers_free) w->decode_layers_free = prof_decode_layers_free;
    if (inner->capture_begin) w->capture_begin = prof_capture_begin;
    if (inner->capture_end) w->capture_end = prof_capture_end;
    if (inner->graph_launch) w->graph_launch = prof_graph_launch;
    if (inner->graph_free) w->graph_free = prof_graph_free;
    if (inner->buffers_epoch) w->buffers_epoch = prof_buffers_epoch;
    if (inner->alloc_host) w->alloc_host = prof_alloc_host;
    if (inner->free_host) w->free_host = prof_free_host;
    if (inner->memory_stats) w->memory_stats = prof_memory_stats;
    if (inner->set_alloc_label) w->set_alloc_label = prof_set_alloc_label;
    if (inner->memory_info) w->memory_info = prof_memory_info;
    if (inner->synchronize) w->synchronize = prof_synchronize;
    if (inner->set_batch_invariant) w->set_batch_invariant = prof_set_batch_invariant;
    w->close_instance = prof_close_instance;
    check_all_wrapped(w, inner);
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

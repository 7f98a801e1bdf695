/* profile.c — see profile.h. The wrappers are generated one per op (see the
 * list in backend.h); each times its call between two synchronisations. */
#include "backend/profile.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"

static const Backend *g_inner;
static void (*g_sync)(void);
static Backend g_wrapped;

enum {
    OP_alloc, OP_alloc_f32, OP_free, OP_upload, OP_download, OP_upload_f32, OP_download_f32, OP_copy, OP_gather_rows, OP_scatter_rows, OP_linear, OP_rmsnorm, OP_rope, OP_kv_store, OP_attention, OP_swiglu, OP_add, OP_embedding, OP_zero, OP_zero_f32, OP_linear_backward, OP_rmsnorm_backward, OP_rope_backward, OP_kv_gather, OP_attention_backward, OP_swiglu_backward, OP_embedding_backward, OP_log_softmax_target, OP_log_softmax_target_backward, OP_adamw, OP_sum_squares, OP_scale, OP_embedding_i32, OP_rope_i32, OP_gather_rows_i32, OP_paged_kv_store, OP_paged_attention, OP_sample, OP_add_rmsnorm, OP_qkv_rope_store, OP_swiglu_gate_up, OP_COUNT
};
static const char *OP_NAMES[OP_COUNT] = {"alloc", "alloc_f32", "free", "upload", "download", "upload_f32", "download_f32", "copy", "gather_rows", "scatter_rows", "linear", "rmsnorm", "rope", "kv_store", "attention", "swiglu", "add", "embedding", "zero", "zero_f32", "linear_backward", "rmsnorm_backward", "rope_backward", "kv_gather", "attention_backward", "swiglu_backward", "embedding_backward", "log_softmax_target", "log_softmax_target_backward", "adamw", "sum_squares", "scale", "embedding_i32", "rope_i32", "gather_rows_i32", "paged_kv_store", "paged_attention", "sample", "add_rmsnorm", "qkv_rope_store", "swiglu_gate_up"};
static double g_seconds[OP_COUNT];
static long g_calls[OP_COUNT];

static double op_begin(void) {
    if (g_sync) g_sync();
    return time_now();
}

static void op_end(int op, double t0) {
    if (g_sync) g_sync();
    g_seconds[op] += time_now() - t0;
    g_calls[op]++;
}

static void * prof_alloc(size_t n) {
    double t0 = op_begin();
    void * r = g_inner->alloc(n);
    op_end(OP_alloc, t0);
    return r;
}

static void * prof_alloc_f32(size_t n) {
    double t0 = op_begin();
    void * r = g_inner->alloc_f32(n);
    op_end(OP_alloc_f32, t0);
    return r;
}

static void prof_free(void *buf) {
    double t0 = op_begin();
    g_inner->free(buf);
    op_end(OP_free, t0);
}

static void prof_upload(void *dst, const float *src, size_t n) {
    double t0 = op_begin();
    g_inner->upload(dst, src, n);
    op_end(OP_upload, t0);
}

static void prof_download(float *dst, const void *src, size_t n) {
    double t0 = op_begin();
    g_inner->download(dst, src, n);
    op_end(OP_download, t0);
}

static void prof_upload_f32(void *dst, const float *src, size_t n) {
    double t0 = op_begin();
    g_inner->upload_f32(dst, src, n);
    op_end(OP_upload_f32, t0);
}

static void prof_download_f32(float *dst, const void *src, size_t n) {
    double t0 = op_begin();
    g_inner->download_f32(dst, src, n);
    op_end(OP_download_f32, t0);
}

static void prof_copy(void *dst, size_t dst_offset, const void *src, size_t src_offset, size_t n) {
    double t0 = op_begin();
    g_inner->copy(dst, dst_offset, src, src_offset, n);
    op_end(OP_copy, t0);
}

static void prof_gather_rows(void *dst, const void *src, const int *rows, int n, int dim) {
    double t0 = op_begin();
    g_inner->gather_rows(dst, src, rows, n, dim);
    op_end(OP_gather_rows, t0);
}

static void prof_scatter_rows(void *dst, const void *src, const int *rows, int n, int dim) {
    double t0 = op_begin();
    g_inner->scatter_rows(dst, src, rows, n, dim);
    op_end(OP_scatter_rows, t0);
}

static void prof_linear(void *out, const void *x, const void *w, const void *bias, int n, int in_dim, int out_dim) {
    double t0 = op_begin();
    g_inner->linear(out, x, w, bias, n, in_dim, out_dim);
    op_end(OP_linear, t0);
}

static void prof_rmsnorm(void *out, const void *x, const void *w, int n, int dim, float eps) {
    double t0 = op_begin();
    g_inner->rmsnorm(out, x, w, n, dim, eps);
    op_end(OP_rmsnorm, t0);
}

static void prof_rope(void *x, const int *pos, int n, int n_heads, int head_dim, float theta) {
    double t0 = op_begin();
    g_inner->rope(x, pos, n, n_heads, head_dim, theta);
    op_end(OP_rope, t0);
}

static void prof_kv_store(void *k_cache, void *v_cache, const void *k, const void *v, const int *slot, const int *pos, int n, int kv_dim, int max_len) {
    double t0 = op_begin();
    g_inner->kv_store(k_cache, v_cache, k, v, slot, pos, n, kv_dim, max_len);
    op_end(OP_kv_store, t0);
}

static void prof_attention(void *out, void *lse, const void *q, const void *k_cache, const void *v_cache, const int *slot, const int *pos, int n, int n_heads, int n_kv_heads, int head_dim, int max_len) {
    double t0 = op_begin();
    g_inner->attention(out, lse, q, k_cache, v_cache, slot, pos, n, n_heads, n_kv_heads, head_dim, max_len);
    op_end(OP_attention, t0);
}

static void prof_swiglu(void *out, const void *gate, const void *up, size_t n) {
    double t0 = op_begin();
    g_inner->swiglu(out, gate, up, n);
    op_end(OP_swiglu, t0);
}

static void prof_add(void *out, const void *a, const void *b, size_t n) {
    double t0 = op_begin();
    g_inner->add(out, a, b, n);
    op_end(OP_add, t0);
}

static void prof_embedding(void *out, const void *table, const int *ids, int n, int dim) {
    double t0 = op_begin();
    g_inner->embedding(out, table, ids, n, dim);
    op_end(OP_embedding, t0);
}

static void prof_zero(void *x, size_t n) {
    double t0 = op_begin();
    g_inner->zero(x, n);
    op_end(OP_zero, t0);
}

static void prof_zero_f32(void *x, size_t n) {
    double t0 = op_begin();
    g_inner->zero_f32(x, n);
    op_end(OP_zero_f32, t0);
}

static void prof_linear_backward(void *dx, void *dw, void *db, const void *dy, const void *x, const void *w, int n, int in_dim, int out_dim, int accumulate_dx) {
    double t0 = op_begin();
    g_inner->linear_backward(dx, dw, db, dy, x, w, n, in_dim, out_dim, accumulate_dx);
    op_end(OP_linear_backward, t0);
}

static void prof_rmsnorm_backward(void *dx, void *dw, const void *dy, const void *x, const void *w, int n, int dim, float eps) {
    double t0 = op_begin();
    g_inner->rmsnorm_backward(dx, dw, dy, x, w, n, dim, eps);
    op_end(OP_rmsnorm_backward, t0);
}

static void prof_rope_backward(void *dx, const int *pos, int n, int n_heads, int head_dim, float theta) {
    double t0 = op_begin();
    g_inner->rope_backward(dx, pos, n, n_heads, head_dim, theta);
    op_end(OP_rope_backward, t0);
}

static void prof_kv_gather(void *k, void *v, const void *k_cache, const void *v_cache, const int *slot, const int *pos, int n, int kv_dim, int max_len) {
    double t0 = op_begin();
    g_inner->kv_gather(k, v, k_cache, v_cache, slot, pos, n, kv_dim, max_len);
    op_end(OP_kv_gather, t0);
}

static void prof_attention_backward(void *dq, void *dk_cache, void *dv_cache, const void *dout, const void *q, const void *out, const void *lse, const void *k_cache, const void *v_cache, const int *slot, const int *pos, int n, int n_heads, int n_kv_heads, int head_dim, int n_slots, int max_len) {
    double t0 = op_begin();
    g_inner->attention_backward(dq, dk_cache, dv_cache, dout, q, out, lse, k_cache, v_cache, slot, pos, n, n_heads, n_kv_heads, head_dim, n_slots, max_len);
    op_end(OP_attention_backward, t0);
}

static void prof_swiglu_backward(void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n) {
    double t0 = op_begin();
    g_inner->swiglu_backward(dgate, dup, dout, gate, up, n);
    op_end(OP_swiglu_backward, t0);
}

static void prof_embedding_backward(void *dtable, const void *dout, const int *ids, int n, int dim) {
    double t0 = op_begin();
    g_inner->embedding_backward(dtable, dout, ids, n, dim);
    op_end(OP_embedding_backward, t0);
}

static void prof_log_softmax_target(void *logprobs, void *entropy, const void *logits, const int *targets, int n, int vocab, float temperature) {
    double t0 = op_begin();
    g_inner->log_softmax_target(logprobs, entropy, logits, targets, n, vocab, temperature);
    op_end(OP_log_softmax_target, t0);
}

static void prof_log_softmax_target_backward(void *dlogits, const void *logits, const int *targets, const void *dlogprobs, int n, int vocab, float temperature) {
    double t0 = op_begin();
    g_inner->log_softmax_target_backward(dlogits, logits, targets, dlogprobs, n, vocab, temperature);
    op_end(OP_log_softmax_target_backward, t0);
}

static void prof_adamw(void *param, void *master, const void *grad, void *m, void *v, size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float bias_correction1, float bias_correction2) {
    double t0 = op_begin();
    g_inner->adamw(param, master, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2);
    op_end(OP_adamw, t0);
}

static double prof_sum_squares(const void *x, size_t n) {
    double t0 = op_begin();
    double r = g_inner->sum_squares(x, n);
    op_end(OP_sum_squares, t0);
    return r;
}

static void prof_scale(void *x, float s, size_t n) {
    double t0 = op_begin();
    g_inner->scale(x, s, n);
    op_end(OP_scale, t0);
}

static void prof_embedding_i32(void *out, const void *table, const void *ids, int n, int dim) {
    double t0 = op_begin();
    g_inner->embedding_i32(out, table, ids, n, dim);
    op_end(OP_embedding_i32, t0);
}

static void prof_rope_i32(void *x, const void *pos, int n, int n_heads, int head_dim, float theta) {
    double t0 = op_begin();
    g_inner->rope_i32(x, pos, n, n_heads, head_dim, theta);
    op_end(OP_rope_i32, t0);
}

static void prof_gather_rows_i32(void *dst, const void *src, const void *rows, int n, int dim) {
    double t0 = op_begin();
    g_inner->gather_rows_i32(dst, src, rows, n, dim);
    op_end(OP_gather_rows_i32, t0);
}

static void prof_paged_kv_store(void *k_pool, void *v_pool, const void *k, const void *v, const void *slot_mapping,
                                int n, int kv_dim) {
    double t0 = op_begin();
    g_inner->paged_kv_store(k_pool, v_pool, k, v, slot_mapping, n, kv_dim);
    op_end(OP_paged_kv_store, t0);
}

static void prof_paged_attention(void *out, const void *q, const void *k_pool, const void *v_pool,
                                 const void *block_tables, const void *seq, const void *pos, int n, int n_heads,
                                 int n_kv_heads, int head_dim, int block_size, int max_blocks) {
    double t0 = op_begin();
    g_inner->paged_attention(out, q, k_pool, v_pool, block_tables, seq, pos, n, n_heads, n_kv_heads, head_dim,
                             block_size, max_blocks);
    op_end(OP_paged_attention, t0);
}

static void prof_sample(void *tokens, void *logprobs, void *logits, int n, int vocab, const struct SamplingParams *p,
                        const void *seq, const void *streams, const void *counters, void *history, void *history_len,
                        int history_stride) {
    double t0 = op_begin();
    g_inner->sample(tokens, logprobs, logits, n, vocab, p, seq, streams, counters, history, history_len,
                    history_stride);
    op_end(OP_sample, t0);
}

static void prof_add_rmsnorm(void *x, void *xn, const void *delta, const void *w, int n, int dim, float eps) {
    double t0 = op_begin();
    g_inner->add_rmsnorm(x, xn, delta, w, n, dim, eps);
    op_end(OP_add_rmsnorm, t0);
}

static void prof_qkv_rope_store(void *q, void *k_pool, void *v_pool, const void *qkv, const void *pos,
                                const void *slot_mapping, int n, int n_heads, int n_kv_heads, int head_dim,
                                float theta) {
    double t0 = op_begin();
    g_inner->qkv_rope_store(q, k_pool, v_pool, qkv, pos, slot_mapping, n, n_heads, n_kv_heads, head_dim, theta);
    op_end(OP_qkv_rope_store, t0);
}

static void prof_swiglu_gate_up(void *out, const void *gate_up, int n, int f) {
    double t0 = op_begin();
    g_inner->swiglu_gate_up(out, gate_up, n, f);
    op_end(OP_swiglu_gate_up, t0);
}

const Backend *backend_profile_wrap(const Backend *inner, void (*sync)(void)) {
    g_inner = inner;
    g_sync = sync;
    g_wrapped = *inner;
    g_wrapped.name = "profiled";
    if (inner->alloc) g_wrapped.alloc = prof_alloc;
    if (inner->alloc_f32) g_wrapped.alloc_f32 = prof_alloc_f32;
    if (inner->free) g_wrapped.free = prof_free;
    if (inner->upload) g_wrapped.upload = prof_upload;
    if (inner->download) g_wrapped.download = prof_download;
    if (inner->upload_f32) g_wrapped.upload_f32 = prof_upload_f32;
    if (inner->download_f32) g_wrapped.download_f32 = prof_download_f32;
    if (inner->copy) g_wrapped.copy = prof_copy;
    if (inner->gather_rows) g_wrapped.gather_rows = prof_gather_rows;
    if (inner->scatter_rows) g_wrapped.scatter_rows = prof_scatter_rows;
    if (inner->linear) g_wrapped.linear = prof_linear;
    if (inner->rmsnorm) g_wrapped.rmsnorm = prof_rmsnorm;
    if (inner->rope) g_wrapped.rope = prof_rope;
    if (inner->kv_store) g_wrapped.kv_store = prof_kv_store;
    if (inner->attention) g_wrapped.attention = prof_attention;
    if (inner->swiglu) g_wrapped.swiglu = prof_swiglu;
    if (inner->add) g_wrapped.add = prof_add;
    if (inner->embedding) g_wrapped.embedding = prof_embedding;
    if (inner->zero) g_wrapped.zero = prof_zero;
    if (inner->zero_f32) g_wrapped.zero_f32 = prof_zero_f32;
    if (inner->linear_backward) g_wrapped.linear_backward = prof_linear_backward;
    if (inner->rmsnorm_backward) g_wrapped.rmsnorm_backward = prof_rmsnorm_backward;
    if (inner->rope_backward) g_wrapped.rope_backward = prof_rope_backward;
    if (inner->kv_gather) g_wrapped.kv_gather = prof_kv_gather;
    if (inner->attention_backward) g_wrapped.attention_backward = prof_attention_backward;
    if (inner->swiglu_backward) g_wrapped.swiglu_backward = prof_swiglu_backward;
    if (inner->embedding_backward) g_wrapped.embedding_backward = prof_embedding_backward;
    if (inner->log_softmax_target) g_wrapped.log_softmax_target = prof_log_softmax_target;
    if (inner->log_softmax_target_backward) g_wrapped.log_softmax_target_backward = prof_log_softmax_target_backward;
    if (inner->adamw) g_wrapped.adamw = prof_adamw;
    if (inner->sum_squares) g_wrapped.sum_squares = prof_sum_squares;
    if (inner->scale) g_wrapped.scale = prof_scale;
    if (inner->embedding_i32) g_wrapped.embedding_i32 = prof_embedding_i32;
    if (inner->rope_i32) g_wrapped.rope_i32 = prof_rope_i32;
    if (inner->gather_rows_i32) g_wrapped.gather_rows_i32 = prof_gather_rows_i32;
    if (inner->paged_kv_store) g_wrapped.paged_kv_store = prof_paged_kv_store;
    if (inner->paged_attention) g_wrapped.paged_attention = prof_paged_attention;
    if (inner->sample) g_wrapped.sample = prof_sample;
    if (inner->add_rmsnorm) g_wrapped.add_rmsnorm = prof_add_rmsnorm;
    if (inner->qkv_rope_store) g_wrapped.qkv_rope_store = prof_qkv_rope_store;
    if (inner->swiglu_gate_up) g_wrapped.swiglu_gate_up = prof_swiglu_gate_up;
    /* Every op synchronises here: nothing can be captured into a graph. */
    g_wrapped.capture_begin = NULL;
    memset(g_seconds, 0, sizeof g_seconds);
    memset(g_calls, 0, sizeof g_calls);
    return &g_wrapped;
}

void backend_profile_report(FILE *fp) {
    double total = 0;
    int order[OP_COUNT];
    for (int i = 0; i < OP_COUNT; i++) total += g_seconds[i], order[i] = i;
    for (int i = 0; i < OP_COUNT; i++)  /* a small insertion sort, slowest first */
        for (int j = i; j > 0 && g_seconds[order[j]] > g_seconds[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    fprintf(fp, "| op | calls | ms | share |\n|---|---:|---:|---:|\n");
    for (int k = 0; k < OP_COUNT; k++) {
        int i = order[k];
        if (!g_calls[i]) continue;
        fprintf(fp, "| %s | %ld | %.2f | %.1f%% |\n", OP_NAMES[i], g_calls[i], g_seconds[i] * 1e3,
                total > 0 ? 100.0 * g_seconds[i] / total : 0.0);
    }
    memset(g_seconds, 0, sizeof g_seconds);
    memset(g_calls, 0, sizeof g_calls);
}

/* cpu_engine_ops.h — the CPU backend's instance state (CpuContext, the
 * OpenMP team an op runs on) and its generation-engine ops (backend.h,
 * "generation engine"), defined in cpu_paged.c, cpu_sample.c and cpu_fused.c
 * and put in the table by cpu_backend.c. On the CPU, [i32] buffers are plain
 * host int arrays. */
#ifndef COLT_BACKEND_CPU_ENGINE_OPS_H
#define COLT_BACKEND_CPU_ENGINE_OPS_H

#include "backend/backend.h"

/* The instance's state (cpu_backend.c): deterministic mode (backend.h
 * set_batch_invariant; attention needs nothing: cpu_attention and
 * cpu_paged_attention share their arithmetic, per token), the threads its ops
 * compute with (set_threads), and the memory accounting (memory_stats). */
typedef struct CpuContext {
    int batch_invariant;
    int threads;
    /* cpu_gemm's split of C among threads, in multiples of these rows / columns (0: never that way): what
     * this machine's BLAS keeps bit for bit, probed at the instance's first GEMM worth splitting */
    int split_probed, split_rows_unit, split_cols_unit;
    size_t in_use, peak; /* bytes of alloc / alloc_f32 buffers */
    char alloc_label[160];
    /* freed large blocks kept for the next allocation of about their size (cpu_backend.c, CPU_CACHE_*),
     * oldest first */
    void *cache[64];
    int n_cached;
    size_t cached_bytes;
} CpuContext;

/* Scalar operations one more thread must get before it is worth waking:
 * an OpenMP fork/join costs a few microseconds (tens when the threads sleep),
 * and a 260K-parameter model's decode ops are a few thousand operations each. */
#define CPU_WORK_PER_THREAD 32768.0

/* The OpenMP team for an op of about `work` scalar operations: the instance's
 * threads, fewer for small work (1: no fork at all). Only for ops whose
 * results do not depend on the team's size (each output written by one
 * iteration, in the same order whatever the team). */
static inline int cpu_team(const Backend *be, double work) {
    int threads = ((const CpuContext *)be->ctx)->threads;
    double fit = work / CPU_WORK_PER_THREAD;
    if (fit < threads) threads = fit < 1.0 ? 1 : (int)fit;
    return threads;
}

void cpu_paged_kv_store(const Backend *be, void *k_pool, void *v_pool, const void *k, const void *v, const void *slot_mapping, int n,
                        int kv_dim);
void cpu_paged_attention(const Backend *be, void *out, const void *q, const void *k_pool, const void *v_pool, const void *block_tables,
                         const void *seq, const void *pos, int n, int n_heads, int n_kv_heads, int head_dim,
                         int block_size, int max_blocks);
/* cpu_paged.c: the attention of one query row, shared by cpu_attention (table NULL: position t at
 * row base_row + t) and cpu_paged_attention (position t through the block table). */
void cpu_attend_row(float *out_row, const float *q_row, const float *k, const float *v, const int *table,
                    int block_size, size_t base_row, int last, int head_dim, size_t kv_dim, size_t head_offset,
                    float *lse);
/* cpu_attention_fast.c: the same row in fp32 with a vectorised exp, what attention and paged_attention run
 * while deterministic mode is off (cpu_attend_row then). */
void cpu_attend_row_fast(float *out_row, const float *q_row, const float *k, const float *v, const int *table,
                         int block_size, size_t base_row, int last, int head_dim, size_t kv_dim, size_t head_offset,
                         float *lse);
/* attention_backward from the forward's out and lse (cpu_attention_fast.c), while deterministic mode is off. */
void cpu_attention_backward_fast(const Backend *be, float *dq, float *dk_cache, float *dv_cache, const float *dout,
                                 const float *q, const float *out, const float *lse, const float *k_cache,
                                 const float *v_cache, const int *slot, const int *pos, int n, int n_heads,
                                 int n_kv_heads, int head_dim, int n_slots, int max_len);
typedef void (*CpuAttendRow)(float *out_row, const float *q_row, const float *k, const float *v, const int *table,
                             int block_size, size_t base_row, int last, int head_dim, size_t kv_dim,
                             size_t head_offset, float *lse);
/* The row attention and paged_attention run: the reference in deterministic mode, else the fast one. */
static inline CpuAttendRow cpu_attend_row_for(const Backend *be) {
    return ((const CpuContext *)be->ctx)->batch_invariant ? cpu_attend_row : cpu_attend_row_fast;
}
void cpu_sample(const Backend *be, void *tokens, void *logprobs, void *logits, int n, int vocab, const struct SamplingParams *p,
                const void *seq, const void *streams, const void *counters, void *history, void *history_len,
                int history_stride);
void cpu_apply_penalties(const Backend *be, void *logits, int n, int vocab, const struct SamplingParams *p,
                         const void *seq, const void *history, const void *history_len, const void *prompt_len,
                         int history_stride, const void *bias_ids, const void *bias_values, const void *bias_len,
                         int bias_stride);
void cpu_apply_token_bitmask(const Backend *be, void *logits, const void *bitmask, int n, int vocab);
/* cpu_fused.c: the decode step's fused ops. */
void cpu_add_rmsnorm(const Backend *be, void *x, void *xn, const void *delta, const void *w, int n, int dim, float eps);
void cpu_qkv_rope_store(const Backend *be, void *q, void *k_pool, void *v_pool, const void *qkv, const void *pos,
                        const void *slot_mapping, int n, int n_heads, int n_kv_heads, int head_dim,
                        const float *inv_freq);
void cpu_swiglu_gate_up(const Backend *be, void *out, const void *gate_up, int n, int f);

#endif

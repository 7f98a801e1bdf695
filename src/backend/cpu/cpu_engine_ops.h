/* cpu_engine_ops.h — the CPU backend's generation-engine ops (backend.h,
 * "generation engine"), defined in cpu_paged.c, cpu_sample.c and cpu_fused.c
 * and put in the table by cpu_backend.c. On the CPU, [i32] buffers are plain
 * host int arrays. */
#ifndef COLT_BACKEND_CPU_ENGINE_OPS_H
#define COLT_BACKEND_CPU_ENGINE_OPS_H

#include "backend/backend.h"

void cpu_paged_kv_store(const Backend *be, void *k_pool, void *v_pool, const void *k, const void *v, const void *slot_mapping, int n,
                        int kv_dim);
void cpu_paged_attention(const Backend *be, void *out, const void *q, const void *k_pool, const void *v_pool, const void *block_tables,
                         const void *seq, const void *pos, int n, int n_heads, int n_kv_heads, int head_dim,
                         int block_size, int max_blocks);
/* cpu_paged.c: the attention of one query row, shared by cpu_attention (table NULL: position t at
 * row base_row + t) and cpu_paged_attention (position t through the block table). */
void cpu_attend_row(float *out_row, const float *q_row, const float *k, const float *v, const int *table,
                    int block_size, size_t base_row, int last, int head_dim, size_t kv_dim, size_t head_offset);
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

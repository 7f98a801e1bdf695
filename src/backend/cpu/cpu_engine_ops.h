/* cpu_engine_ops.h — the CPU backend's generation-engine ops (backend.h,
 * "generation engine"), defined in cpu_paged.c and cpu_sample.c and put in the
 * table by cpu_backend.c. On the CPU, [i32] buffers are plain host int arrays. */
#ifndef COLT_BACKEND_CPU_ENGINE_OPS_H
#define COLT_BACKEND_CPU_ENGINE_OPS_H

#include "backend/backend.h"

void cpu_paged_kv_store(void *k_pool, void *v_pool, const void *k, const void *v, const void *slot_mapping, int n,
                        int kv_dim);
void cpu_paged_attention(void *out, const void *q, const void *k_pool, const void *v_pool, const void *block_tables,
                         const void *seq, const void *pos, int n, int n_heads, int n_kv_heads, int head_dim,
                         int block_size, int max_blocks);
void cpu_sample(void *tokens, void *logprobs, void *logits, int n, int vocab, const struct SamplingParams *p,
                const void *seq, const void *streams, const void *counters, void *history, void *history_len,
                int history_stride);

#endif

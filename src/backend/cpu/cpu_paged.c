/* cpu_paged.c — STUB, being written (paged KV cache ops on the CPU). */
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/cpu_engine_ops.h"

void cpu_paged_kv_store(void *k_pool, void *v_pool, const void *k, const void *v, const void *slot_mapping, int n,
                        int kv_dim) {
    fprintf(stderr, "cpu_paged_kv_store: not written yet\n");
    abort();
}
void cpu_paged_attention(void *out, const void *q, const void *k_pool, const void *v_pool, const void *block_tables,
                         const void *seq, const void *pos, int n, int n_heads, int n_kv_heads, int head_dim,
                         int block_size, int max_blocks) {
    fprintf(stderr, "cpu_paged_attention: not written yet\n");
    abort();
}

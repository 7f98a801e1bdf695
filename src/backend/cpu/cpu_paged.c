/* cpu_paged.c — the paged KV cache ops of the CPU reference backend
 * (backend.h, "generation engine"): paged_kv_store and paged_attention.
 *
 * Pools are [n_blocks * block_size, KVH*Dh] fp32; [i32] arguments are host int
 * arrays. paged_attention and cpu_attention run one per-row routine
 * (cpu_attend_row) that differs only in where position p's K/V row is, so the
 * two agree bit for bit on the same K/V rows. Not a fast path: one (token,
 * head) pair per OpenMP iteration, no blocking over heads.
 *
 * Dimension legend: N tokens in a call, H query heads, KVH key/value heads,
 * Dh head dim. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_engine_ops.h"
#include "core/error.h"

#define CPU_PAGED_MAX_HEAD_DIM 1024

/* k[N, KVH*Dh] and v[N, KVH*Dh] of token i go to pool row slot_mapping[i];
 * tokens with a negative slot are padding and write nothing. */
void cpu_paged_kv_store(const Backend *be, void *k_pool, void *v_pool, const void *k, const void *v, const void *slot_mapping, int n,
                        int kv_dim) {
    float *kp = k_pool, *vp = v_pool;
    const float *ks = k, *vs = v;
    const int *slots = slot_mapping;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 2.0 * n * kv_dim))
    for (int i = 0; i < n; i++) {
        if (slots[i] < 0) continue;
        size_t row = (size_t)slots[i] * kv_dim;
        memcpy(kp + row, ks + (size_t)i * kv_dim, (size_t)kv_dim * sizeof(float));
        memcpy(vp + row, vs + (size_t)i * kv_dim, (size_t)kv_dim * sizeof(float));
    }
}

/* One query row attends to positions 0..last: out_row[Dh] = softmax(q . k_t /
 * sqrt(Dh)) . v_t, position t at pool row table[t / block_size] * block_size +
 * t % block_size, or at row base_row + t when table is NULL (a contiguous cache).
 * Scores, the running max/sum (online softmax) and the weighted sum in double;
 * *lse (when not NULL) = max + log(sum), the row's log-sum-exp.
 * cpu_attention and cpu_paged_attention both run this, so a token's attention
 * is the same bits in the trainer and in the engine. */
void cpu_attend_row(float *out_row, const float *q_row, const float *k, const float *v, const int *table,
                    int block_size, size_t base_row, int last, int head_dim, size_t kv_dim, size_t head_offset,
                    float *lse) {
    double acc[CPU_PAGED_MAX_HEAD_DIM];
    double scale = 1.0 / sqrt((double)head_dim);
    COLT_ASSERT(head_dim <= CPU_PAGED_MAX_HEAD_DIM);
    double m = -INFINITY, l = 0.0;
    for (int d = 0; d < head_dim; d++) acc[d] = 0.0;
    for (int t = 0; t <= last; t++) {
        size_t row = table ? (size_t)table[t / block_size] * block_size + (size_t)(t % block_size) : base_row + t;
        const float *kt = k + row * kv_dim + head_offset, *vt = v + row * kv_dim + head_offset;
        double s = 0.0;
        for (int d = 0; d < head_dim; d++) s += (double)q_row[d] * kt[d];
        s *= scale;
        if (s > m) {
            double c = exp(m - s); /* rescale what was accumulated under the old max */
            l *= c;
            for (int d = 0; d < head_dim; d++) acc[d] *= c;
            m = s;
        }
        double p = exp(s - m);
        l += p;
        for (int d = 0; d < head_dim; d++) acc[d] += p * vt[d];
    }
    for (int d = 0; d < head_dim; d++) out_row[d] = (float)(acc[d] / l);
    if (lse) *lse = (float)(m + log(l));
}

/* out[N, H*Dh]: token i (sequence seq[i], position pos[i]), head h attends to
 * positions 0..pos[i] through block_tables[seq[i], :], KV head h / (H/KVH).
 * Padding tokens (seq < 0) are skipped. */
void cpu_paged_attention(const Backend *be, void *out, const void *q, const void *k_pool, const void *v_pool, const void *block_tables,
                         const void *seq, const void *pos, int n, int n_heads, int n_kv_heads, int head_dim,
                         int block_size, int max_blocks) {
    const int *tables = block_tables, *seqs = seq, *positions = pos;
    int group = n_heads / n_kv_heads;
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    CpuAttendRow attend_row = cpu_attend_row_for(be);
    COLT_ASSERT(block_size > 0);
    int max_pos = 0; /* the longest row sizes the team */
    for (int i = 0; i < n; i++)
        if (positions[i] > max_pos) max_pos = positions[i];
#pragma omp parallel for collapse(2) schedule(dynamic, 4) num_threads(cpu_team(be, (double)n * n_heads * (max_pos + 1) * (4.0 * head_dim + 40.0)))
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < n_heads; h++) {
            if (seqs[i] < 0) continue;
            size_t qo = ((size_t)i * n_heads + h) * head_dim;
            attend_row((float *)out + qo, (const float *)q + qo, k_pool, v_pool, tables + (size_t)seqs[i] * max_blocks,
                       block_size, 0, positions[i], head_dim, kv_dim, (size_t)(h / group) * head_dim, NULL);
        }
    }
}

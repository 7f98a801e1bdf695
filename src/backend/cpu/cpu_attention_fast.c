/* cpu_attention_fast.c — the CPU backend's fast attention row (fp32), beside
 * the reference (cpu_attend_row in cpu_paged.c, in double). attention and
 * paged_attention run it while deterministic mode is off; deterministic mode
 * runs the reference. Both paths of a token (the trainer's contiguous cache,
 * the engine's paged pool) run this same code, so they agree bit for bit with
 * each other as the reference's do. Tolerance against the double reference:
 * ~1e-6 relative (test_backend_ops' attention_fast cases).
 *
 * Why: a 260K-parameter model spends most of its step in attention, and the
 * reference's cost there is one libm exp in double per score. Here the scores
 * go in windows of CPU_FAST_WINDOW positions: their dot products, one max per
 * window (the running sum rescaled when it grows), exp by a polynomial that
 * vectorises, then the weighted sum of V. Not a FlashAttention: no tiling
 * over queries, one (token, head) row per call.
 *
 * Dimension legend: Dh head dim, KVH*Dh the pool's row width (kv_dim). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_engine_ops.h"
#include "core/error.h"

#define CPU_FAST_WINDOW 16
#define CPU_FAST_MAX_HEAD_DIM 1024

/* exp(x) for x <= 0 (a score minus the running max), within 2 ulp: 2^n p(r),
 * n = round(x / ln 2), r = x - n ln 2 in two parts (Cody-Waite), p Cephes'
 * degree-6 expf polynomial. Plain arithmetic, so a loop over it vectorises;
 * below -87 (where expf is under 2^-126) it returns 0. */
static inline float fast_expf_nonpositive(float x) {
    float under = x < -87.0f ? 0.0f : 1.0f;
    x = x < -87.0f ? -87.0f : x;
    int32_t ni = (int32_t)(x * 1.44269504088896341f - 0.5f); /* round to nearest: x <= 0, and the cast truncates */
    float n = (float)ni;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = (ni + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale * under;
}

/* Same contract as cpu_attend_row (cpu_engine_ops.h): out_row[Dh] = softmax(q .
 * k_t / sqrt(Dh)) . v_t over positions 0..last, position t at pool row
 * table[t / block_size] * block_size + t % block_size, or base_row + t when
 * table is NULL; *lse (when not NULL) the row's log-sum-exp. The windows start
 * at multiples of CPU_FAST_WINDOW whatever the layout, so both layouts make
 * the same sums. */
/* One clone per instruction set, resolved when the program loads (as host_adamw.c). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

CLONES void cpu_attend_row_fast(float *out_row, const float *q_row, const float *k, const float *v, const int *table,
                         int block_size, size_t base_row, int last, int head_dim, size_t kv_dim, size_t head_offset,
                         float *lse) {
    float acc[CPU_FAST_MAX_HEAD_DIM], s[CPU_FAST_WINDOW];
    const float *krow[CPU_FAST_WINDOW], *vrow[CPU_FAST_WINDOW];
    const float scale = 1.0f / sqrtf((float)head_dim);
    COLT_ASSERT(head_dim <= CPU_FAST_MAX_HEAD_DIM);
    float m = -INFINITY, l = 0.0f;
    for (int d = 0; d < head_dim; d++) acc[d] = 0.0f;
    for (int t0 = 0; t0 <= last; t0 += CPU_FAST_WINDOW) {
        int len = last + 1 - t0 < CPU_FAST_WINDOW ? last + 1 - t0 : CPU_FAST_WINDOW;
        float window_max = -INFINITY;
        int block = table ? t0 / block_size : 0, in_block = table ? t0 % block_size : 0;
        for (int j = 0; j < len; j++) {
            size_t row = table ? (size_t)table[block] * block_size + (size_t)in_block : base_row + t0 + j;
            if (table && ++in_block == block_size) block++, in_block = 0;
            krow[j] = k + row * kv_dim + head_offset;
            vrow[j] = v + row * kv_dim + head_offset;
            float dot = 0.0f;
            for (int d = 0; d < head_dim; d++) dot += q_row[d] * krow[j][d];
            s[j] = dot * scale;
            window_max = s[j] > window_max ? s[j] : window_max;
        }
        for (int j = len; j < CPU_FAST_WINDOW; j++) s[j] = -INFINITY; /* a whole window's exps: one vector */
        if (window_max > m) { /* rescale what was summed under the old max (nothing, the first time) */
            float c = m == -INFINITY ? 0.0f : fast_expf_nonpositive(m - window_max);
            l *= c;
            for (int d = 0; d < head_dim; d++) acc[d] *= c;
            m = window_max;
        }
        for (int j = 0; j < CPU_FAST_WINDOW; j++) s[j] = fast_expf_nonpositive(s[j] - m);
        for (int j = 0; j < len; j++) {
            l += s[j];
            for (int d = 0; d < head_dim; d++) acc[d] += s[j] * vrow[j][d];
        }
    }
    for (int d = 0; d < head_dim; d++) out_row[d] = acc[d] / l;
    if (lse) *lse = m + logf(l);
}

/* The backward of one (token, head) row from the forward's statistics
 * (FlashAttention-2's): p_t = exp(s_t - lse), delta = dout . out (= sum_t p_t
 * dP_t), dS_t = p_t (dout . v_t - delta); dq = scale sum_t dS_t k_t,
 * dk_t += scale dS_t q, dv_t += p_t dout. kbase, vbase, dkbase, dvbase: the
 * slot's rows at this KV head (stride kv_dim); positions 0..last. fp32, windows
 * of CPU_FAST_WINDOW positions for the exp. */
CLONES static void attend_row_backward_fast(float *dq, float *dkbase, float *dvbase, const float *dout, const float *q,
                                            const float *out, float lse, const float *kbase, const float *vbase,
                                            int last, int head_dim, size_t kv_dim) {
    float acc[CPU_FAST_MAX_HEAD_DIM], s[CPU_FAST_WINDOW];
    const float scale = 1.0f / sqrtf((float)head_dim);
    float delta = 0.0f;
    for (int d = 0; d < head_dim; d++) delta += dout[d] * out[d], acc[d] = 0.0f;
    for (int t0 = 0; t0 <= last; t0 += CPU_FAST_WINDOW) {
        int len = last + 1 - t0 < CPU_FAST_WINDOW ? last + 1 - t0 : CPU_FAST_WINDOW;
        for (int j = 0; j < len; j++) {
            const float *kt = kbase + (size_t)(t0 + j) * kv_dim;
            float dot = 0.0f;
            for (int d = 0; d < head_dim; d++) dot += q[d] * kt[d];
            s[j] = dot * scale - lse;
        }
        for (int j = len; j < CPU_FAST_WINDOW; j++) s[j] = -INFINITY;
        for (int j = 0; j < CPU_FAST_WINDOW; j++) s[j] = fast_expf_nonpositive(s[j]);
        for (int j = 0; j < len; j++) {
            size_t row = (size_t)(t0 + j) * kv_dim;
            const float *kt = kbase + row, *vt = vbase + row;
            float *dkt = dkbase + row, *dvt = dvbase + row;
            float dp = 0.0f;
            for (int d = 0; d < head_dim; d++) dp += dout[d] * vt[d];
            float p = s[j], ds = p * (dp - delta), sds = scale * ds;
            for (int d = 0; d < head_dim; d++) {
                acc[d] += ds * kt[d];
                dkt[d] += sds * q[d];
                dvt[d] += p * dout[d];
            }
        }
    }
    for (int d = 0; d < head_dim; d++) dq[d] = scale * acc[d];
}

/* attention_backward (backend.h) from out and lse: one OpenMP work item per
 * (slot, KV head), which owns that slot's dK/dV rows of that head and the dq
 * of every (token, query head) reading them, as the reference does (no two
 * threads write one element; tokens in order, so deterministic). */
void cpu_attention_backward_fast(const Backend *be, float *dq, float *dk_cache, float *dv_cache, const float *dout,
                                 const float *q, const float *out, const float *lse, const float *k_cache,
                                 const float *v_cache, const int *slot, const int *pos, int n, int n_heads,
                                 int n_kv_heads, int head_dim, int n_slots, int max_len) {
    int group = n_heads / n_kv_heads;
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    COLT_ASSERT(head_dim <= CPU_FAST_MAX_HEAD_DIM);
#pragma omp parallel for collapse(2) schedule(dynamic, 1) \
    num_threads(cpu_team(be, (double)n * n_heads * (n > 0 ? pos[n - 1] + 1 : 0) * (6.0 * head_dim + 10.0)))
    for (int s = 0; s < n_slots; s++) {
        for (int g = 0; g < n_kv_heads; g++) {
            size_t base = (size_t)s * max_len * kv_dim + (size_t)g * head_dim;
            for (int i = 0; i < n; i++) {
                if (slot[i] != s) continue;
                for (int h = g * group; h < (g + 1) * group; h++) {
                    size_t row = ((size_t)i * n_heads + h) * head_dim;
                    attend_row_backward_fast(dq + row, dk_cache + base, dv_cache + base, dout + row, q + row, out + row,
                                             lse[(size_t)i * n_heads + h], k_cache + base, v_cache + base, pos[i],
                                             head_dim, kv_dim);
                }
            }
        }
    }
}

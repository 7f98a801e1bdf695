/* cpu_backend.c — the fp32 CPU reference backend: the definition of every op.
 *
 * Buffers are plain host float arrays. linear goes through OpenBLAS sgemm
 * (one BLAS thread per call, split over the instance's OpenMP team);
 * everything else is an OpenMP loop on a team sized to the op's work
 * (cpu_team: none at all for the decode step's tiny ops). Attention accumulates in double (online
 * softmax), so it matches transformers' fp32 eager attention to ~1e-6.
 * The training section (backward ops, AdamW) keeps the same rules: sums in
 * double, gradients "+=" where backend.h says so, deterministic order.
 * This is not a fast inference engine: no quantisation, no fused kernels.
 *
 * Dimension legend: N tokens in a call, D model width, H query heads, KVH
 * key/value heads, Dh head dim, S cache slots, L max cache length per slot. */
#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_engine_ops.h"
#include "core/cpu_threads.h"
#include "core/floats.h"
#include "core/rng.h"
#include "core/error.h"

#define CPU_MAX_HEAD_DIM 1024

/* ---------------------------------------------------------------- memory */

/* Every buffer starts CPU_HEADER bytes into its block; the header keeps the
 * size (and whether memory_stats counts it), so free can subtract it, and the
 * block's capacity (a reused block may be larger than asked for). */
#define CPU_HEADER 64
typedef struct CpuBlockHeader {
    size_t bytes, capacity;
    int counted;
} CpuBlockHeader;

/* Freed blocks of CPU_CACHE_MIN bytes or more are kept for the instance's next
 * allocation of up to a quarter less (activations, logits and the engine's pool
 * come back every step and round at about the same sizes). glibc gives such
 * blocks back to the kernel on free, and the next one's pages arrive zeroed by
 * the kernel: 9% of a SmolLM2 GRPO step's CPU time went to that. At most
 * CPU_CACHE_ENTRIES blocks and CPU_CACHE_MAX_BYTES are kept (the oldest go
 * first); memory_stats counts only buffers in use. */
#define CPU_CACHE_MIN ((size_t)1 << 20)
/* Under ASan a kept block's buffer is poisoned until it is handed out again, so
 * a use after free is still reported. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define CPU_CACHE_POISON(block, capacity) ASAN_POISON_MEMORY_REGION((char *)(block) + CPU_HEADER, capacity)
#define CPU_CACHE_UNPOISON(block, capacity) ASAN_UNPOISON_MEMORY_REGION((char *)(block) + CPU_HEADER, capacity)
#else
#define CPU_CACHE_POISON(block, capacity) ((void)(block), (void)(capacity))
#define CPU_CACHE_UNPOISON(block, capacity) ((void)(block), (void)(capacity))
#endif
#define CPU_CACHE_ENTRIES ((int)(sizeof ((CpuContext *)0)->cache / sizeof(void *)))
#define CPU_CACHE_MAX_BYTES ((size_t)4 << 30)

static void *cpu_cache_take(CpuContext *cx, size_t bytes) {
    int best = -1;
    size_t best_capacity = 0;
    for (int i = 0; i < cx->n_cached; i++) {
        size_t capacity = ((const CpuBlockHeader *)cx->cache[i])->capacity;
        if (capacity >= bytes && capacity - bytes <= bytes / 4 && (best < 0 || capacity < best_capacity))
            best = i, best_capacity = capacity;
    }
    if (best < 0) return NULL;
    void *block = cx->cache[best];
    memmove(&cx->cache[best], &cx->cache[best + 1], sizeof(void *) * (size_t)(cx->n_cached - best - 1));
    cx->n_cached--;
    cx->cached_bytes -= best_capacity;
    CPU_CACHE_UNPOISON(block, best_capacity);
    return block;
}

static void cpu_cache_drop_oldest(CpuContext *cx) {
    void *block = cx->cache[0];
    cx->cached_bytes -= ((const CpuBlockHeader *)block)->capacity;
    memmove(&cx->cache[0], &cx->cache[1], sizeof(void *) * (size_t)(cx->n_cached - 1));
    cx->n_cached--;
    CPU_CACHE_UNPOISON(block, ((const CpuBlockHeader *)block)->capacity);
    free(block);
}

static void cpu_cache_put(CpuContext *cx, void *block) {
    size_t capacity = ((const CpuBlockHeader *)block)->capacity;
    if (capacity < CPU_CACHE_MIN || capacity > CPU_CACHE_MAX_BYTES) {
        free(block);
        return;
    }
    while (cx->n_cached > 0 && (cx->n_cached == CPU_CACHE_ENTRIES || cx->cached_bytes + capacity > CPU_CACHE_MAX_BYTES))
        cpu_cache_drop_oldest(cx);
    CPU_CACHE_POISON(block, capacity);
    cx->cache[cx->n_cached++] = block;
    cx->cached_bytes += capacity;
}

static void cpu_cache_clear(CpuContext *cx) {
    while (cx->n_cached > 0) cpu_cache_drop_oldest(cx);
}

static void *cpu_alloc_block(const Backend *be, size_t bytes, int counted) {
    CpuContext *cx = be->ctx;
    size_t capacity = bytes ? bytes : 1;
    void *p = bytes >= CPU_CACHE_MIN ? cpu_cache_take(cx, bytes) : NULL;
    if (p) {
        capacity = ((const CpuBlockHeader *)p)->capacity;
    } else if (posix_memalign(&p, 64, CPU_HEADER + capacity) != 0) {
        cpu_cache_clear(cx); /* what it keeps may be what is missing */
        if (posix_memalign(&p, 64, CPU_HEADER + capacity) != 0) {
            if (!cx->alloc_label[0]) colt_out_of_memory(bytes);
            fprintf(stderr, "colt: out of memory while allocating %s: could not allocate %zu bytes (%.2f GB)\n",
                    cx->alloc_label, bytes, bytes / 1e9);
            exit(1);
        }
    }
    *(CpuBlockHeader *)p = (CpuBlockHeader){.bytes = bytes, .capacity = capacity, .counted = counted};
    if (counted) {
        cx->in_use += bytes;
        if (cx->in_use > cx->peak) cx->peak = cx->in_use;
    }
    return (char *)p + CPU_HEADER;
}

static void *cpu_alloc(const Backend *be, size_t n_elements) { return cpu_alloc_block(be, n_elements * sizeof(float), 1); }

static void cpu_free(const Backend *be, void *buf) {
    if (!buf) return;
    CpuContext *cx = be->ctx;
    void *block = (char *)buf - CPU_HEADER;
    const CpuBlockHeader *h = block;
    if (h->counted) cx->in_use -= h->bytes;
    cpu_cache_put(cx, block);
}

static void cpu_memory_stats(const Backend *be, size_t *in_use, size_t *peak, bool reset_peak) {
    CpuContext *cx = be->ctx;
    if (reset_peak) cx->peak = cx->in_use;
    if (in_use) *in_use = cx->in_use;
    if (peak) *peak = cx->peak;
}

static void cpu_set_alloc_label(const Backend *be, const char *label) {
    CpuContext *cx = be->ctx;
    snprintf(cx->alloc_label, sizeof cx->alloc_label, "%s", label ? label : "");
}

static void cpu_copy_bytes(const Backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
}

static void *cpu_alloc_host(const Backend *be, size_t bytes) {
    (void)be;
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 1) == 0 ? p : NULL;
}

static void cpu_free_host(const Backend *be, void *p) {
    (void)be;
    free(p);
}

static void cpu_upload(const Backend *be, void *dst, const float *src, size_t n) {
    if (n) memcpy(dst, src, n * sizeof(float));
}

static void cpu_download(const Backend *be, float *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n * sizeof(float));
}

static void cpu_copy(const Backend *be, void *dst, size_t dst_offset, const void *src, size_t src_offset, size_t n) {
    if (n) memmove((float *)dst + dst_offset, (const float *)src + src_offset, n * sizeof(float));
}

/* ---------------------------------------------------------------- matmul */

static void cpu_set_batch_invariant(const Backend *be, int on) { ((CpuContext *)be->ctx)->batch_invariant = on != 0; }

static void cpu_set_threads(const Backend *be, int threads) { ((CpuContext *)be->ctx)->threads = threads > 0 ? threads : 1; }

/* linear with one summation order per output, whatever n: 8 interleaved
 * partial sums over k (lane k % 8), added as a fixed tree, then the bias.
 * sgemm's blocking, and so its rounding, changes with the shape. */
static void cpu_linear_invariant(const Backend *be, float *o, const float *x, const float *w, const float *bias, int n, int in_dim,
                                 int out_dim) {
#pragma omp parallel for collapse(2) schedule(static) num_threads(cpu_team(be, 2.0 * n * out_dim * in_dim))
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < out_dim; j++) {
            const float *xi = x + (size_t)i * in_dim, *wj = w + (size_t)j * in_dim;
            float lane[8] = {0};
            int k = 0;
            for (; k + 8 <= in_dim; k += 8)
                for (int e = 0; e < 8; e++) lane[e] += xi[k + e] * wj[k + e];
            for (int e = 0; k + e < in_dim; e++) lane[e] += xi[k + e] * wj[k + e];
            float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
            o[(size_t)i * out_dim + j] = sum + (bias ? bias[j] : 0.0f);
        }
    }
}

/* Multiply-adds a thread's part of a split GEMM must have: above OpenBLAS's
 * own small-size paths (its "small matrix" kernels below 100^3 and the
 * direct sgemm below 28 * 512^2 on AVX-512), which sum in another order, so
 * every part runs the blocked kernel the whole GEMM would, and the split's
 * bits are the unsplit call's. Smaller GEMMs are not worth a second thread. */
#define CPU_GEMM_SPLIT_MNK 8388608.0

/* How this machine's OpenBLAS may be split without changing a bit. Its kernels
 * tile C in blocks whose size depends on the CPU it picked kernels for (16 on
 * AVX-512's, 24 on Haswell's, which AMD Zen 4 gets from 0.3.21), and some sum
 * a tile's columns differently from a whole call's (Haswell's, at any split
 * seen). So each way (rows, columns) and each unit (16, then 48) is tried on
 * a GEMM whose parts are as large as a real split's, once per instance (at its
 * first GEMM worth splitting: ~20 ms), and the first unit whose split equals
 * the whole call is kept (0: none). */
static int cpu_gemm_probe_unit(bool by_columns) {
    /* 96 rows or columns in parts of 16 or 48, each part above CPU_GEMM_SPLIT_MNK as a real split's are
     * (smaller ones take OpenBLAS's small-size paths, which sum in another order) */
    const int m = 96, n = 96, k = 6144;
    float *a = xmalloc(sizeof(float) * m * k), *b = xmalloc(sizeof(float) * n * k);
    float *whole = xmalloc(sizeof(float) * m * n), *split = xmalloc(sizeof(float) * m * n);
    for (int i = 0; i < m * k; i++) a[i] = (float)rng_uniform(91, 0, (uint64_t)i) - 0.5f;
    for (int i = 0; i < n * k; i++) b[i] = (float)rng_uniform(91, 1, (uint64_t)i) - 0.5f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, whole, n);
    const int units[2] = {16, 48};
    int found = 0;
    for (int u = 0; u < 2 && !found; u++) {
        for (int lo = 0; lo < (by_columns ? n : m); lo += units[u]) {
            if (by_columns)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, units[u], k, 1.0f, a, k, b + (size_t)lo * k, k,
                            0.0f, split + lo, n);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, units[u], n, k, 1.0f, a + (size_t)lo * k, k, b, k,
                            0.0f, split + (size_t)lo * n, n);
        }
        if (memcmp(whole, split, sizeof(float) * m * n) == 0) found = units[u];
    }
    free(a), free(b), free(whole), free(split);
    return found;
}

static void cpu_gemm_probe_splits(CpuContext *cx) {
    cx->split_rows_unit = cpu_gemm_probe_unit(false);
    cx->split_cols_unit = cpu_gemm_probe_unit(true);
    cx->split_probed = 1;
}

/* Wide GEMMs where this BLAS cannot split columns bit-safely and rows cannot be
 * split (a decode step's: few rows, many columns): C's columns in fixed blocks,
 * each its own sgemm call whatever the thread count, so the bits depend on the
 * shape alone (they differ from one whole call's in the last place, as any
 * other blocking would). Blocks are at least CPU_GEMM_BLOCK_MIN columns wide,
 * at most CPU_GEMM_BLOCKS of them; a GEMM below CPU_GEMM_BLOCKED_MNK
 * multiply-adds is one call. */
#define CPU_GEMM_BLOCK_MIN 64
#define CPU_GEMM_BLOCKS 64
#define CPU_GEMM_BLOCKED_MNK 2097152.0

static int cpu_gemm_blocks(const CpuContext *cx, int m, int n, int k) {
    if (cx->split_cols_unit > 0 || (cx->split_rows_unit > 0 && m >= 2 * cx->split_rows_unit)) return 0;
    if (n < 2 * CPU_GEMM_BLOCK_MIN || (double)m * n * k < CPU_GEMM_BLOCKED_MNK) return 0;
    int blocks = n / CPU_GEMM_BLOCK_MIN;
    return blocks < CPU_GEMM_BLOCKS ? blocks : CPU_GEMM_BLOCKS;
}

/* C[M, N] = alpha op(A)[M, K] op(B)[K, N] + beta C (row-major): OpenBLAS on
 * one thread per call (the instance sets OpenBLAS to one thread), split over
 * the instance's team by C's columns, or by its rows when it has fewer
 * columns than rows (or its BLAS cannot split columns), in whole multiples of
 * the probed unit (the remainder to the last part). Every element's sum over K
 * is then the one a single call computes (test_backend_ops compares the two bit
 * for bit). Wide GEMMs that neither way can split go in fixed column blocks
 * (cpu_gemm_blocks). Either way the bits do not depend on the thread count. */
static void cpu_gemm(const Backend *be, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                     int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    CpuContext *cx = be->ctx;
    int team = cx->threads;
    double mnk = (double)m * n * k, parts = mnk / CPU_GEMM_SPLIT_MNK;
    /* what the split may be is known before the first GEMM that could be split or blocked, on one thread too:
     * a blocked GEMM's bits must be the same whatever the team */
    if (!cx->split_probed && (parts >= 2 || (mnk >= CPU_GEMM_BLOCKED_MNK && n >= 2 * CPU_GEMM_BLOCK_MIN)))
        cpu_gemm_probe_splits(cx);
    int blocks = cpu_gemm_blocks(cx, m, n, k);
    if (blocks > 0) {
        int block_team = team < blocks ? team : blocks;
        /* block j: columns [lo, hi), lo rounded down to 16 so blocks start on the kernels' tiles */
#pragma omp parallel for schedule(static) num_threads(block_team)
        for (int j = 0; j < blocks; j++) {
            int lo = (int)((int64_t)j * n / blocks) & ~15, hi = j == blocks - 1 ? n : (int)((int64_t)(j + 1) * n / blocks) & ~15;
            cblas_sgemm(CblasRowMajor, ta, tb, m, hi - lo, k, alpha, a, lda, trans_b ? b + (size_t)lo * ldb : b + lo,
                        ldb, beta, c + lo, ldc);
        }
        return;
    }
    if (parts < team) team = (int)parts;
    bool by_columns = cx->split_cols_unit > 0 && (n >= m || cx->split_rows_unit == 0);
    int unit = by_columns ? cx->split_cols_unit : cx->split_rows_unit, len = by_columns ? n : m;
    int units = unit > 0 ? len / unit : 0;
    if (units < team) team = units;
    if (team <= 1) {
        cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(team)
    for (int t = 0; t < team; t++) {
        /* part t: units [t * units / team, (t + 1) * units / team), the last one also the remainder */
        int lo = (int)((int64_t)t * units / team) * unit;
        int hi = t == team - 1 ? len : (int)((int64_t)(t + 1) * units / team) * unit;
        int part = hi - lo;
        if (by_columns)
            cblas_sgemm(CblasRowMajor, ta, tb, m, part, k, alpha, a, lda, trans_b ? b + (size_t)lo * ldb : b + lo, ldb,
                        beta, c + lo, ldc);
        else
            cblas_sgemm(CblasRowMajor, ta, tb, part, n, k, alpha, trans_a ? a + lo : a + (size_t)lo * lda, lda, b, ldb,
                        beta, c + (size_t)lo * ldc, ldc);
    }
}

/* out[N, out_dim] = x[N, in_dim] @ w[out_dim, in_dim]^T (+ bias): one sgemm,
 * with the bias broadcast into out first and beta = 1. */
static void cpu_linear(const Backend *be, void *out, const void *x, const void *w, const void *bias, int n, int in_dim,
                       int out_dim) {
    float *o = out;
    float beta = 0.0f;
    if (n <= 0 || out_dim <= 0) return;
    if (((const CpuContext *)be->ctx)->batch_invariant) {
        cpu_linear_invariant(be, o, x, w, bias, n, in_dim, out_dim);
        return;
    }
    if (bias) {
        const float *b = bias;
        for (int i = 0; i < n; i++) memcpy(o + (size_t)i * out_dim, b, (size_t)out_dim * sizeof(float));
        beta = 1.0f;
    }
    cpu_gemm(be, false, true, n, out_dim, in_dim, 1.0f, x, in_dim, w, in_dim, beta, o, out_dim);
}

/* ---------------------------------------------------------------- norms */

/* out[N, D] = x / sqrt(mean(x^2) + eps) * w; the mean in double, the scale
 * applied in fp32 like transformers (x * rsqrt(var + eps), then * w). */
static void cpu_rmsnorm(const Backend *be, void *out, const void *x, const void *w, int n, int dim, float eps) {
    float *o = out;
    const float *xs = x, *ws = w;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 4.0 * n * dim))
    for (int i = 0; i < n; i++) {
        const float *xi = xs + (size_t)i * dim;
        float *oi = o + (size_t)i * dim;
        double ss = 0.0;
        for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
        float scale = (float)(1.0 / sqrt(ss / dim + (double)eps));
        for (int j = 0; j < dim; j++) oi[j] = ws[j] * (xi[j] * scale);
    }
}

/* ---------------------------------------------------------------- rope */

/* In place on x[N, n_heads, Dh], HF rotate_half layout: dims j and j + Dh/2
 * form a pair rotated by the fp32 angle (float)pos * inv_freq[j], cos/sin in
 * fp32 like transformers' rope (the table is the model's, model_rope_inv_freq).
 * direction +1 is rope, -1 its transpose (the backward). The sign goes on sin,
 * which is exact, so both directions use the very same angles. */
static void rope_rotate(const Backend *be, float *xs, const int *pos, int n, int n_heads, int head_dim, const float *inv_freq,
                        float direction) {
    int half = head_dim / 2;
    COLT_ASSERT(head_dim % 2 == 0 && head_dim <= CPU_MAX_HEAD_DIM);
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, (double)n * (3.0 * n_heads * head_dim + 40.0 * half)))
    for (int i = 0; i < n; i++) {
        float cos_t[CPU_MAX_HEAD_DIM / 2], sin_t[CPU_MAX_HEAD_DIM / 2];
        for (int j = 0; j < half; j++) {
            float angle = (float)pos[i] * inv_freq[j];
            cos_t[j] = cosf(angle);
            sin_t[j] = direction * sinf(angle);
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = xs + ((size_t)i * n_heads + h) * head_dim;
            for (int j = 0; j < half; j++) {
                float a = v[j], b = v[j + half];
                v[j] = a * cos_t[j] - b * sin_t[j];
                v[j + half] = b * cos_t[j] + a * sin_t[j];
            }
        }
    }
}

static void cpu_rope(const Backend *be, void *x, const int *pos, int n, int n_heads, int head_dim,
                     const float *inv_freq) {
    rope_rotate(be, x, pos, n, n_heads, head_dim, inv_freq, 1.0f);
}

/* ---------------------------------------------------------------- attention */

static void cpu_kv_store(const Backend *be, void *k_cache, void *v_cache, const void *k, const void *v, const int *slot,
                         const int *pos, int n, int kv_dim, int max_len) {
    float *kc = k_cache, *vc = v_cache;
    const float *ks = k, *vs = v;
    for (int i = 0; i < n; i++) {
        size_t row = ((size_t)slot[i] * max_len + pos[i]) * kv_dim;
        memcpy(kc + row, ks + (size_t)i * kv_dim, (size_t)kv_dim * sizeof(float));
        memcpy(vc + row, vs + (size_t)i * kv_dim, (size_t)kv_dim * sizeof(float));
    }
}

/* out[N, H*Dh]: token i, head h attends to cache rows 0..pos[i] of slot[i],
 * KV head h / (H/KVH): cpu_attend_row (cpu_paged.c, in double) in deterministic
 * mode, else cpu_attend_row_fast (fp32): the arithmetic of paged_attention. One (token, head) pair per OpenMP iteration. lse, when
 * asked for, is the row's running max and sum as cpu_attend_row ends them
 * (the very sums a second pass over the scores would make, in the same order). */
static void cpu_attention(const Backend *be, void *out, void *lse, const void *q, const void *k_cache, const void *v_cache,
                          const int *slot, const int *pos, int n, int n_heads, int n_kv_heads, int head_dim,
                          int max_len) {
    int group = n_heads / n_kv_heads;
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    CpuAttendRow attend_row = cpu_attend_row_for(be);
    COLT_ASSERT(head_dim <= CPU_MAX_HEAD_DIM);
#pragma omp parallel for collapse(2) schedule(dynamic, 4) num_threads(cpu_team(be, (double)n * n_heads * (n > 0 ? pos[n - 1] + 1 : 0) * (4.0 * head_dim + 40.0)))
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < n_heads; h++) {
            size_t qo = ((size_t)i * n_heads + h) * head_dim, head_offset = (size_t)(h / group) * head_dim;
            attend_row((float *)out + qo, (const float *)q + qo, k_cache, v_cache, NULL, 1, (size_t)slot[i] * max_len,
                       pos[i], head_dim, kv_dim, head_offset, lse ? (float *)lse + (size_t)i * n_heads + h : NULL);
        }
    }
}

/* ---------------------------------------------------------------- elementwise */

static void cpu_swiglu(const Backend *be, void *out, const void *gate, const void *up, size_t n) {
    float *o = out;
    const float *g = gate, *u = up;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 20.0 * n))
    for (size_t i = 0; i < n; i++) {
        float s = g[i] / (1.0f + expf(-g[i]));
        o[i] = s * u[i];
    }
}

static void cpu_add(const Backend *be, void *out, const void *a, const void *b, size_t n) {
    float *o = out;
    const float *x = a, *y = b;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, (double)n))
    for (size_t i = 0; i < n; i++) o[i] = x[i] + y[i];
}

static void cpu_mul_scalar(const Backend *be, void *out, const void *x, float s, size_t n) {
    float *o = out;
    const float *xs = x;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, (double)n))
    for (size_t i = 0; i < n; i++) o[i] = s * xs[i];
}

static void cpu_add_scaled(const Backend *be, void *out, const void *a, const void *b, float s, size_t n) {
    float *o = out;
    const float *x = a, *y = b;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, (double)n))
    for (size_t i = 0; i < n; i++) o[i] = fmaf(s, y[i], x[i]); /* fused, as the CUDA kernel: the same bits */
}

static void cpu_embedding(const Backend *be, void *out, const void *table, const int *ids, int n, int dim) {
    float *o = out;
    const float *t = table;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0)
            memset(o + (size_t)i * dim, 0, (size_t)dim * sizeof(float));
        else
            memcpy(o + (size_t)i * dim, t + (size_t)ids[i] * dim, (size_t)dim * sizeof(float));
    }
}

/* ================================================================ training */
/* Backward ops: gradients named "+=" in backend.h accumulate; every loop that
 * writes a shared gradient is ordered the same way on every run, so results
 * are deterministic (no atomics). */

static void cpu_zero(const Backend *be, void *x, size_t n) {
    if (n) memset(x, 0, n * sizeof(float));
}

/* dx = dy @ w and dw += dy^T @ x as two sgemms; db += column sums of dy in double. */
static void cpu_linear_backward(const Backend *be, void *dx, void *dw, void *db, const void *dy, const void *x, const void *w, int n,
                                int in_dim, int out_dim, int accumulate_dx) {
    if (n <= 0 || out_dim <= 0 || in_dim <= 0) return;
    if (dx)
        cpu_gemm(be, false, false, n, in_dim, out_dim, 1.0f, dy, out_dim, w, in_dim, accumulate_dx ? 1.0f : 0.0f, dx,
                 in_dim);
    if (dw)
        cpu_gemm(be, true, false, out_dim, in_dim, n, 1.0f, dy, out_dim, x, in_dim, 1.0f, dw, in_dim);
    if (db) {
        float *b = db;
        const float *g = dy;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, (double)n * out_dim))
        for (int o = 0; o < out_dim; o++) {
            double s = 0.0;
            for (int i = 0; i < n; i++) s += g[(size_t)i * out_dim + o];
            b[o] += (float)s;
        }
    }
}

/* Row-parallel dx (each row's r and mean(g*x) in double); dw accumulated
 * serially over rows afterwards, so its sum order is fixed. */
static void cpu_rmsnorm_backward(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int n, int dim,
                                 float eps) {
    float *dxs = dx, *dws = dw;
    const float *dys = dy, *xs = x, *ws = w;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 8.0 * n * dim))
    for (int i = 0; i < n; i++) {
        const float *xi = xs + (size_t)i * dim, *gi = dys + (size_t)i * dim;
        float *di = dxs + (size_t)i * dim;
        double ss = 0.0, gx = 0.0;
        for (int j = 0; j < dim; j++) {
            ss += (double)xi[j] * xi[j];
            gx += (double)gi[j] * ws[j] * xi[j];
        }
        double r = 1.0 / sqrt(ss / dim + (double)eps);
        double c = r * r * r * gx / dim;
        for (int j = 0; j < dim; j++) di[j] += (float)(r * ((double)gi[j] * ws[j]) - c * xi[j]);
    }
    if (!dws) return;
    for (int i = 0; i < n; i++) {
        const float *xi = xs + (size_t)i * dim, *gi = dys + (size_t)i * dim;
        double ss = 0.0;
        for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
        float r = (float)(1.0 / sqrt(ss / dim + (double)eps));
        for (int j = 0; j < dim; j++) dws[j] += gi[j] * (xi[j] * r);
    }
}

/* The transpose of rope's rotation is the rotation by -angle. */
static void cpu_rope_backward(const Backend *be, void *dx, const int *pos, int n, int n_heads, int head_dim,
                              const float *inv_freq) {
    rope_rotate(be, dx, pos, n, n_heads, head_dim, inv_freq, -1.0f);
}

static void cpu_kv_gather(const Backend *be, void *k, void *v, const void *k_cache, const void *v_cache, const int *slot,
                          const int *pos, int n, int kv_dim, int max_len) {
    float *ks = k, *vs = v;
    const float *kc = k_cache, *vc = v_cache;
    for (int i = 0; i < n; i++) {
        size_t row = ((size_t)slot[i] * max_len + pos[i]) * kv_dim;
        memcpy(ks + (size_t)i * kv_dim, kc + row, (size_t)kv_dim * sizeof(float));
        memcpy(vs + (size_t)i * kv_dim, vc + row, (size_t)kv_dim * sizeof(float));
    }
}

/* One OpenMP work item per (slot, KV head): it owns that slot's dK/dV rows of
 * that head and the dq of every (token, query head) that reads them, so no two
 * threads write the same element (deterministic, no atomics). Per (token i,
 * head h), all in double: (1) scores s_t and their max, (2) e_t = exp(s_t - max),
 * l = sum e_t, dP_t = dout_i . v_t and delta = sum_t P_t dP_t, (3) dS_t =
 * P_t (dP_t - delta), dq += scale dS_t k_t, dk_t += scale dS_t q_i, dv_t +=
 * P_t dout_i. s_t, e_t and dP_t are kept on the stack for the first
 * ATTN_BWD_CACHE positions and recomputed beyond. */
#define ATTN_BWD_CACHE 2048

static double attn_dot(const float *a, const float *b, int n) {
    double s = 0.0;
    for (int d = 0; d < n; d++) s += (double)a[d] * b[d];
    return s;
}

static void cpu_attention_backward(const Backend *be, void *dq, void *dk_cache, void *dv_cache, const void *dout, const void *q,
                                   const void *out, const void *lse, const void *k_cache, const void *v_cache,
                                   const int *slot, const int *pos, int n, int n_heads, int n_kv_heads, int head_dim,
                                   int n_slots, int max_len) {
    if (!((const CpuContext *)be->ctx)->batch_invariant && out && lse) { /* the fast path, from the forward's statistics */
        cpu_attention_backward_fast(be, dq, dk_cache, dv_cache, dout, q, out, lse, k_cache, v_cache, slot, pos, n, n_heads,
                                    n_kv_heads, head_dim, n_slots, max_len);
        return;
    }
    /* the reference recomputes the statistics in double */
    float *dqs = dq, *dkc = dk_cache, *dvc = dv_cache;
    const float *dos = dout, *qs = q, *kc = k_cache, *vc = v_cache;
    int group = n_heads / n_kv_heads;
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    double scale = 1.0 / sqrt((double)head_dim);
    COLT_ASSERT(head_dim <= CPU_MAX_HEAD_DIM);
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(cpu_team(be, (double)n * n_heads * (n > 0 ? pos[n - 1] + 1 : 0) * (8.0 * head_dim + 40.0)))
    for (int s = 0; s < n_slots; s++) {
        for (int g = 0; g < n_kv_heads; g++) {
            double acc[CPU_MAX_HEAD_DIM], e_buf[ATTN_BWD_CACHE], dp_buf[ATTN_BWD_CACHE];
            size_t base = (size_t)s * max_len * kv_dim + (size_t)g * head_dim;
            const float *kbase = kc + base, *vbase = vc + base;
            float *dkbase = dkc + base, *dvbase = dvc + base;
            for (int i = 0; i < n; i++) {
                if (slot[i] != s) continue;
                for (int h = g * group; h < (g + 1) * group; h++) {
                    const float *qi = qs + ((size_t)i * n_heads + h) * head_dim;
                    const float *gi = dos + ((size_t)i * n_heads + h) * head_dim;
                    int len = pos[i] + 1;
                    double m = -INFINITY;
                    for (int t = 0; t < len; t++) {
                        double sc = scale * attn_dot(qi, kbase + (size_t)t * kv_dim, head_dim);
                        if (t < ATTN_BWD_CACHE) e_buf[t] = sc;
                        if (sc > m) m = sc;
                    }
                    double l = 0.0, delta = 0.0;
                    for (int t = 0; t < len; t++) {
                        double sc = t < ATTN_BWD_CACHE ? e_buf[t] : scale * attn_dot(qi, kbase + (size_t)t * kv_dim, head_dim);
                        double e = exp(sc - m), dp = attn_dot(gi, vbase + (size_t)t * kv_dim, head_dim);
                        if (t < ATTN_BWD_CACHE) e_buf[t] = e, dp_buf[t] = dp;
                        l += e;
                        delta += e * dp;
                    }
                    delta /= l;
                    for (int d = 0; d < head_dim; d++) acc[d] = 0.0;
                    for (int t = 0; t < len; t++) {
                        const float *kt = kbase + (size_t)t * kv_dim;
                        float *dkt = dkbase + (size_t)t * kv_dim, *dvt = dvbase + (size_t)t * kv_dim;
                        double e, dp;
                        if (t < ATTN_BWD_CACHE) {
                            e = e_buf[t], dp = dp_buf[t];
                        } else {
                            e = exp(scale * attn_dot(qi, kt, head_dim) - m);
                            dp = attn_dot(gi, vbase + (size_t)t * kv_dim, head_dim);
                        }
                        double p = e / l, ds = p * (dp - delta), sds = scale * ds;
                        for (int d = 0; d < head_dim; d++) {
                            acc[d] += ds * kt[d];
                            dkt[d] += (float)(sds * qi[d]);
                            dvt[d] += (float)(p * gi[d]);
                        }
                    }
                    float *dqi = dqs + ((size_t)i * n_heads + h) * head_dim;
                    for (int d = 0; d < head_dim; d++) dqi[d] = (float)(scale * acc[d]);
                }
            }
        }
    }
}

/* silu'(g) = s (1 + g (1 - s)), s = sigmoid(g); in double. */
static void cpu_swiglu_backward(const Backend *be, void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                                size_t n) {
    float *dg = dgate, *du = dup;
    const float *go = dout, *g = gate, *u = up;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 40.0 * n))
    for (size_t i = 0; i < n; i++) {
        double x = g[i], sig = 1.0 / (1.0 + exp(-x));
        double o = go[i];
        dg[i] = (float)(o * u[i] * sig * (1.0 + x * (1.0 - sig)));
        du[i] = (float)(o * x * sig);
    }
}

/* Serial over tokens (repeated ids add in token order). */
static void cpu_embedding_backward(const Backend *be, void *dtable, const void *dout, const int *ids, int n, int dim) {
    float *t = dtable;
    const float *g = dout;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0) continue;
        float *row = t + (size_t)ids[i] * dim;
        const float *gi = g + (size_t)i * dim;
        for (int j = 0; j < dim; j++) row[j] += gi[j];
    }
}

/* Row max, log-sum-exp and sum p*z of z = logits / temperature, in double. */
static void row_softmax_stats(const float *row, int vocab, double inv_t, double *max_out, double *lse_out,
                              double *pz_out) {
    double mx = -INFINITY;
    for (int v = 0; v < vocab; v++) mx = fmax(mx, row[v] * inv_t);
    double sum = 0.0, pz = 0.0;
    for (int v = 0; v < vocab; v++) {
        double z = row[v] * inv_t, e = exp(z - mx);
        sum += e;
        pz += e * z;
    }
    *max_out = mx;
    *lse_out = mx + log(sum);
    *pz_out = pz / sum;
}

static void cpu_log_softmax_target(const Backend *be, void *logprobs, void *entropy, const void *logits, const int *targets, int n,
                                   int vocab, float temperature) {
    float *lp = logprobs, *ent = entropy;
    const float *lg = logits;
    double inv_t = 1.0 / (double)temperature;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 20.0 * n * vocab))
    for (int i = 0; i < n; i++) {
        if (targets[i] < 0) {
            lp[i] = 0.0f;
            if (ent) ent[i] = 0.0f;
            continue;
        }
        const float *row = lg + (size_t)i * vocab;
        double mx, lse, pz;
        row_softmax_stats(row, vocab, inv_t, &mx, &lse, &pz);
        lp[i] = (float)(row[targets[i]] * inv_t - lse);
        if (ent) ent[i] = (float)(lse - pz);
    }
}

static void cpu_log_softmax_target_backward(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                            const void *dlogprobs, int n, int vocab, float temperature) {
    float *dl = dlogits;
    const float *lg = logits, *dlp = dlogprobs;
    double inv_t = 1.0 / (double)temperature;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 20.0 * n * vocab))
    for (int i = 0; i < n; i++) {
        const float *row = lg + (size_t)i * vocab;
        float *drow = dl + (size_t)i * vocab;
        if (targets[i] < 0) {
            memset(drow, 0, (size_t)vocab * sizeof(float));
            continue;
        }
        double mx, lse, pz;
        row_softmax_stats(row, vocab, inv_t, &mx, &lse, &pz);
        double g = (double)dlp[i] * inv_t;
        for (int v = 0; v < vocab; v++) drow[v] = (float)(-g * exp(row[v] * inv_t - lse));
        drow[targets[i]] += (float)g;
    }
}

/* The entropy's part: d H / d z_v = -p_v (z_v - sum_u p_u z_u), H = -sum p log p. */
static void cpu_log_softmax_entropy_backward(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                             const void *dlogprobs, const void *dentropy, int n, int vocab,
                                             float temperature) {
    float *dl = dlogits;
    const float *lg = logits, *dlp = dlogprobs, *dh = dentropy;
    double inv_t = 1.0 / (double)temperature;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 20.0 * n * vocab))
    for (int i = 0; i < n; i++) {
        const float *row = lg + (size_t)i * vocab;
        float *drow = dl + (size_t)i * vocab;
        if (targets[i] < 0) {
            memset(drow, 0, (size_t)vocab * sizeof(float));
            continue;
        }
        double mx, lse, pz;
        row_softmax_stats(row, vocab, inv_t, &mx, &lse, &pz);
        double g = (double)dlp[i] * inv_t, gh = (double)dh[i] * inv_t;
        int tgt = targets[i];
        for (int v = 0; v < vocab; v++) { /* in place: row[v] is read before drow[v] is written */
            double z = row[v] * inv_t, p = exp(z - lse);
            drow[v] = (float)(-g * p - gh * p * (z - pz) + (v == tgt ? g : 0.0));
        }
    }
}

static void cpu_log_softmax_shard_entropy_backward(const Backend *be, void *dlogits, const void *logits,
                                                   const int *targets, const void *dlogprobs, const void *dentropy,
                                                   const void *lse, const void *pz, int n, int vocab,
                                                   float temperature) {
    float *dl = dlogits;
    const float *lg = logits, *dlp = dlogprobs, *dh = dentropy, *ls = lse, *pzs = pz;
    double inv_t = 1.0 / (double)temperature;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 20.0 * n * vocab))
    for (int i = 0; i < n; i++) {
        const float *row = lg + (size_t)i * vocab;
        float *drow = dl + (size_t)i * vocab;
        double g = (double)dlp[i] * inv_t, gh = (double)dh[i] * inv_t;
        for (int v = 0; v < vocab; v++) { /* in place: row[v] is read before drow[v] is written */
            double z = row[v] * inv_t, p = exp(z - (double)ls[i]);
            drow[v] = (float)(-g * p - gh * p * (z - (double)pzs[i]) + (v == targets[i] ? g : 0.0));
        }
    }
}

static void cpu_logits_shard_stats(const Backend *be, void *stats, const void *logits, const int *targets, int n,
                                   int vocab, float temperature) {
    float *out = stats;
    const float *lg = logits;
    double inv_t = 1.0 / (double)temperature;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 20.0 * n * vocab))
    for (int i = 0; i < n; i++) {
        const float *row = lg + (size_t)i * vocab;
        double mx = -INFINITY, sum = 0.0, sz = 0.0;
        for (int v = 0; v < vocab; v++) mx = fmax(mx, row[v] * inv_t);
        for (int v = 0; v < vocab; v++) {
            double z = row[v] * inv_t, e = exp(z - mx);
            sum += e;
            sz += e * z;
        }
        out[4 * i + 0] = (float)mx;
        out[4 * i + 1] = (float)sum;
        out[4 * i + 2] = (float)sz;
        out[4 * i + 3] = targets[i] >= 0 ? (float)(row[targets[i]] * inv_t) : 0.0f;
    }
}

static void cpu_log_softmax_shard_backward(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                           const void *dlogprobs, const void *lse, int n, int vocab, float temperature) {
    float *dl = dlogits;
    const float *lg = logits, *dlp = dlogprobs, *ls = lse;
    double inv_t = 1.0 / (double)temperature;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 20.0 * n * vocab))
    for (int i = 0; i < n; i++) {
        const float *row = lg + (size_t)i * vocab;
        float *drow = dl + (size_t)i * vocab;
        double g = (double)dlp[i] * inv_t;
        for (int v = 0; v < vocab; v++) drow[v] = (float)(-g * exp(row[v] * inv_t - (double)ls[i]));
        if (targets[i] >= 0) drow[targets[i]] += (float)g;
    }
}

static void cpu_copy_2d(const Backend *be, void *dst, size_t dst_stride, const void *src, size_t src_stride, int rows,
                        int cols) {
    for (int r = 0; r < rows; r++)
        memcpy((float *)dst + (size_t)r * dst_stride, (const float *)src + (size_t)r * src_stride,
               (size_t)cols * sizeof(float));
}

/* The AdamW element loop, one clone per instruction set (resolved when the
 * program loads), as parallel/host_adamw.c's: the two forms of the first
 * moment (which one depends on w1 alone) are separate loops, so each
 * vectorises (sqrtf without errno: CMakeLists.txt). Every element's
 * expressions are cpu_adamw's reference order, so the bits do not change. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CPU_CLONES
#endif

CPU_CLONES static void adamw_block(float *restrict p, float *restrict ms, float *restrict vs, const float *restrict g,
                                   size_t n, float decay, float w1, float w2, float beta2, float step_size,
                                   float bc2_sqrt, float eps) {
    if (w1 < 0.5f) {
        for (size_t i = 0; i < n; i++) {
            float gi = g[i], pi = p[i] * decay, mi = ms[i] + w1 * (gi - ms[i]);
            float vi = vs[i] * beta2 + w2 * (gi * gi);
            float denom = sqrtf(vi) / bc2_sqrt + eps;
            p[i] = pi + -step_size * (mi / denom);
            ms[i] = mi, vs[i] = vi;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float gi = g[i], pi = p[i] * decay, mi = gi - (gi - ms[i]) * (1.0f - w1);
            float vi = vs[i] * beta2 + w2 * (gi * gi);
            float denom = sqrtf(vi) / bc2_sqrt + eps;
            p[i] = pi + -step_size * (mi / denom);
            ms[i] = mi, vs[i] = vi;
        }
    }
}

/* torch.optim.AdamW (single-tensor path): the first moment uses lerp as torch
 * does (m + w (g - m), w = 1 - beta1, for w < 0.5), the rest in torch's order;
 * scalars folded in double then rounded to fp32 like torch's python scalars.
 * Blocks of 8192 elements spread over the team. */
static void cpu_adamw(const Backend *be, void *param, void *master, const void *grad, void *m, void *v, size_t n, float lr, float beta1, float beta2,
                      float eps, float weight_decay, float bias_correction1, float bias_correction2) {
    COLT_ASSERT(master == NULL);  /* fp32 storage: the optimizer updates param itself */
    float *p = param, *ms = m, *vs = v;
    const float *g = grad;
    float decay = (float)(1.0 - (double)lr * weight_decay);
    /* torch computes 1 - beta from the Python float the user wrote (0.999, not 0.999f). */
    float w1 = (float)(1.0 - float_as_decimal(beta1)), w2 = (float)(1.0 - float_as_decimal(beta2));
    float step_size = (float)((double)lr / bias_correction1);
    float bc2_sqrt = (float)sqrt((double)bias_correction2);
    const size_t block = 8192, blocks = (n + block - 1) / block;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 10.0 * n))
    for (size_t b = 0; b < blocks; b++) {
        size_t i0 = b * block, len = n - i0 < block ? n - i0 : block;
        adamw_block(p + i0, ms + i0, vs + i0, g + i0, len, decay, w1, w2, beta2, step_size, bc2_sqrt, eps);
    }
}

static double cpu_sum_squares(const Backend *be, const void *x, size_t n) {
    const float *xs = x;
    double s = 0.0;
#pragma omp parallel for reduction(+ : s) schedule(static) num_threads(((const CpuContext *)be->ctx)->threads)
    for (size_t i = 0; i < n; i++) s += (double)xs[i] * xs[i];
    return s;
}

static void cpu_scale(const Backend *be, void *x, float s, size_t n) {
    float *xs = x;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, (double)n))
    for (size_t i = 0; i < n; i++) xs[i] *= s;
}

static void cpu_add_f32(const Backend *be, void *y, const void *x, size_t n) {
    float *ys = y;
    const float *xs = x;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, (double)n))
    for (size_t i = 0; i < n; i++) ys[i] += xs[i];
}

static void cpu_dropout(const Backend *be, void *out, const void *x, size_t n, float p, uint64_t seed, uint64_t stream) {
    (void)be;
    float *o = out, scale = 1.0f / (1.0f - p);
    const float *xs = x;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 20.0 * n))
    for (size_t i = 0; i < n; i++) o[i] = rng_uniform(seed, stream, i) >= p ? xs[i] * scale : 0.0f;
}

static void cpu_gather_rows(const Backend *be, void *dst, const void *src, const int *rows, int n, int dim) {
    for (int i = 0; i < n; i++)
        memcpy((float *)dst + (size_t)i * dim, (const float *)src + (size_t)rows[i] * dim, sizeof(float) * (size_t)dim);
}

static void cpu_scatter_rows(const Backend *be, void *dst, const void *src, const int *rows, int n, int dim) {
    for (int i = 0; i < n; i++)
        memcpy((float *)dst + (size_t)rows[i] * dim, (const float *)src + (size_t)i * dim, sizeof(float) * (size_t)dim);
}

/* ================================================================ engine */
/* [i32] buffers are host int arrays here, so the i32 ops are the plain ones. */

static void *cpu_alloc_i32(const Backend *be, size_t n) {
    void *p = cpu_alloc_block(be, (n ? n : 1) * sizeof(int), 0);
    memset(p, 0, (n ? n : 1) * sizeof(int));
    return p;
}
static void cpu_upload_i32(const Backend *be, void *dst, const int *src, size_t n) { memcpy(dst, src, n * sizeof(int)); }
static void cpu_download_i32(const Backend *be, int *dst, const void *src, size_t n) { memcpy(dst, src, n * sizeof(int)); }
static void cpu_embedding_i32(const Backend *be, void *out, const void *table, const void *ids, int n, int dim) {
    cpu_embedding(be, out, table, ids, n, dim);
}
static void cpu_vocab_shard_ids_i32(const Backend *be, void *out, const void *ids, int n, int lo, int hi) {
    int *o = out;
    const int *in = ids;
    for (int i = 0; i < n; i++) o[i] = in[i] >= lo && in[i] < hi ? in[i] - lo : -1;
}
static void cpu_rope_i32(const Backend *be, void *x, const void *pos, int n, int n_heads, int head_dim,
                         const float *inv_freq) {
    cpu_rope(be, x, pos, n, n_heads, head_dim, inv_freq);
}
static void cpu_gather_rows_i32(const Backend *be, void *dst, const void *src, const void *rows, int n, int dim) {
    cpu_gather_rows(be, dst, src, rows, n, dim);
}

static void cpu_close_instance(Backend *be);

/* The op table every CPU instance copies. */
static const Backend CPU_OPS = {
    .name = "cpu",
    .device_kind = BACKEND_DEVICE_CPU, /* no streams, no NCCL: the capability pointers stay NULL */
    .close_instance = cpu_close_instance,
    .storage = DTYPE_F32,
    .logits_chunk_rows = 64,
    .alloc = cpu_alloc,
    .alloc_f32 = cpu_alloc,  /* storage is fp32: one kind of buffer */
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .upload_f32 = cpu_upload,
    .download_f32 = cpu_download,
    .copy = cpu_copy,
    .copy_to_host = cpu_copy_bytes,
    .copy_from_host = cpu_copy_bytes,
    .alloc_host = cpu_alloc_host,
    .free_host = cpu_free_host,
    .memory_stats = cpu_memory_stats,
    .set_alloc_label = cpu_set_alloc_label,
    .gather_rows = cpu_gather_rows,
    .scatter_rows = cpu_scatter_rows,
    .linear = cpu_linear,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .mul_scalar = cpu_mul_scalar,
    .add_scaled = cpu_add_scaled,
    .embedding = cpu_embedding,
    .adamw = cpu_adamw,
    .sum_squares = cpu_sum_squares,
    .scale = cpu_scale,
    .add_f32 = cpu_add_f32,
    .dropout = cpu_dropout,
    .zero = cpu_zero,
    .zero_f32 = cpu_zero,
    .linear_backward = cpu_linear_backward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_backward = cpu_rope_backward,
    .kv_gather = cpu_kv_gather,
    .attention_backward = cpu_attention_backward,
    .swiglu_backward = cpu_swiglu_backward,
    .embedding_backward = cpu_embedding_backward,
    .log_softmax_target = cpu_log_softmax_target,
    .log_softmax_target_backward = cpu_log_softmax_target_backward,
    .log_softmax_entropy_backward = cpu_log_softmax_entropy_backward,
    .logits_shard_stats = cpu_logits_shard_stats,
    .log_softmax_shard_backward = cpu_log_softmax_shard_backward,
    .log_softmax_shard_entropy_backward = cpu_log_softmax_shard_entropy_backward,
    .copy_2d = cpu_copy_2d,
    .vocab_shard_ids_i32 = cpu_vocab_shard_ids_i32,
    .alloc_i32 = cpu_alloc_i32,
    .upload_i32 = cpu_upload_i32,
    .download_i32 = cpu_download_i32,
    .embedding_i32 = cpu_embedding_i32,
    .rope_i32 = cpu_rope_i32,
    .gather_rows_i32 = cpu_gather_rows_i32,
    .paged_kv_store = cpu_paged_kv_store,
    .paged_attention = cpu_paged_attention,
    .sample = cpu_sample,
    .apply_penalties = cpu_apply_penalties,
    .apply_token_bitmask = cpu_apply_token_bitmask,
    .add_rmsnorm = cpu_add_rmsnorm,
    .qkv_rope_store = cpu_qkv_rope_store,
    .swiglu_gate_up = cpu_swiglu_gate_up,
    .set_batch_invariant = cpu_set_batch_invariant,
    .set_threads = cpu_set_threads,
};

/* OpenBLAS's thread count is the library's one global (0.3.21 has no
 * per-call count): one thread, so that the instance's OpenMP team is the only
 * set of threads computing, and no BLAS thread spins beside it. */
static void cpu_blas_one_thread(void) { openblas_set_num_threads(1); }

Backend *backend_cpu_open(void) {
    Backend *be = xmalloc(sizeof *be);
    *be = CPU_OPS;
    be->device = 0;
    CpuContext *cx = xcalloc(1, sizeof(CpuContext));
    cx->threads = cpu_threads_for_rank(0, 1, NULL); /* a world of one until the mesh says otherwise */
    be->ctx = cx;
    cpu_blas_one_thread();
    return be;
}

static void cpu_close_instance(Backend *be) {
    cpu_cache_clear(be->ctx);
    free(be->ctx);
    free(be);
}

/* The shared instance, made on first use and kept for the process's life. */
const Backend *backend_cpu(void) {
    static CpuContext shared_ctx;
    static Backend shared;
    if (!shared.ctx) {
        shared = CPU_OPS;
        shared.ctx = &shared_ctx;
        shared.close_instance = NULL; /* not closable */
        shared_ctx.threads = cpu_threads_for_rank(0, 1, NULL);
        cpu_blas_one_thread();
    }
    return &shared;
}

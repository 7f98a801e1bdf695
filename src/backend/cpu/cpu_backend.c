/* cpu_backend.c — the fp32 CPU reference backend: the definition of every op.
 *
 * Buffers are plain host float arrays. linear goes through OpenBLAS sgemm;
 * everything else is an OpenMP loop. Attention accumulates in double (online
 * softmax), so it matches transformers' fp32 eager attention to ~1e-6.
 * This is not a fast inference engine: no quantisation, no fused kernels.
 *
 * Dimension legend: N tokens in a call, D model width, H query heads, KVH
 * key/value heads, Dh head dim, S cache slots, L max cache length per slot. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"

#define CPU_MAX_HEAD_DIM 1024

/* ---------------------------------------------------------------- memory */

static void *cpu_alloc(size_t n_elements) {
    void *p = NULL;
    size_t bytes = (n_elements ? n_elements : 1) * sizeof(float);
    if (posix_memalign(&p, 64, bytes) != 0) colt_abort(__FILE__, __LINE__, "out of memory");
    return p;
}

static void cpu_free(void *buf) { free(buf); }

static void cpu_upload(void *dst, const float *src, size_t n) {
    if (n) memcpy(dst, src, n * sizeof(float));
}

static void cpu_download(float *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n * sizeof(float));
}

static void cpu_copy(void *dst, size_t dst_offset, const void *src, size_t src_offset, size_t n) {
    if (n) memmove((float *)dst + dst_offset, (const float *)src + src_offset, n * sizeof(float));
}

/* ---------------------------------------------------------------- matmul */

/* out[N, out_dim] = x[N, in_dim] @ w[out_dim, in_dim]^T (+ bias): one sgemm,
 * with the bias broadcast into out first and beta = 1. */
static void cpu_linear(void *out, const void *x, const void *w, const void *bias, int n, int in_dim,
                       int out_dim) {
    float *o = out;
    float beta = 0.0f;
    if (n <= 0 || out_dim <= 0) return;
    if (bias) {
        const float *b = bias;
        for (int i = 0; i < n; i++) memcpy(o + (size_t)i * out_dim, b, (size_t)out_dim * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out_dim, in_dim, 1.0f, x, in_dim, w, in_dim, beta,
                o, out_dim);
}

/* ---------------------------------------------------------------- norms */

/* out[N, D] = x / sqrt(mean(x^2) + eps) * w; the mean in double, the scale
 * applied in fp32 like transformers (x * rsqrt(var + eps), then * w). */
static void cpu_rmsnorm(void *out, const void *x, const void *w, int n, int dim, float eps) {
    float *o = out;
    const float *xs = x, *ws = w;
#pragma omp parallel for schedule(static)
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
 * form a pair rotated by pos * inv_freq[j], inv_freq[j] = 1 / theta^(2j/Dh).
 * inv_freq, the angle and its cos/sin are fp32 like transformers' default rope. */
static void cpu_rope(void *x, const int *pos, int n, int n_heads, int head_dim, float theta) {
    float *xs = x;
    int half = head_dim / 2;
    COLT_ASSERT(head_dim % 2 == 0 && head_dim <= CPU_MAX_HEAD_DIM);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        float cos_t[CPU_MAX_HEAD_DIM / 2], sin_t[CPU_MAX_HEAD_DIM / 2];
        for (int j = 0; j < half; j++) {
            float exponent = (float)(2 * j) / (float)head_dim;
            float inv_freq = 1.0f / powf(theta, exponent);
            float angle = (float)pos[i] * inv_freq;
            cos_t[j] = cosf(angle);
            sin_t[j] = sinf(angle);
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

/* ---------------------------------------------------------------- attention */

static void cpu_kv_store(void *k_cache, void *v_cache, const void *k, const void *v, const int *slot,
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
 * KV head h / (H/KVH). One (token, head) pair per OpenMP iteration; scores,
 * the running max/sum (online softmax) and the weighted sum are in double. */
static void cpu_attention(void *out, const void *q, const void *k_cache, const void *v_cache, const int *slot,
                          const int *pos, int n, int n_heads, int n_kv_heads, int head_dim, int max_len) {
    float *o = out;
    const float *qs = q, *kc = k_cache, *vc = v_cache;
    int group = n_heads / n_kv_heads;
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    double scale = 1.0 / sqrt((double)head_dim);
    COLT_ASSERT(head_dim <= CPU_MAX_HEAD_DIM);
#pragma omp parallel for collapse(2) schedule(dynamic, 4)
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < n_heads; h++) {
            double acc[CPU_MAX_HEAD_DIM];
            const float *qi = qs + ((size_t)i * n_heads + h) * head_dim;
            const float *kbase = kc + (size_t)slot[i] * max_len * kv_dim + (size_t)(h / group) * head_dim;
            const float *vbase = vc + (size_t)slot[i] * max_len * kv_dim + (size_t)(h / group) * head_dim;
            double m = -INFINITY, l = 0.0;
            for (int d = 0; d < head_dim; d++) acc[d] = 0.0;
            for (int t = 0; t <= pos[i]; t++) {
                const float *kt = kbase + (size_t)t * kv_dim, *vt = vbase + (size_t)t * kv_dim;
                double s = 0.0;
                for (int d = 0; d < head_dim; d++) s += (double)qi[d] * kt[d];
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
            float *oi = o + ((size_t)i * n_heads + h) * head_dim;
            for (int d = 0; d < head_dim; d++) oi[d] = (float)(acc[d] / l);
        }
    }
}

/* ---------------------------------------------------------------- elementwise */

static void cpu_swiglu(void *out, const void *gate, const void *up, size_t n) {
    float *o = out;
    const float *g = gate, *u = up;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float s = g[i] / (1.0f + expf(-g[i]));
        o[i] = s * u[i];
    }
}

static void cpu_add(void *out, const void *a, const void *b, size_t n) {
    float *o = out;
    const float *x = a, *y = b;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) o[i] = x[i] + y[i];
}

static void cpu_embedding(void *out, const void *table, const int *ids, int n, int dim) {
    float *o = out;
    const float *t = table;
    for (int i = 0; i < n; i++)
        memcpy(o + (size_t)i * dim, t + (size_t)ids[i] * dim, (size_t)dim * sizeof(float));
}

static const Backend CPU_BACKEND = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .linear = cpu_linear,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .embedding = cpu_embedding,
};

const Backend *backend_cpu(void) { return &CPU_BACKEND; }

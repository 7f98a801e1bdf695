/* cpu_fused.c — the CPU reference of the decode step's fused ops (backend.h,
 * "generation engine"): add_rmsnorm, qkv_rope_store, swiglu_gate_up.
 *
 * Each is bit-identical to the unfused op sequence it replaces because it
 * evaluates the very same fp32/double expressions, in the same order, as
 * cpu_add, cpu_rmsnorm, cpu_rope (rope_rotate), cpu_paged_kv_store and
 * cpu_swiglu in cpu_backend.c / cpu_paged.c; only the loops are merged. Those
 * expressions are repeated here, so a change to one of them must be made in
 * both places (tests/test_fused.c compares the two bit for bit). Not a fast
 * path: on the CPU the fusion only saves passes over memory.
 *
 * Dimension legend: N tokens in a call, D row width, F MLP width, H query
 * heads, KVH key/value heads, Dh head dim. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_engine_ops.h"
#include "core/error.h"

#define CPU_FUSED_MAX_HEAD_DIM 1024

/* Row by row: x = x + delta (cpu_add), then the sum of squares of the new x in
 * double, the scale in double then fp32, w * (x * scale) (cpu_rmsnorm). */
void cpu_add_rmsnorm(const Backend *be, void *x, void *xn, const void *delta, const void *w, int n, int dim, float eps) {
    float *xs = x, *o = xn;
    const float *ds = delta, *ws = w;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 5.0 * n * dim))
    for (int i = 0; i < n; i++) {
        float *xi = xs + (size_t)i * dim, *oi = o + (size_t)i * dim;
        const float *di = ds + (size_t)i * dim;
        for (int j = 0; j < dim; j++) xi[j] = xi[j] + di[j];
        double ss = 0.0;
        for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
        float scale = (float)(1.0 / sqrt(ss / dim + (double)eps));
        for (int j = 0; j < dim; j++) oi[j] = ws[j] * (xi[j] * scale);
    }
}

/* rope_rotate's rotation of one head, out of place: dst may not alias src. */
static void rope_head(float *dst, const float *src, const float *cos_t, const float *sin_t, int half) {
    for (int j = 0; j < half; j++) {
        float a = src[j], b = src[j + half];
        dst[j] = a * cos_t[j] - b * sin_t[j];
        dst[j + half] = b * cos_t[j] + a * sin_t[j];
    }
}

/* Per token: the cos/sin tables exactly as rope_rotate builds them (angle,
 * cosf/sinf in fp32), the q heads rotated into q, and for a real token
 * (slot >= 0) the k heads rotated into its k_pool row and the v part copied
 * into its v_pool row, as paged_kv_store copies them. */
void cpu_qkv_rope_store(const Backend *be, void *q, void *k_pool, void *v_pool, const void *qkv, const void *pos,
                        const void *slot_mapping, int n, int n_heads, int n_kv_heads, int head_dim,
                        const float *inv_freq) {
    float *qs = q, *kp = k_pool, *vp = v_pool;
    const float *src = qkv;
    const int *positions = pos, *slots = slot_mapping;
    int half = head_dim / 2;
    size_t q_dim = (size_t)n_heads * head_dim, kv_dim = (size_t)n_kv_heads * head_dim, row = q_dim + 2 * kv_dim;
    COLT_ASSERT(head_dim % 2 == 0 && head_dim <= CPU_FUSED_MAX_HEAD_DIM);
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, (double)n * (3.0 * (n_heads + n_kv_heads) * head_dim + 40.0 * half)))
    for (int i = 0; i < n; i++) {
        float cos_t[CPU_FUSED_MAX_HEAD_DIM / 2], sin_t[CPU_FUSED_MAX_HEAD_DIM / 2];
        for (int j = 0; j < half; j++) {
            float angle = (float)positions[i] * inv_freq[j];
            cos_t[j] = cosf(angle);
            sin_t[j] = sinf(angle);
        }
        const float *qi = src + (size_t)i * row, *ki = qi + q_dim, *vi = ki + kv_dim;
        for (int h = 0; h < n_heads; h++)
            rope_head(qs + ((size_t)i * n_heads + h) * head_dim, qi + (size_t)h * head_dim, cos_t, sin_t, half);
        if (slots[i] < 0) continue;
        float *k_row = kp + (size_t)slots[i] * kv_dim, *v_row = vp + (size_t)slots[i] * kv_dim;
        for (int h = 0; h < n_kv_heads; h++)
            rope_head(k_row + (size_t)h * head_dim, ki + (size_t)h * head_dim, cos_t, sin_t, half);
        memcpy(v_row, vi, kv_dim * sizeof(float));
    }
}

/* out[i, j] = silu(gate_up[i, j]) * gate_up[i, f + j], cpu_swiglu's expression. */
void cpu_swiglu_gate_up(const Backend *be, void *out, const void *gate_up, int n, int f) {
    float *o = out;
    const float *gu = gate_up;
#pragma omp parallel for schedule(static) num_threads(cpu_team(be, 20.0 * n * f))
    for (int i = 0; i < n; i++) {
        const float *g = gu + (size_t)i * 2 * f, *u = g + f;
        float *oi = o + (size_t)i * f;
        for (int j = 0; j < f; j++) {
            float s = g[j] / (1.0f + expf(-g[j]));
            oi[j] = s * u[j];
        }
    }
}

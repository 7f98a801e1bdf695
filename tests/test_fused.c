/* test_fused.c — the CPU backend's fused decode ops (cpu_fused.c) against the
 * unfused op sequences they replace, on the same backend: every output must be
 * bit-identical (memcmp), since the fused ops promise exactly that.
 *
 *   add_rmsnorm(x, xn, delta, w)      == add(x, x, delta); rmsnorm(xn, x, w)
 *   qkv_rope_store(q, pools, qkv)     == copy the q, k, v parts out of qkv;
 *                                        rope_i32(q); rope_i32(k);
 *                                        paged_kv_store(pools, k, v)
 *   swiglu_gate_up(out, gate_up)      == copy the halves out; swiglu(out, gate, up)
 *
 * Shapes of Qwen2.5 0.5B / 1.5B / 7B at N = 1, 7 and 128 tokens, and odd ones.
 * qkv_rope_store gets a padding token (slot -1) from N = 7 up; the pools start
 * random and are compared whole, so a write to a row nobody owns shows.
 *
 * Dimension legend: N tokens, D model width, F MLP width, H query heads, KVH
 * key/value heads, Dh head dim. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "rope_table.h"

static int g_failures = 0, g_checks = 0;
static uint64_t g_counter = 0;

static float *rand_floats(size_t n, float scale) {
    float *x = xmalloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(31, 0, g_counter++);
    return x;
}

static int rand_int(int lo, int hi) { /* inclusive */
    int r = lo + (int)(rng_uniform(37, 0, g_counter++) * (float)(hi - lo + 1));
    return r > hi ? hi : r;
}

static void *buffer_from(const Backend *be, const float *src, size_t n) {
    void *buf = be->alloc(be, n);
    be->upload(be, buf, src, n);
    return buf;
}

static void *i32_from(const Backend *be, const int *src, size_t n) {
    void *buf = be->alloc_i32(be, n);
    be->upload_i32(be, buf, src, n);
    return buf;
}

/* Downloads both buffers and counts elements whose bits differ; one line per check. */
static void check_identical(const Backend *be, const char *what, const void *fused, const void *unfused, size_t n) {
    float *a = xmalloc((n ? n : 1) * sizeof(float)), *b = xmalloc((n ? n : 1) * sizeof(float));
    be->download(be, a, fused, n);
    be->download(be, b, unfused, n);
    size_t n_diff = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && n_diff++ == 0) first = i;
    int ok = n > 0 && n_diff == 0;
    g_checks++;
    if (!ok) g_failures++;
    printf("%s %-64s %zu of %zu elements differ\n", ok ? "ok  " : "FAIL", what, n_diff, n);
    if (n_diff) printf("     first at [%zu]: fused %.9g unfused %.9g\n", first, (double)a[first], (double)b[first]);
    free(a), free(b);
}

/* ---------------------------------------------------------------- add_rmsnorm */

static void test_add_rmsnorm(const Backend *be, int n, int dim) {
    char name[160];
    size_t nx = (size_t)n * dim;
    float eps = 1e-6f;
    float *x = rand_floats(nx, 3.0f), *delta = rand_floats(nx, 1.0f), *w = rand_floats((size_t)dim, 1.0f);
    void *x_fused = buffer_from(be, x, nx), *x_unfused = buffer_from(be, x, nx), *d = buffer_from(be, delta, nx);
    void *g = buffer_from(be, w, (size_t)dim), *xn_fused = be->alloc(be, nx), *xn_unfused = be->alloc(be, nx);
    be->add_rmsnorm(be, x_fused, xn_fused, d, g, n, dim, eps);
    be->add(be, x_unfused, x_unfused, d, nx);
    be->rmsnorm(be, xn_unfused, x_unfused, g, n, dim, eps);
    snprintf(name, sizeof name, "add_rmsnorm [%d,%d]: x == add", n, dim);
    check_identical(be, name, x_fused, x_unfused, nx);
    snprintf(name, sizeof name, "add_rmsnorm [%d,%d]: xn == rmsnorm(add)", n, dim);
    check_identical(be, name, xn_fused, xn_unfused, nx);
    free(x), free(delta), free(w);
    be->free(be, x_fused), be->free(be, x_unfused), be->free(be, d), be->free(be, g), be->free(be, xn_fused), be->free(be, xn_unfused);
}

/* ---------------------------------------------------------------- qkv_rope_store */

static void test_qkv_rope_store(const Backend *be, int n, int heads, int kv_heads, int head_dim, float theta,
                                const char *label) {
    char name[160];
    int q_dim = heads * head_dim, kv_dim = kv_heads * head_dim, row = q_dim + 2 * kv_dim;
    int pool_rows = n + 37; /* rows nobody writes stay as they were */
    size_t n_qkv = (size_t)n * row, n_pool = (size_t)pool_rows * kv_dim;
    int *pos = xmalloc((size_t)n * sizeof(int)), *slots = xmalloc((size_t)n * sizeof(int));
    int *rows = xmalloc((size_t)pool_rows * sizeof(int));
    for (int r = 0; r < pool_rows; r++) rows[r] = r;
    for (int r = pool_rows - 1; r > 0; r--) { /* distinct slots in shuffled order */
        int j = rand_int(0, r), t = rows[r];
        rows[r] = rows[j], rows[j] = t;
    }
    for (int i = 0; i < n; i++) pos[i] = i == 0 ? 2000 : rand_int(0, 2000), slots[i] = rows[i];
    if (n >= 7) slots[n / 2] = -1; /* padding */
    float *qkv = rand_floats(n_qkv, 1.0f), *kp = rand_floats(n_pool, 1.0f), *vp = rand_floats(n_pool, 1.0f);
    void *d_qkv = buffer_from(be, qkv, n_qkv), *d_pos = i32_from(be, pos, (size_t)n);
    void *d_slots = i32_from(be, slots, (size_t)n);
    void *q_fused = be->alloc(be, (size_t)n * q_dim), *q_unfused = be->alloc(be, (size_t)n * q_dim);
    void *kp_fused = buffer_from(be, kp, n_pool), *vp_fused = buffer_from(be, vp, n_pool);
    void *kp_unfused = buffer_from(be, kp, n_pool), *vp_unfused = buffer_from(be, vp, n_pool);
    void *k = be->alloc(be, (size_t)n * kv_dim), *v = be->alloc(be, (size_t)n * kv_dim);

    be->qkv_rope_store(be, q_fused, kp_fused, vp_fused, d_qkv, d_pos, d_slots, n, heads, kv_heads, head_dim, rope_table(head_dim, theta));
    for (int i = 0; i < n; i++) {
        size_t src = (size_t)i * row;
        be->copy(be, q_unfused, (size_t)i * q_dim, d_qkv, src, (size_t)q_dim);
        be->copy(be, k, (size_t)i * kv_dim, d_qkv, src + q_dim, (size_t)kv_dim);
        be->copy(be, v, (size_t)i * kv_dim, d_qkv, src + q_dim + kv_dim, (size_t)kv_dim);
    }
    be->rope_i32(be, q_unfused, d_pos, n, heads, head_dim, rope_table(head_dim, theta));
    be->rope_i32(be, k, d_pos, n, kv_heads, head_dim, rope_table(head_dim, theta));
    be->paged_kv_store(be, kp_unfused, vp_unfused, k, v, d_slots, n, kv_dim);

    const char *pad = n >= 7 ? ", 1 padding" : "";
    snprintf(name, sizeof name, "qkv_rope_store %s H=%d KVH=%d Dh=%d N=%d%s: q", label, heads, kv_heads, head_dim, n,
             pad);
    check_identical(be, name, q_fused, q_unfused, (size_t)n * q_dim);
    snprintf(name, sizeof name, "qkv_rope_store %s H=%d KVH=%d Dh=%d N=%d%s: k pool", label, heads, kv_heads,
             head_dim, n, pad);
    check_identical(be, name, kp_fused, kp_unfused, n_pool);
    snprintf(name, sizeof name, "qkv_rope_store %s H=%d KVH=%d Dh=%d N=%d%s: v pool", label, heads, kv_heads,
             head_dim, n, pad);
    check_identical(be, name, vp_fused, vp_unfused, n_pool);
    free(pos), free(slots), free(rows), free(qkv), free(kp), free(vp);
    be->free(be, d_qkv), be->free(be, d_pos), be->free(be, d_slots), be->free(be, q_fused), be->free(be, q_unfused);
    be->free(be, kp_fused), be->free(be, vp_fused), be->free(be, kp_unfused), be->free(be, vp_unfused), be->free(be, k), be->free(be, v);
}

/* ---------------------------------------------------------------- swiglu_gate_up */

static void test_swiglu_gate_up(const Backend *be, int n, int f) {
    char name[160];
    size_t no = (size_t)n * f;
    float *gate_up = rand_floats(2 * no, 2.0f);
    void *d_gate_up = buffer_from(be, gate_up, 2 * no), *gate = be->alloc(be, no), *up = be->alloc(be, no);
    void *out_fused = be->alloc(be, no), *out_unfused = be->alloc(be, no);
    be->swiglu_gate_up(be, out_fused, d_gate_up, n, f);
    for (int i = 0; i < n; i++) {
        be->copy(be, gate, (size_t)i * f, d_gate_up, (size_t)i * 2 * f, (size_t)f);
        be->copy(be, up, (size_t)i * f, d_gate_up, (size_t)i * 2 * f + f, (size_t)f);
    }
    be->swiglu(be, out_unfused, gate, up, no);
    snprintf(name, sizeof name, "swiglu_gate_up [%d,2*%d] == swiglu(gate, up)", n, f);
    check_identical(be, name, out_fused, out_unfused, no);
    free(gate_up);
    be->free(be, d_gate_up), be->free(be, gate), be->free(be, up), be->free(be, out_fused), be->free(be, out_unfused);
}

/* ---------------------------------------------------------------- driver */

typedef struct QwenShape {
    int dim, heads, kv_heads, head_dim, mlp;
    const char *label;
} QwenShape;

int main(void) {
    const Backend *be = backend_cpu();
    const QwenShape qwen[3] = {{896, 14, 2, 64, 4864, "0.5B"},
                               {1536, 12, 2, 128, 8960, "1.5B"},
                               {3584, 28, 4, 128, 18944, "7B"}};
    const int tokens[3] = {1, 7, 128};
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < 3; t++) {
            test_add_rmsnorm(be, tokens[t], qwen[s].dim);
            test_qkv_rope_store(be, tokens[t], qwen[s].heads, qwen[s].kv_heads, qwen[s].head_dim, 1000000.0f,
                                qwen[s].label);
            test_swiglu_gate_up(be, tokens[t], qwen[s].mlp);
        }
    /* Odd shapes: a width that is no multiple of 8, tiny heads, no GQA. */
    test_add_rmsnorm(be, 5, 75);
    test_qkv_rope_store(be, 9, 4, 2, 8, 10000.0f, "tiny");
    test_qkv_rope_store(be, 7, 6, 6, 72, 10000.0f, "MHA");
    test_swiglu_gate_up(be, 5, 75);

    printf("test_fused: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}

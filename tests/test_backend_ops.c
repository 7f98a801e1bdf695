/* test_backend_ops.c — every CPU op against a naive double-precision
 * reference on random inputs, with a stated tolerance per op; prints the max
 * abs error of each. (The CUDA backend will be tested against the CPU one.)
 *
 * Dimension legend: N tokens, D width, H query heads, KVH key/value heads,
 * Dh head dim, S cache slots, L max cache length, F MLP width, V vocab. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"

static int g_failures = 0;
static uint64_t g_stream = 0;

static float *rand_floats(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    uint64_t s = g_stream++;
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(7, s, i);
    return x;
}

static void *to_device(const Backend *be, const float *x, size_t n) {
    void *d = be->alloc(n);
    be->upload(d, x, n);
    return d;
}

static float *from_device(const Backend *be, const void *d, size_t n) {
    float *x = malloc(n * sizeof(float));
    be->download(x, d, n);
    return x;
}

/* max |got - ref|, reported against tol */
static void report(const char *op, const float *got, const double *ref, size_t n, double tol) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= worst)) worst = d; /* NaN counts as worst */
    }
    int ok = worst <= tol;
    printf("%s %-40s max |err| = %.3g (tol %.0e)\n", ok ? "ok  " : "FAIL", op, worst, tol);
    if (!ok) g_failures++;
}

static void test_linear(const Backend *be, int with_bias) {
    int n = 37, in = 96, out = 80;
    float *x = rand_floats((size_t)n * in, 1.0f), *w = rand_floats((size_t)out * in, 0.1f), *b = rand_floats(out, 1.0f);
    void *dx = to_device(be, x, (size_t)n * in), *dw = to_device(be, w, (size_t)out * in), *db = to_device(be, b, out);
    void *dout = be->alloc((size_t)n * out);
    be->linear(dout, dx, dw, with_bias ? db : NULL, n, in, out);
    float *got = from_device(be, dout, (size_t)n * out);
    double *ref = malloc((size_t)n * out * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double s = with_bias ? b[o] : 0.0;
            for (int k = 0; k < in; k++) s += (double)x[(size_t)i * in + k] * w[(size_t)o * in + k];
            ref[(size_t)i * out + o] = s;
        }
    report(with_bias ? "linear (bias) [37,96]x[80,96]^T" : "linear (no bias) [37,96]x[80,96]^T", got, ref,
           (size_t)n * out, 1e-5);
    free(x), free(w), free(b), free(got), free(ref);
    be->free(dx), be->free(dw), be->free(db), be->free(dout);
}

static void test_rmsnorm(const Backend *be) {
    int n = 9, d = 72;
    float eps = 1e-5f;
    float *x = rand_floats((size_t)n * d, 3.0f), *w = rand_floats(d, 1.0f);
    void *dx = to_device(be, x, (size_t)n * d), *dw = to_device(be, w, d), *dout = be->alloc((size_t)n * d);
    be->rmsnorm(dout, dx, dw, n, d, eps);
    float *got = from_device(be, dout, (size_t)n * d);
    double *ref = malloc((size_t)n * d * sizeof(double));
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int j = 0; j < d; j++) ss += (double)x[i * d + j] * x[i * d + j];
        double r = 1.0 / sqrt(ss / d + eps);
        for (int j = 0; j < d; j++) ref[i * d + j] = x[i * d + j] * r * w[j];
    }
    report("rmsnorm [9,72]", got, ref, (size_t)n * d, 1e-5);
    free(x), free(w), free(got), free(ref);
    be->free(dx), be->free(dw), be->free(dout);
}

static void test_rope(const Backend *be) {
    int n = 6, heads = 3, dh = 32;
    float theta = 10000.0f;
    int pos[6] = {0, 1, 7, 63, 100, 255};
    size_t total = (size_t)n * heads * dh;
    float *x = rand_floats(total, 1.0f);
    void *dx = to_device(be, x, total);
    be->rope(dx, pos, n, heads, dh, theta);
    float *got = from_device(be, dx, total);
    double *ref = malloc(total * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++)
            for (int j = 0; j < dh / 2; j++) {
                double f = pos[i] * pow((double)theta, -2.0 * j / dh);
                size_t base = ((size_t)i * heads + h) * dh;
                double a = x[base + j], b = x[base + j + dh / 2];
                ref[base + j] = a * cos(f) - b * sin(f);
                ref[base + j + dh / 2] = b * cos(f) + a * sin(f);
            }
    /* fp32 angles (as transformers computes them) lose ~pos * 6e-8 rad */
    report("rope [6,3,32] pos up to 255", got, ref, total, 1e-4);
    free(x), free(got), free(ref);
    be->free(dx);
}

/* kv_store + attention with GQA, tokens of three slots at mixed positions. */
static void test_attention(const Backend *be) {
    int S = 3, L = 40, H = 6, KVH = 2, Dh = 16, kvd = KVH * Dh;
    int n = 5;
    int slot[5] = {2, 0, 1, 2, 0}, pos[5] = {9, 0, 39, 10, 31};
    size_t cache_n = (size_t)S * L * kvd;
    float *kc = rand_floats(cache_n, 1.0f), *vc = rand_floats(cache_n, 1.0f);
    float *q = rand_floats((size_t)n * H * Dh, 1.0f), *k = rand_floats((size_t)n * kvd, 1.0f),
          *v = rand_floats((size_t)n * kvd, 1.0f);
    void *dkc = to_device(be, kc, cache_n), *dvc = to_device(be, vc, cache_n), *dq = to_device(be, q, (size_t)n * H * Dh),
         *dk = to_device(be, k, (size_t)n * kvd), *dv = to_device(be, v, (size_t)n * kvd),
         *dout = be->alloc((size_t)n * H * Dh);
    be->kv_store(dkc, dvc, dk, dv, slot, pos, n, kvd, L);
    for (int i = 0; i < n; i++) { /* the reference cache */
        memcpy(kc + ((size_t)slot[i] * L + pos[i]) * kvd, k + (size_t)i * kvd, (size_t)kvd * sizeof(float));
        memcpy(vc + ((size_t)slot[i] * L + pos[i]) * kvd, v + (size_t)i * kvd, (size_t)kvd * sizeof(float));
    }
    float *got_k = from_device(be, dkc, cache_n);
    double *ref_k = malloc(cache_n * sizeof(double));
    for (size_t i = 0; i < cache_n; i++) ref_k[i] = kc[i];
    report("kv_store [3,40,32] (5 tokens)", got_k, ref_k, cache_n, 0.0);
    be->attention(dout, dq, dkc, dvc, slot, pos, n, H, KVH, Dh, L);
    float *got = from_device(be, dout, (size_t)n * H * Dh);
    double *ref = calloc((size_t)n * H * Dh, sizeof(double));
    double *p = malloc((size_t)L * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) {
            int kh = h / (H / KVH);
            double mx = -INFINITY, sum = 0;
            for (int t = 0; t <= pos[i]; t++) {
                double s = 0;
                for (int d = 0; d < Dh; d++)
                    s += (double)q[((size_t)i * H + h) * Dh + d] * kc[((size_t)slot[i] * L + t) * kvd + kh * Dh + d];
                p[t] = s / sqrt((double)Dh);
                mx = fmax(mx, p[t]);
            }
            for (int t = 0; t <= pos[i]; t++) sum += (p[t] = exp(p[t] - mx));
            for (int t = 0; t <= pos[i]; t++)
                for (int d = 0; d < Dh; d++)
                    ref[((size_t)i * H + h) * Dh + d] +=
                        p[t] / sum * vc[((size_t)slot[i] * L + t) * kvd + kh * Dh + d];
        }
    report("attention GQA H=6 KVH=2 Dh=16, 3 slots", got, ref, (size_t)n * H * Dh, 1e-6);
    free(kc), free(vc), free(q), free(k), free(v), free(got), free(ref), free(p), free(got_k), free(ref_k);
    be->free(dkc), be->free(dvc), be->free(dq), be->free(dk), be->free(dv), be->free(dout);
}

static void test_elementwise(const Backend *be) {
    size_t n = 1000;
    float *g = rand_floats(n, 4.0f), *u = rand_floats(n, 1.0f);
    void *dg = to_device(be, g, n), *du = to_device(be, u, n), *dout = be->alloc(n);
    double *ref = malloc(n * sizeof(double));
    be->swiglu(dout, dg, du, n);
    float *got = from_device(be, dout, n);
    for (size_t i = 0; i < n; i++) ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
    report("swiglu [1000]", got, ref, n, 1e-5); /* fp32 expf, |out| up to ~30 */
    free(got);
    be->add(dg, dg, du, n); /* out aliases a */
    got = from_device(be, dg, n);
    for (size_t i = 0; i < n; i++) ref[i] = (double)g[i] + u[i];
    report("add [1000] (out aliases a)", got, ref, n, 1e-5); /* one fp32 rounding */
    free(got);
    /* copy: rows 3..5 of u into the middle of out */
    be->upload(dout, g, n);
    be->copy(dout, 100, du, 300, 200);
    got = from_device(be, dout, n);
    for (size_t i = 0; i < n; i++) ref[i] = (i >= 100 && i < 300) ? u[i + 200] : g[i];
    report("copy [200 of 1000]", got, ref, n, 0.0);
    free(g), free(u), free(got), free(ref);
    be->free(dg), be->free(du), be->free(dout);
}

static void test_embedding(const Backend *be) {
    int V = 50, D = 24, n = 7;
    int ids[7] = {0, 49, 3, 3, 17, 1, 48};
    float *table = rand_floats((size_t)V * D, 1.0f);
    void *dt = to_device(be, table, (size_t)V * D), *dout = be->alloc((size_t)n * D);
    be->embedding(dout, dt, ids, n, D);
    float *got = from_device(be, dout, (size_t)n * D);
    double *ref = malloc((size_t)n * D * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < D; j++) ref[i * D + j] = table[ids[i] * D + j];
    report("embedding [50,24] x 7 ids", got, ref, (size_t)n * D, 0.0);
    free(table), free(got), free(ref);
    be->free(dt), be->free(dout);
}

int main(void) {
    const Backend *be = backend_cpu();
    printf("backend: %s\n", be->name);
    test_linear(be, 0);
    test_linear(be, 1);
    test_rmsnorm(be);
    test_rope(be);
    test_attention(be);
    test_elementwise(be);
    test_embedding(be);
    printf("%s: %d failures\n", g_failures ? "FAILED" : "OK", g_failures);
    return g_failures ? 1 : 0;
}

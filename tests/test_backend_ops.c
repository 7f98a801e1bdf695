/* test_backend_ops.c — every CPU op against a naive double-precision
 * reference on random inputs, with a stated tolerance per op; prints the max
 * abs error of each. Training ops (backward, optimizer) are checked against
 * analytic or finite-difference double references. (The CUDA backend will be tested against the CPU one.)
 *
 * Dimension legend: N tokens, D width, H query heads, KVH key/value heads,
 * Dh head dim, S cache slots, L max cache length, F MLP width, V vocab. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/profile.h"
#include "core/error.h"
#include "core/rng.h"
#include "rope_table.h"

static int g_failures = 0;
static uint64_t g_stream = 0;

static float *rand_floats(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    uint64_t s = g_stream++;
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(7, s, i);
    return x;
}

static void *to_device(const Backend *be, const float *x, size_t n) {
    void *d = be->alloc(be, n);
    be->upload(be, d, x, n);
    return d;
}

static float *from_device(const Backend *be, const void *d, size_t n) {
    float *x = malloc(n * sizeof(float));
    be->download(be, x, d, n);
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
    void *dout = be->alloc(be, (size_t)n * out);
    be->linear(be, dout, dx, dw, with_bias ? db : NULL, n, in, out);
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
    be->free(be, dx), be->free(be, dw), be->free(be, db), be->free(be, dout);
}

static void test_rmsnorm(const Backend *be) {
    int n = 9, d = 72;
    float eps = 1e-5f;
    float *x = rand_floats((size_t)n * d, 3.0f), *w = rand_floats(d, 1.0f);
    void *dx = to_device(be, x, (size_t)n * d), *dw = to_device(be, w, d), *dout = be->alloc(be, (size_t)n * d);
    be->rmsnorm(be, dout, dx, dw, n, d, eps);
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
    be->free(be, dx), be->free(be, dw), be->free(be, dout);
}

static void test_rope(const Backend *be) {
    int n = 6, heads = 3, dh = 32;
    float theta = 10000.0f;
    int pos[6] = {0, 1, 7, 63, 100, 255};
    size_t total = (size_t)n * heads * dh;
    float *x = rand_floats(total, 1.0f);
    void *dx = to_device(be, x, total);
    be->rope(be, dx, pos, n, heads, dh, rope_table(dh, theta));
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
    be->free(be, dx);
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
         *dout = be->alloc(be, (size_t)n * H * Dh);
    be->kv_store(be, dkc, dvc, dk, dv, slot, pos, n, kvd, L);
    for (int i = 0; i < n; i++) { /* the reference cache */
        memcpy(kc + ((size_t)slot[i] * L + pos[i]) * kvd, k + (size_t)i * kvd, (size_t)kvd * sizeof(float));
        memcpy(vc + ((size_t)slot[i] * L + pos[i]) * kvd, v + (size_t)i * kvd, (size_t)kvd * sizeof(float));
    }
    float *got_k = from_device(be, dkc, cache_n);
    double *ref_k = malloc(cache_n * sizeof(double));
    for (size_t i = 0; i < cache_n; i++) ref_k[i] = kc[i];
    report("kv_store [3,40,32] (5 tokens)", got_k, ref_k, cache_n, 0.0);
    void *dlse = be->alloc_f32(be, (size_t)n * H);
    be->attention(be, dout, dlse, dq, dkc, dvc, slot, pos, n, H, KVH, Dh, L);
    float *got = from_device(be, dout, (size_t)n * H * Dh), *got_lse = malloc((size_t)n * H * sizeof(float));
    be->download_f32(be, got_lse, dlse, (size_t)n * H);
    double *ref = calloc((size_t)n * H * Dh, sizeof(double)), *ref_lse = malloc((size_t)n * H * sizeof(double));
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
            ref_lse[(size_t)i * H + h] = mx + log(sum);
            for (int t = 0; t <= pos[i]; t++)
                for (int d = 0; d < Dh; d++)
                    ref[((size_t)i * H + h) * Dh + d] +=
                        p[t] / sum * vc[((size_t)slot[i] * L + t) * kvd + kh * Dh + d];
        }
    report("attention GQA H=6 KVH=2 Dh=16, 3 slots", got, ref, (size_t)n * H * Dh, 1e-6);
    report("attention lse [f32] (log-sum-exp per row)", got_lse, ref_lse, (size_t)n * H, 1e-5);
    free(kc), free(vc), free(q), free(k), free(v), free(got), free(ref), free(p), free(got_k), free(ref_k);
    free(got_lse), free(ref_lse);
    be->free(be, dkc), be->free(be, dvc), be->free(be, dq), be->free(be, dk), be->free(be, dv), be->free(be, dout), be->free(be, dlse);
}

static void test_elementwise(const Backend *be) {
    size_t n = 1000;
    float *g = rand_floats(n, 4.0f), *u = rand_floats(n, 1.0f);
    void *dg = to_device(be, g, n), *du = to_device(be, u, n), *dout = be->alloc(be, n);
    double *ref = malloc(n * sizeof(double));
    be->swiglu(be, dout, dg, du, n);
    float *got = from_device(be, dout, n);
    for (size_t i = 0; i < n; i++) ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
    report("swiglu [1000]", got, ref, n, 1e-5); /* fp32 expf, |out| up to ~30 */
    free(got);
    be->add(be, dg, dg, du, n); /* out aliases a */
    got = from_device(be, dg, n);
    for (size_t i = 0; i < n; i++) ref[i] = (double)g[i] + u[i];
    report("add [1000] (out aliases a)", got, ref, n, 1e-5); /* one fp32 rounding */
    free(got);
    /* copy: rows 3..5 of u into the middle of out */
    be->upload(be, dout, g, n);
    be->copy(be, dout, 100, du, 300, 200);
    got = from_device(be, dout, n);
    for (size_t i = 0; i < n; i++) ref[i] = (i >= 100 && i < 300) ? u[i + 200] : g[i];
    report("copy [200 of 1000]", got, ref, n, 0.0);
    free(g), free(u), free(got), free(ref);
    be->free(be, dg), be->free(be, du), be->free(be, dout);
}

/* dropout: kept exactly where rng_uniform(seed, stream, i) >= p, scaled by 1 / (1 - p); about 1 - p kept. */
static void test_dropout(const Backend *be) {
    size_t n = 100000;
    float p = 0.25f, scale = 1.0f / (1.0f - p), *x = rand_floats(n, 2.0f);
    void *dx = to_device(be, x, n);
    be->dropout(be, dx, dx, n, p, 42, 7); /* in place */
    float *got = from_device(be, dx, n);
    size_t kept = 0, wrong = 0;
    for (size_t i = 0; i < n; i++) {
        bool keep = rng_uniform(42, 7, i) >= p;
        kept += keep;
        if (got[i] != (keep ? x[i] * scale : 0.0f)) wrong++;
    }
    double frac = (double)kept / n, sigma = sqrt(p * (1 - p) / n);
    bool ok = wrong == 0 && fabs(frac - (1 - p)) < 5 * sigma;
    printf("%s dropout p 0.25 [%zu] in place: %zu values off the mask's, %.4f kept (1 - p = 0.75, 5 sigma %.4f)\n",
           ok ? "ok  " : "FAIL", n, wrong, frac, 5 * sigma);
    if (!ok) g_failures++;
    free(x), free(got);
    be->free(be, dx);
}

static void test_embedding(const Backend *be) {
    int V = 50, D = 24, n = 7;
    int ids[7] = {0, 49, 3, 3, 17, 1, 48};
    float *table = rand_floats((size_t)V * D, 1.0f);
    void *dt = to_device(be, table, (size_t)V * D), *dout = be->alloc(be, (size_t)n * D);
    be->embedding(be, dout, dt, ids, n, D);
    float *got = from_device(be, dout, (size_t)n * D);
    double *ref = malloc((size_t)n * D * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < D; j++) ref[i * D + j] = table[ids[i] * D + j];
    report("embedding [50,24] x 7 ids", got, ref, (size_t)n * D, 0.0);
    free(table), free(got), free(ref);
    be->free(be, dt), be->free(be, dout);
}

static void test_gather_scatter(const Backend *be) {
    int rows_total = 20, D = 24, n = 6;
    int rows[6] = {19, 0, 7, 3, 12, 8};
    float *src = rand_floats((size_t)rows_total * D, 1.0f);
    void *dsrc = to_device(be, src, (size_t)rows_total * D), *dg = be->alloc(be, (size_t)n * D);
    be->gather_rows(be, dg, dsrc, rows, n, D);
    float *got = from_device(be, dg, (size_t)n * D);
    double *ref = malloc((size_t)rows_total * D * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < D; j++) ref[i * D + j] = src[rows[i] * D + j];
    report("gather_rows 6 of [20,24]", got, ref, (size_t)n * D, 0.0);
    /* scatter back into a copy of src: the rows land where they came from. */
    be->scatter_rows(be, dsrc, dg, rows, n, D);
    float *back = from_device(be, dsrc, (size_t)rows_total * D);
    for (size_t e = 0; e < (size_t)rows_total * D; e++) ref[e] = src[e];
    report("scatter_rows 6 into [20,24]", back, ref, (size_t)rows_total * D, 0.0);
    free(src), free(got), free(back), free(ref);
    be->free(be, dsrc), be->free(be, dg);
}

/* ================================================================ training ops
 * Backward ops against double references: analytic where the formula is
 * independent of the kernel's, central finite differences (h = 1e-5 on a
 * double forward, error ~1e-9) for rmsnorm, attention and log-softmax. The
 * "+=" outputs start from random values to check they accumulate. */

static double *to_double(const float *x, size_t n) {
    double *d = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static void test_linear_backward(const Backend *be, int accumulate_dx) {
    int n = 13, in = 40, out = 24;
    float *x = rand_floats((size_t)n * in, 1.0f), *w = rand_floats((size_t)out * in, 0.3f),
          *dy = rand_floats((size_t)n * out, 1.0f), *dx0 = rand_floats((size_t)n * in, 1.0f),
          *dw0 = rand_floats((size_t)out * in, 1.0f), *db0 = rand_floats(out, 1.0f);
    void *gx = to_device(be, x, (size_t)n * in), *gw = to_device(be, w, (size_t)out * in),
         *gdy = to_device(be, dy, (size_t)n * out), *gdx = to_device(be, dx0, (size_t)n * in),
         *gdw = to_device(be, dw0, (size_t)out * in), *gdb = to_device(be, db0, out);
    be->linear_backward(be, gdx, gdw, gdb, gdy, gx, gw, n, in, out, accumulate_dx);
    float *got_dx = from_device(be, gdx, (size_t)n * in), *got_dw = from_device(be, gdw, (size_t)out * in),
          *got_db = from_device(be, gdb, out);
    double *ref_dx = malloc((size_t)n * in * sizeof(double)), *ref_dw = malloc((size_t)out * in * sizeof(double)),
           *ref_db = malloc(out * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int k = 0; k < in; k++) {
            double s = accumulate_dx ? dx0[i * in + k] : 0.0;
            for (int o = 0; o < out; o++) s += (double)dy[i * out + o] * w[o * in + k];
            ref_dx[i * in + k] = s;
        }
    for (int o = 0; o < out; o++) {
        double sb = db0[o];
        for (int i = 0; i < n; i++) sb += dy[i * out + o];
        ref_db[o] = sb;
        for (int k = 0; k < in; k++) {
            double s = dw0[o * in + k];
            for (int i = 0; i < n; i++) s += (double)dy[i * out + o] * x[i * in + k];
            ref_dw[o * in + k] = s;
        }
    }
    report(accumulate_dx ? "linear_backward dx (+=) [13,24]x[24,40]" : "linear_backward dx (=) [13,24]x[24,40]",
           got_dx, ref_dx, (size_t)n * in, 1e-5);
    report("linear_backward dw (+=) [24,40]", got_dw, ref_dw, (size_t)out * in, 1e-5);
    report("linear_backward db (+=) [24]", got_db, ref_db, out, 1e-5);
    free(x), free(w), free(dy), free(dx0), free(dw0), free(db0), free(got_dx), free(got_dw), free(got_db);
    free(ref_dx), free(ref_dw), free(ref_db);
    be->free(be, gx), be->free(be, gw), be->free(be, gdy), be->free(be, gdx), be->free(be, gdw), be->free(be, gdb);
}

static void rmsnorm_row_ref(double *y, const double *x, const double *w, int d, double eps) {
    double ss = 0;
    for (int j = 0; j < d; j++) ss += x[j] * x[j];
    double r = 1.0 / sqrt(ss / d + eps);
    for (int j = 0; j < d; j++) y[j] = x[j] * r * w[j];
}

static void test_rmsnorm_backward(const Backend *be) {
    int n = 5, d = 24;
    float eps = 1e-5f;
    float *x = rand_floats((size_t)n * d, 2.0f), *w = rand_floats(d, 1.0f), *dy = rand_floats((size_t)n * d, 1.0f),
          *dx0 = rand_floats((size_t)n * d, 1.0f), *dw0 = rand_floats(d, 1.0f);
    void *gx = to_device(be, x, (size_t)n * d), *gw = to_device(be, w, d), *gdy = to_device(be, dy, (size_t)n * d),
         *gdx = to_device(be, dx0, (size_t)n * d), *gdw = to_device(be, dw0, d);
    be->rmsnorm_backward(be, gdx, gdw, gdy, gx, gw, n, d, eps);
    float *got_dx = from_device(be, gdx, (size_t)n * d), *got_dw = from_device(be, gdw, d);
    double *ref_dx = malloc((size_t)n * d * sizeof(double)), *ref_dw = malloc(d * sizeof(double));
    double *xd = to_double(x, (size_t)n * d), *wd = to_double(w, d), yp[64], ym[64], h = 1e-5;
    for (int j = 0; j < d; j++) ref_dw[j] = dw0[j];
    for (int i = 0; i < n; i++) {
        double *xi = xd + (size_t)i * d;
        for (int k = 0; k < d; k++) { /* d/dx_k of sum_j dy_j y_j */
            double keep = xi[k], s = 0;
            xi[k] = keep + h, rmsnorm_row_ref(yp, xi, wd, d, eps);
            xi[k] = keep - h, rmsnorm_row_ref(ym, xi, wd, d, eps);
            xi[k] = keep;
            for (int j = 0; j < d; j++) s += dy[i * d + j] * (yp[j] - ym[j]) / (2 * h);
            ref_dx[i * d + k] = dx0[i * d + k] + s;
        }
        for (int k = 0; k < d; k++) { /* d/dw_k */
            double keep = wd[k];
            wd[k] = keep + h, rmsnorm_row_ref(yp, xi, wd, d, eps);
            wd[k] = keep - h, rmsnorm_row_ref(ym, xi, wd, d, eps);
            wd[k] = keep;
            ref_dw[k] += dy[i * d + k] * (yp[k] - ym[k]) / (2 * h);
        }
    }
    report("rmsnorm_backward dx (+=) [5,24] vs fd", got_dx, ref_dx, (size_t)n * d, 1e-5);
    report("rmsnorm_backward dw (+=) [24] vs fd", got_dw, ref_dw, d, 1e-5);
    free(x), free(w), free(dy), free(dx0), free(dw0), free(got_dx), free(got_dw), free(ref_dx), free(ref_dw), free(xd),
        free(wd);
    be->free(be, gx), be->free(be, gw), be->free(be, gdy), be->free(be, gdx), be->free(be, gdw);
}

/* rope_backward(y) = R^T y, R the rotation rope applies (double angles). */
static void test_rope_backward(const Backend *be) {
    int n = 4, heads = 2, dh = 16;
    float theta = 10000.0f;
    int pos[4] = {0, 3, 50, 127};
    size_t total = (size_t)n * heads * dh;
    float *y = rand_floats(total, 1.0f);
    void *dy = to_device(be, y, total);
    be->rope_backward(be, dy, pos, n, heads, dh, rope_table(dh, theta));
    float *got = from_device(be, dy, total);
    double *ref = malloc(total * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++)
            for (int j = 0; j < dh / 2; j++) {
                double f = pos[i] * pow((double)theta, -2.0 * j / dh);
                size_t base = ((size_t)i * heads + h) * dh;
                double a = y[base + j], b = y[base + j + dh / 2];
                ref[base + j] = a * cos(f) + b * sin(f);
                ref[base + j + dh / 2] = b * cos(f) - a * sin(f);
            }
    report("rope_backward [4,2,16] = R^T", got, ref, total, 1e-4);
    free(y), free(got), free(ref);
    be->free(be, dy);
}

/* Double attention over whole sequences: out[i,h] from q and the caches. */
static void attention_ref(double *out, const double *q, const double *kc, const double *vc, const int *slot,
                          const int *pos, int n, int H, int KVH, int Dh, int L) {
    int kvd = KVH * Dh;
    double p[64];
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) {
            int kh = h / (H / KVH);
            double mx = -INFINITY, sum = 0;
            for (int t = 0; t <= pos[i]; t++) {
                double s = 0;
                for (int d = 0; d < Dh; d++)
                    s += q[((size_t)i * H + h) * Dh + d] * kc[((size_t)slot[i] * L + t) * kvd + kh * Dh + d];
                p[t] = s / sqrt((double)Dh);
                mx = fmax(mx, p[t]);
            }
            for (int t = 0; t <= pos[i]; t++) sum += (p[t] = exp(p[t] - mx));
            for (int d = 0; d < Dh; d++) {
                double acc = 0;
                for (int t = 0; t <= pos[i]; t++) acc += p[t] / sum * vc[((size_t)slot[i] * L + t) * kvd + kh * Dh + d];
                out[((size_t)i * H + h) * Dh + d] = acc;
            }
        }
}

static double attention_loss(const double *dout, double *q, double *kc, double *vc, const int *slot, const int *pos,
                             int n, int H, int KVH, int Dh, int L, double *scratch) {
    attention_ref(scratch, q, kc, vc, slot, pos, n, H, KVH, Dh, L);
    double s = 0;
    for (size_t i = 0; i < (size_t)n * H * Dh; i++) s += dout[i] * scratch[i];
    return s;
}

/* Two whole sequences (5 and 3 tokens) in slots 1 and 0, tokens interleaved. */
static void test_attention_backward(const Backend *be) {
    int S = 2, L = 6, H = 4, KVH = 2, Dh = 8, kvd = KVH * Dh, n = 8;
    int slot[8] = {1, 0, 1, 1, 0, 1, 0, 1}, pos[8] = {0, 0, 1, 2, 1, 3, 2, 4};
    size_t qn = (size_t)n * H * Dh, cn = (size_t)S * L * kvd;
    float *q = rand_floats(qn, 1.0f), *kc = rand_floats(cn, 1.0f), *vc = rand_floats(cn, 1.0f),
          *dout = rand_floats(qn, 1.0f), *dk0 = rand_floats(cn, 1.0f), *dv0 = rand_floats(cn, 1.0f);
    void *gq = to_device(be, q, qn), *gkc = to_device(be, kc, cn), *gvc = to_device(be, vc, cn),
         *gdo = to_device(be, dout, qn), *gdq = be->alloc(be, qn), *gdk = to_device(be, dk0, cn),
         *gdv = to_device(be, dv0, cn);
    be->attention_backward(be, gdq, gdk, gdv, gdo, gq, NULL, NULL, gkc, gvc, slot, pos, n, H, KVH, Dh, S, L);
    float *got_dq = from_device(be, gdq, qn), *got_dk = from_device(be, gdk, cn), *got_dv = from_device(be, gdv, cn);
    double *qd = to_double(q, qn), *kd = to_double(kc, cn), *vd = to_double(vc, cn), *dod = to_double(dout, qn);
    double *scratch = malloc(qn * sizeof(double)), h = 1e-5;
    double *ref_dq = malloc(qn * sizeof(double)), *ref_dk = malloc(cn * sizeof(double)),
           *ref_dv = malloc(cn * sizeof(double));
    struct {
        double *x, *ref;
        size_t n;
        const float *init;
    } parts[3] = {{qd, ref_dq, qn, NULL}, {kd, ref_dk, cn, dk0}, {vd, ref_dv, cn, dv0}};
    for (int p = 0; p < 3; p++)
        for (size_t j = 0; j < parts[p].n; j++) {
            double keep = parts[p].x[j];
            parts[p].x[j] = keep + h;
            double lp = attention_loss(dod, qd, kd, vd, slot, pos, n, H, KVH, Dh, L, scratch);
            parts[p].x[j] = keep - h;
            double lm = attention_loss(dod, qd, kd, vd, slot, pos, n, H, KVH, Dh, L, scratch);
            parts[p].x[j] = keep;
            parts[p].ref[j] = (parts[p].init ? parts[p].init[j] : 0.0) + (lp - lm) / (2 * h);
        }
    report("attention_backward dq GQA vs fd", got_dq, ref_dq, qn, 1e-5);
    report("attention_backward dk_cache (+=) vs fd", got_dk, ref_dk, cn, 1e-5);
    report("attention_backward dv_cache (+=) vs fd", got_dv, ref_dv, cn, 1e-5);
    /* kv_gather reads back what kv_store wrote */
    void *gk = be->alloc(be, (size_t)n * kvd), *gv = be->alloc(be, (size_t)n * kvd);
    be->kv_gather(be, gk, gv, gkc, gvc, slot, pos, n, kvd, L);
    float *got_k = from_device(be, gk, (size_t)n * kvd), *got_v = from_device(be, gv, (size_t)n * kvd);
    double *ref_kv = malloc((size_t)n * kvd * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < kvd; j++) ref_kv[i * kvd + j] = kc[((size_t)slot[i] * L + pos[i]) * kvd + j];
    report("kv_gather k [8 tokens of 2x6x16]", got_k, ref_kv, (size_t)n * kvd, 0.0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < kvd; j++) ref_kv[i * kvd + j] = vc[((size_t)slot[i] * L + pos[i]) * kvd + j];
    report("kv_gather v [8 tokens of 2x6x16]", got_v, ref_kv, (size_t)n * kvd, 0.0);
    free(q), free(kc), free(vc), free(dout), free(dk0), free(dv0), free(got_dq), free(got_dk), free(got_dv);
    free(qd), free(kd), free(vd), free(dod), free(scratch), free(ref_dq), free(ref_dk), free(ref_dv);
    free(got_k), free(got_v), free(ref_kv);
    be->free(be, gq), be->free(be, gkc), be->free(be, gvc), be->free(be, gdo), be->free(be, gdq), be->free(be, gdk), be->free(be, gdv);
    be->free(be, gk), be->free(be, gv);
}

static void test_swiglu_embedding_backward(const Backend *be) {
    size_t n = 1000;
    float *g = rand_floats(n, 4.0f), *u = rand_floats(n, 1.0f), *go = rand_floats(n, 1.0f);
    void *dg = to_device(be, g, n), *du = to_device(be, u, n), *dgo = to_device(be, go, n), *odg = be->alloc(be, n),
         *odu = be->alloc(be, n);
    be->swiglu_backward(be, odg, odu, dgo, dg, du, n);
    float *got_g = from_device(be, odg, n), *got_u = from_device(be, odu, n);
    double *ref_g = malloc(n * sizeof(double)), *ref_u = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double x = g[i], sg = 1.0 / (1.0 + exp(-x));
        ref_u[i] = go[i] * x * sg;
        ref_g[i] = go[i] * u[i] * (sg + x * sg * (1.0 - sg));
    }
    report("swiglu_backward dgate [1000]", got_g, ref_g, n, 1e-5);
    report("swiglu_backward dup [1000]", got_u, ref_u, n, 1e-5);
    int V = 20, D = 12, nt = 6;
    int ids[6] = {3, 19, 3, 0, 7, 3};
    float *t0 = rand_floats((size_t)V * D, 1.0f), *dout = rand_floats((size_t)nt * D, 1.0f);
    void *dt = to_device(be, t0, (size_t)V * D), *ddo = to_device(be, dout, (size_t)nt * D);
    be->embedding_backward(be, dt, ddo, ids, nt, D);
    float *got_t = from_device(be, dt, (size_t)V * D);
    double *ref_t = to_double(t0, (size_t)V * D);
    for (int i = 0; i < nt; i++)
        for (int j = 0; j < D; j++) ref_t[ids[i] * D + j] += dout[i * D + j];
    report("embedding_backward (+=, repeated ids)", got_t, ref_t, (size_t)V * D, 1e-6);
    free(g), free(u), free(go), free(got_g), free(got_u), free(ref_g), free(ref_u), free(t0), free(dout), free(got_t),
        free(ref_t);
    be->free(be, dg), be->free(be, du), be->free(be, dgo), be->free(be, odg), be->free(be, odu), be->free(be, dt), be->free(be, ddo);
}

static double logprob_ref(const double *row, int V, int target, double temp, double *entropy) {
    double mx = -INFINITY, sum = 0, pz = 0;
    for (int v = 0; v < V; v++) mx = fmax(mx, row[v] / temp);
    for (int v = 0; v < V; v++) sum += exp(row[v] / temp - mx);
    double lse = mx + log(sum);
    for (int v = 0; v < V; v++) pz += exp(row[v] / temp - lse) * (row[v] / temp);
    if (entropy) *entropy = lse - pz;
    return row[target] / temp - lse;
}

static void test_log_softmax_target(const Backend *be) {
    int n = 5, V = 300;
    float temp = 0.7f;
    int targets[5] = {0, 299, -1, 17, 17};
    float *lg = rand_floats((size_t)n * V, 3.0f), *dlp = rand_floats(n, 1.0f);
    void *glg = to_device(be, lg, (size_t)n * V), *glp = be->alloc(be, n), *gent = be->alloc(be, n),
         *gdlp = to_device(be, dlp, n), *gdl = be->alloc(be, (size_t)n * V);
    be->log_softmax_target(be, glp, gent, glg, targets, n, V, temp);
    float *got_lp = from_device(be, glp, n), *got_ent = from_device(be, gent, n);
    double *ref_lp = calloc(n, sizeof(double)), *ref_ent = calloc(n, sizeof(double));
    double *ref_dl = calloc((size_t)n * V, sizeof(double)), *row = malloc(V * sizeof(double)), h = 1e-5;
    for (int i = 0; i < n; i++) {
        if (targets[i] < 0) continue;
        for (int v = 0; v < V; v++) row[v] = lg[i * V + v];
        ref_lp[i] = logprob_ref(row, V, targets[i], temp, &ref_ent[i]);
        for (int v = 0; v < V; v++) {
            double keep = row[v];
            row[v] = keep + h;
            double lp = logprob_ref(row, V, targets[i], temp, NULL);
            row[v] = keep - h;
            double lm = logprob_ref(row, V, targets[i], temp, NULL);
            row[v] = keep;
            ref_dl[i * V + v] = dlp[i] * (lp - lm) / (2 * h);
        }
    }
    report("log_softmax_target logprobs [5,300] T=0.7", got_lp, ref_lp, n, 1e-5);
    report("log_softmax_target entropy [5,300]", got_ent, ref_ent, n, 1e-5);
    be->log_softmax_target_backward(be, gdl, glg, targets, gdlp, n, V, temp);
    float *got_dl = from_device(be, gdl, (size_t)n * V);
    report("log_softmax_target_backward [5,300] vs fd", got_dl, ref_dl, (size_t)n * V, 1e-6);
    be->log_softmax_target_backward(be, glg, glg, targets, gdlp, n, V, temp); /* in place */
    float *got_in_place = from_device(be, glg, (size_t)n * V);
    report("log_softmax_target_backward in place", got_in_place, ref_dl, (size_t)n * V, 1e-6);
    free(lg), free(dlp), free(got_lp), free(got_ent), free(ref_lp), free(ref_ent), free(ref_dl), free(row),
        free(got_dl), free(got_in_place);
    be->free(be, glg), be->free(be, glp), be->free(be, gent), be->free(be, gdlp), be->free(be, gdl);
}

/* log_softmax_entropy_backward against central differences of dlogprobs * logprob + dentropy * entropy,
 * out of place and in place; with dentropy = 0 it must equal log_softmax_target_backward. */
static void test_log_softmax_entropy_backward(const Backend *be) {
    int n = 5, V = 300;
    float temp = 0.7f;
    int targets[5] = {3, 299, -1, 17, 17};
    float *lg = rand_floats((size_t)n * V, 3.0f), *dlp = rand_floats(n, 1.0f), *dh = rand_floats(n, 1.0f);
    float zeros[5] = {0};
    void *glg = to_device(be, lg, (size_t)n * V), *gdlp = to_device(be, dlp, n), *gdh = to_device(be, dh, n),
         *gzero = to_device(be, zeros, n), *gdl = be->alloc(be, (size_t)n * V);
    double *ref_dl = calloc((size_t)n * V, sizeof(double)), *row = malloc(V * sizeof(double)), h = 1e-5;
    for (int i = 0; i < n; i++) {
        if (targets[i] < 0) continue;
        for (int v = 0; v < V; v++) row[v] = lg[i * V + v];
        for (int v = 0; v < V; v++) {
            double keep = row[v], ep, em;
            row[v] = keep + h;
            double lp = logprob_ref(row, V, targets[i], temp, &ep);
            row[v] = keep - h;
            double lm = logprob_ref(row, V, targets[i], temp, &em);
            row[v] = keep;
            ref_dl[i * V + v] = (dlp[i] * (lp - lm) + dh[i] * (ep - em)) / (2 * h);
        }
    }
    be->log_softmax_entropy_backward(be, gdl, glg, targets, gdlp, gdh, n, V, temp);
    float *got = from_device(be, gdl, (size_t)n * V);
    report("log_softmax_entropy_backward [5,300] T=0.7 vs fd", got, ref_dl, (size_t)n * V, 1e-6);
    /* dentropy = 0: the plain backward's values */
    be->log_softmax_target_backward(be, gdl, glg, targets, gdlp, n, V, temp);
    float *plain = from_device(be, gdl, (size_t)n * V);
    double *plain_ref = malloc((size_t)n * V * sizeof(double));
    for (size_t k = 0; k < (size_t)n * V; k++) plain_ref[k] = plain[k];
    be->log_softmax_entropy_backward(be, gdl, glg, targets, gdlp, gzero, n, V, temp);
    float *no_entropy = from_device(be, gdl, (size_t)n * V);
    report("log_softmax_entropy_backward dentropy=0 vs log_softmax_target_backward", no_entropy, plain_ref,
           (size_t)n * V, 1e-6);
    be->log_softmax_entropy_backward(be, glg, glg, targets, gdlp, gdh, n, V, temp); /* in place */
    float *in_place = from_device(be, glg, (size_t)n * V);
    report("log_softmax_entropy_backward in place", in_place, ref_dl, (size_t)n * V, 1e-6);
    free(lg), free(dlp), free(dh), free(ref_dl), free(row), free(got), free(plain), free(plain_ref), free(no_entropy),
        free(in_place);
    be->free(be, glg), be->free(be, gdlp), be->free(be, gdh), be->free(be, gzero), be->free(be, gdl);
}

/* ================================================================ vocabulary parallelism
 * A [N, V] matrix split into column parts, one per (pretend) rank: each part's
 * op output, combined on the host or reassembled with copy_2d, must equal the
 * whole-matrix op. */

#define SHARD_PARTS 3
static const int SHARD_LO[SHARD_PARTS + 1] = {0, 12, 24, 37}; /* parts of 12, 12 and 13 columns */

/* buffer + elems storage elements: a column offset into a backend buffer */
static void *at_elem(const Backend *be, void *buf, size_t elems) {
    return (char *)buf + elems * dtype_size(be->storage);
}

/* targets[i] into part [lo, hi): target - lo inside it, else -1 */
static void part_targets(int *out, const int *targets, int n, int lo, int hi) {
    for (int i = 0; i < n; i++) out[i] = targets[i] >= lo && targets[i] < hi ? targets[i] - lo : -1;
}

/* logits_shard_stats on each part, combined as the ranks do, against
 * log_softmax_target on the whole matrix; then log_softmax_shard_backward on
 * each part with the combined lse, reassembled, against
 * log_softmax_target_backward on the whole. */
static void test_logits_shard(const Backend *be) {
    enum { N = 5, V = 37 };
    float temp = 0.7f;
    int targets[N] = {0, 36, -1, 12, 23}; /* first and last column, no target, both sides of a part boundary */
    float *lg = rand_floats((size_t)N * V, 3.0f), *dlp = rand_floats(N, 1.0f);
    dlp[2] = 0.0f; /* the whole-matrix backward gives a row without target no gradient */
    void *glg = to_device(be, lg, (size_t)N * V), *glp = be->alloc_f32(be, N), *gent = be->alloc_f32(be, N);
    be->log_softmax_target(be, glp, gent, glg, targets, N, V, temp);
    float whole_lp[N], whole_ent[N];
    be->download_f32(be, whole_lp, glp, N);
    be->download_f32(be, whole_ent, gent, N);

    double M[N], S[N], Tz[N], zt[N];
    for (int i = 0; i < N; i++) M[i] = -INFINITY, S[i] = Tz[i] = zt[i] = 0.0;
    void *part_lg[SHARD_PARTS];
    int tq[SHARD_PARTS][N];
    bool other_target_zero = true;
    for (int p = 0; p < SHARD_PARTS; p++) {
        int lo = SHARD_LO[p], vp = SHARD_LO[p + 1] - lo;
        part_lg[p] = be->alloc(be, (size_t)N * vp);
        be->copy_2d(be, part_lg[p], vp, at_elem(be, glg, lo), V, N, vp);
        part_targets(tq[p], targets, N, lo, SHARD_LO[p + 1]);
        void *gstats = be->alloc_f32(be, (size_t)N * 4);
        be->logits_shard_stats(be, gstats, part_lg[p], tq[p], N, vp, temp);
        float st[N * 4];
        be->download_f32(be, st, gstats, (size_t)N * 4);
        for (int i = 0; i < N; i++) { /* from M = -inf, S = T = 0: the first part's exp(M - Mn) is 0 */
            double m = st[4 * i], Mn = fmax(M[i], m);
            S[i] = S[i] * exp(M[i] - Mn) + st[4 * i + 1] * exp(m - Mn);
            Tz[i] = Tz[i] * exp(M[i] - Mn) + st[4 * i + 2] * exp(m - Mn);
            M[i] = Mn;
            zt[i] += st[4 * i + 3];
            if (tq[p][i] < 0 && st[4 * i + 3] != 0.0f) other_target_zero = false;
        }
        be->free(be, gstats);
    }
    printf("%s logits_shard_stats z[target] of a part without the target is 0\n", other_target_zero ? "ok  " : "FAIL");
    if (!other_target_zero) g_failures++;

    /* rows with a target: log-prob and entropy from the parts vs the whole */
    float got_lp[N], got_ent[N], lse[N];
    double ref_lp[N], ref_ent[N];
    int m = 0;
    for (int i = 0; i < N; i++) {
        double l = M[i] + log(S[i]);
        lse[i] = (float)l;
        if (targets[i] < 0) continue;
        got_lp[m] = (float)(zt[i] - l), got_ent[m] = (float)(l - Tz[i] / S[i]);
        ref_lp[m] = whole_lp[i], ref_ent[m] = whole_ent[i];
        m++;
    }
    report("logits_shard_stats 3 parts -> logprobs [5,37] T=0.7", got_lp, ref_lp, m, 1e-5);
    report("logits_shard_stats 3 parts -> entropy [5,37]", got_ent, ref_ent, m, 1e-5);
    /* the row without a target (the whole op gives it 0): its entropy vs double */
    double row[V], ent2;
    for (int v = 0; v < V; v++) row[v] = lg[2 * V + v];
    logprob_ref(row, V, 0, temp, &ent2);
    float got_ent2 = (float)(M[2] + log(S[2]) - Tz[2] / S[2]);
    report("logits_shard_stats 3 parts -> entropy, row without target", &got_ent2, &ent2, 1, 1e-5);

    /* backward: parts 0 and 1 out of place, part 2 in place */
    void *gdlp = be->alloc_f32(be, N), *glse = be->alloc_f32(be, N), *gdl = be->alloc(be, (size_t)N * V),
         *gparts = be->alloc(be, (size_t)N * V);
    be->upload_f32(be, gdlp, dlp, N);
    be->upload_f32(be, glse, lse, N);
    be->log_softmax_target_backward(be, gdl, glg, targets, gdlp, N, V, temp);
    for (int p = 0; p < SHARD_PARTS; p++) {
        int lo = SHARD_LO[p], vp = SHARD_LO[p + 1] - lo;
        void *pdl = p == 2 ? part_lg[p] : be->alloc(be, (size_t)N * vp);
        be->log_softmax_shard_backward(be, pdl, part_lg[p], tq[p], gdlp, glse, N, vp, temp);
        be->copy_2d(be, at_elem(be, gparts, lo), V, pdl, vp, N, vp);
        if (pdl != part_lg[p]) be->free(be, pdl);
    }
    float *got_dl = from_device(be, gparts, (size_t)N * V), *whole_dl = from_device(be, gdl, (size_t)N * V);
    double *ref_dl = to_double(whole_dl, (size_t)N * V);
    report("log_softmax_shard_backward 3 parts (last in place) [5,37]", got_dl, ref_dl, (size_t)N * V, 1e-6);

    /* with the entropy's gradient: the parts (the whole row's lse and sum p z given) vs the whole op; the
     * row without a target gets no gradient from the whole op, so its dlogprob and dentropy are 0 here */
    float dh[N] = {0.7f, -1.1f, 0.0f, 0.4f, -0.3f}, pz[N]; /* fixed: the random stream of later tests stays */
    for (int i = 0; i < N; i++) pz[i] = (float)(Tz[i] / S[i]);
    void *gdh = be->alloc_f32(be, N), *gpz = be->alloc_f32(be, N);
    be->upload_f32(be, gdh, dh, N);
    be->upload_f32(be, gpz, pz, N);
    be->log_softmax_entropy_backward(be, gdl, glg, targets, gdlp, gdh, N, V, temp);
    for (int p = 0; p < SHARD_PARTS; p++) {
        int lo = SHARD_LO[p], vp = SHARD_LO[p + 1] - lo;
        void *plg = be->alloc(be, (size_t)N * vp);
        be->copy_2d(be, plg, vp, at_elem(be, glg, lo), V, N, vp);
        void *pdl = p == 1 ? plg : be->alloc(be, (size_t)N * vp); /* the middle part in place */
        be->log_softmax_shard_entropy_backward(be, pdl, plg, tq[p], gdlp, gdh, glse, gpz, N, vp, temp);
        be->copy_2d(be, at_elem(be, gparts, lo), V, pdl, vp, N, vp);
        if (pdl != plg) be->free(be, pdl);
        be->free(be, plg);
    }
    float *got_edl = from_device(be, gparts, (size_t)N * V), *whole_edl = from_device(be, gdl, (size_t)N * V);
    double *ref_edl = to_double(whole_edl, (size_t)N * V);
    report("log_softmax_shard_entropy_backward 3 parts [5,37]", got_edl, ref_edl, (size_t)N * V, 1e-6);
    free(got_edl), free(whole_edl), free(ref_edl);
    be->free(be, gdh), be->free(be, gpz);

    free(lg), free(dlp), free(got_dl), free(whole_dl), free(ref_dl);
    for (int p = 0; p < SHARD_PARTS; p++) be->free(be, part_lg[p]);
    be->free(be, glg), be->free(be, glp), be->free(be, gent), be->free(be, gdlp), be->free(be, glse), be->free(be, gdl),
        be->free(be, gparts);
}

/* copy_2d: a [4, 5] block between strided matrices, the rest of dst untouched. */
static void test_copy_2d(const Backend *be) {
    enum { R = 4, C = 5, SS = 9, DS = 7, SOFF = 3, DOFF = 1 };
    float *src = rand_floats((size_t)R * SS, 1.0f), *dst0 = rand_floats((size_t)R * DS, 1.0f);
    void *gs = to_device(be, src, (size_t)R * SS), *gd = to_device(be, dst0, (size_t)R * DS);
    be->copy_2d(be, at_elem(be, gd, DOFF), DS, at_elem(be, gs, SOFF), SS, R, C);
    float *got = from_device(be, gd, (size_t)R * DS);
    double *ref = to_double(dst0, (size_t)R * DS);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) ref[r * DS + DOFF + c] = src[r * SS + SOFF + c];
    report("copy_2d [4,5] from stride 9 (col 3) to stride 7 (col 1)", got, ref, (size_t)R * DS, 0.0);
    free(src), free(dst0), free(got), free(ref);
    be->free(be, gs), be->free(be, gd);
}

/* vocab_shard_ids_i32, then embedding / embedding_i32 / embedding_backward of
 * each part of a vocabulary-parallel table: a token outside the part gives a
 * zero row (forward) and no gradient (backward), so the parts' rows sum to the
 * whole table's. */
static void test_vocab_shard_embedding(const Backend *be) {
    enum { N = 8, V = 37, D = 6 };
    int ids[N] = {0, 11, 12, 23, 24, 36, 12, 5}; /* both sides of each boundary, a repeat */
    float *table = rand_floats((size_t)V * D, 1.0f), *dout = rand_floats((size_t)N * D, 1.0f),
          *dt0 = rand_floats((size_t)V * D, 0.1f), *stale = rand_floats((size_t)N * D, 1.0f);
    void *gt = to_device(be, table, (size_t)V * D), *go = be->alloc(be, (size_t)N * D),
         *gdo = to_device(be, dout, (size_t)N * D);
    void *gids = be->alloc_i32(be, N), *gpids = be->alloc_i32(be, N);
    be->upload_i32(be, gids, ids, N);
    double *sum = calloc((size_t)N * D, sizeof(double)), *sum_i32 = calloc((size_t)N * D, sizeof(double));
    double *dt_parts = calloc((size_t)V * D, sizeof(double));
    int wrong_ids = 0;
    for (int p = 0; p < SHARD_PARTS; p++) {
        int lo = SHARD_LO[p], hi = SHARD_LO[p + 1], vp = hi - lo;
        int pids[N], want[N];
        be->vocab_shard_ids_i32(be, gpids, gids, N, lo, hi);
        be->download_i32(be, pids, gpids, N);
        part_targets(want, ids, N, lo, hi);
        for (int i = 0; i < N; i++) wrong_ids += pids[i] != want[i];
        void *gpt = be->alloc(be, (size_t)vp * D);
        be->copy(be, gpt, 0, gt, (size_t)lo * D, (size_t)vp * D);
        be->upload(be, go, stale, (size_t)N * D); /* a skipped row would keep these */
        be->embedding(be, go, gpt, pids, N, D);
        float *got = from_device(be, go, (size_t)N * D);
        double *ref = calloc((size_t)N * D, sizeof(double));
        for (int i = 0; i < N; i++) {
            if (want[i] < 0) continue;
            for (int j = 0; j < D; j++) ref[i * D + j] = table[(size_t)(lo + want[i]) * D + j];
        }
        char name[96];
        snprintf(name, sizeof name, "embedding part [%d,%d) (zero rows for ids < 0)", lo, hi);
        report(name, got, ref, (size_t)N * D, 0.0);
        for (size_t e = 0; e < (size_t)N * D; e++) sum[e] += got[e];
        free(got);
        be->upload(be, go, stale, (size_t)N * D);
        be->embedding_i32(be, go, gpt, gpids, N, D);
        got = from_device(be, go, (size_t)N * D);
        for (size_t e = 0; e < (size_t)N * D; e++) sum_i32[e] += got[e];
        free(got), free(ref);
        /* backward into the part's slice of a copy of dt0 */
        void *gpdt = be->alloc_f32(be, (size_t)vp * D);
        be->upload_f32(be, gpdt, dt0 + (size_t)lo * D, (size_t)vp * D);
        be->embedding_backward(be, gpdt, gdo, pids, N, D);
        float *part_dt = malloc((size_t)vp * D * sizeof(float));
        be->download_f32(be, part_dt, gpdt, (size_t)vp * D);
        for (size_t e = 0; e < (size_t)vp * D; e++) dt_parts[(size_t)lo * D + e] = part_dt[e];
        free(part_dt);
        be->free(be, gpt), be->free(be, gpdt);
    }
    printf("%s vocab_shard_ids_i32 3 parts of [0,37): %d of %d ids wrong\n", wrong_ids ? "FAIL" : "ok  ", wrong_ids,
           SHARD_PARTS * N);
    if (wrong_ids) g_failures++;
    be->embedding(be, go, gt, ids, N, D);
    float *whole = from_device(be, go, (size_t)N * D);
    double *ref_whole = to_double(whole, (size_t)N * D);
    float *sum_f = malloc((size_t)N * D * sizeof(float)), *sum_i32_f = malloc((size_t)N * D * sizeof(float));
    for (size_t e = 0; e < (size_t)N * D; e++) sum_f[e] = (float)sum[e], sum_i32_f[e] = (float)sum_i32[e];
    report("embedding sum over 3 parts = whole table's", sum_f, ref_whole, (size_t)N * D, 0.0);
    report("embedding_i32 sum over 3 parts = whole table's", sum_i32_f, ref_whole, (size_t)N * D, 0.0);
    void *gdt = be->alloc_f32(be, (size_t)V * D);
    be->upload_f32(be, gdt, dt0, (size_t)V * D);
    be->embedding_backward(be, gdt, gdo, ids, N, D);
    float *whole_dt = malloc((size_t)V * D * sizeof(float));
    be->download_f32(be, whole_dt, gdt, (size_t)V * D);
    float *parts_dt_f = malloc((size_t)V * D * sizeof(float));
    double *ref_dt = to_double(whole_dt, (size_t)V * D);
    for (size_t e = 0; e < (size_t)V * D; e++) parts_dt_f[e] = (float)dt_parts[e];
    report("embedding_backward 3 parts (ids < 0 skipped) = whole", parts_dt_f, ref_dt, (size_t)V * D, 0.0);

    free(table), free(dout), free(dt0), free(stale), free(sum), free(sum_i32), free(dt_parts), free(whole),
        free(ref_whole), free(sum_f), free(sum_i32_f), free(whole_dt), free(parts_dt_f), free(ref_dt);
    be->free(be, gt), be->free(be, go), be->free(be, gdo), be->free(be, gids), be->free(be, gpids), be->free(be, gdt);
}

/* adamw vs the formula in backend.h in double; sum_squares, scale, zero. */
static void test_optimizer_ops(const Backend *be) {
    size_t n = 777;
    float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f;
    int step = 3;
    float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
    float *p = rand_floats(n, 1.0f), *g = rand_floats(n, 1.0f), *m = rand_floats(n, 0.1f), *v = rand_floats(n, 0.1f);
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
    void *gp = to_device(be, p, n), *gg = to_device(be, g, n), *gm = to_device(be, m, n), *gv = to_device(be, v, n);
    be->adamw(be, gp, NULL, gg, gm, gv, n, lr, b1, b2, eps, wd, bc1, bc2);
    float *got_p = from_device(be, gp, n), *got_m = from_device(be, gm, n), *got_v = from_device(be, gv, n);
    double *ref_p = malloc(n * sizeof(double)), *ref_m = malloc(n * sizeof(double)), *ref_v = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double pp = p[i] * (1.0 - (double)lr * wd);
        ref_m[i] = (double)b1 * m[i] + (1.0 - b1) * g[i];
        ref_v[i] = (double)b2 * v[i] + (1.0 - b2) * (double)g[i] * g[i];
        ref_p[i] = pp - (lr / (double)bc1) * ref_m[i] / (sqrt(ref_v[i]) / sqrt((double)bc2) + eps);
    }
    report("adamw param (step 3)", got_p, ref_p, n, 1e-6);
    report("adamw m", got_m, ref_m, n, 1e-6);
    report("adamw v", got_v, ref_v, n, 1e-6);
    double ss = be->sum_squares(be, gg, n), ref_ss = 0;
    for (size_t i = 0; i < n; i++) ref_ss += (double)g[i] * g[i];
    float got_ss = (float)(ss / ref_ss);
    double one = 1.0;
    report("sum_squares [777] (ratio to double ref)", &got_ss, &one, 1, 1e-6);
    be->scale(be, gg, -0.5f, n);
    float *got_s = from_device(be, gg, n);
    for (size_t i = 0; i < n; i++) ref_p[i] = -0.5 * g[i];
    report("scale [777] by -0.5", got_s, ref_p, n, 0.0);
    be->zero(be, gg, n);
    float *got_z = from_device(be, gg, n);
    for (size_t i = 0; i < n; i++) ref_p[i] = 0.0;
    report("zero [777]", got_z, ref_p, n, 0.0);
    free(p), free(g), free(m), free(v), free(got_p), free(got_m), free(got_v), free(ref_p), free(ref_m), free(ref_v),
        free(got_s), free(got_z);
    be->free(be, gp), be->free(be, gg), be->free(be, gm), be->free(be, gv);
}

static void run_all(const Backend *be) {
    printf("backend: %s\n", be->name);
    test_linear(be, 0);
    test_linear(be, 1);
    test_rmsnorm(be);
    test_rope(be);
    test_attention(be);
    test_elementwise(be);
    test_embedding(be);
    test_gather_scatter(be);
    test_linear_backward(be, 0);
    test_linear_backward(be, 1);
    test_rmsnorm_backward(be);
    test_rope_backward(be);
    test_attention_backward(be);
    test_swiglu_embedding_backward(be);
    test_log_softmax_target(be);
    test_log_softmax_entropy_backward(be);
    test_logits_shard(be);
    test_copy_2d(be);
    test_vocab_shard_embedding(be);
    test_optimizer_ops(be);
    test_dropout(be);
}

int main(void) {
    run_all(backend_cpu());
    /* Again through the profiling wrapper: it must forward every op unchanged,
     * and its report must account for them. */
    Backend *profiled = backend_profile_wrap(backend_cpu());
    run_all(profiled);
    char *report = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&report, &len);
    backend_profile_report(profiled, fp);
    fclose(fp);
    backend_profile_free(profiled);

    /* Two CPU instances side by side: the deterministic mode is each one's own. */
    char err[ERR_LEN];
    Backend *a = backend_open("cpu", 0, err), *b = backend_open("cpu", 0, err);
    a->set_batch_invariant(a, 1);
    run_all(b); /* b still runs the BLAS path, a the invariant one */
    run_all(a);
    backend_close(a);
    backend_close(b);
    int rows = 0;
    for (const char *c = report; *c; c++) rows += *c == '\n';
    printf("profile report: %d lines (linear row present: %s)\n", rows, strstr(report, "| linear |") ? "yes" : "no");
    if (rows < 20 || !strstr(report, "| linear |")) g_failures++;
    free(report);
    printf("%s: %d failures\n", g_failures ? "FAILED" : "OK", g_failures);
    return g_failures ? 1 : 0;
}

/* backend_op_cases.c — the op-case table (see backend_op_cases.h) and the two ways to run it: against
 * double references (the CPU) and against another backend (a device against the CPU). Each family is a
 * run function written once against the op table, a reference in double, and its rows in OP_CASES.
 * Not a place for device options or whole models.
 *
 * Dimension legend: N tokens, D width, H query heads, KVH key/value heads, Dh head dim, S cache slots,
 * L max cache length, F MLP width, V vocab. */
#include "backend_op_cases.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/sampling.h"
#include "core/error.h"
#include "core/floats.h"
#include "core/rng.h"
#include "rope_table.h"

/* ================================================================ the run's buffers */

static void *track_buf(OpRun *r, void *buf) {
    COLT_ASSERT(r->n_bufs < 4 * OP_MAX_TENSORS);
    r->bufs[r->n_bufs++] = buf;
    return buf;
}

static void *track_host(OpRun *r, void *p) {
    COLT_ASSERT(r->n_host < 4 * OP_MAX_TENSORS);
    r->host[r->n_host++] = p;
    return p;
}

/* values NULL: drawn N(0, scale^2). */
static void *op_in_kind(OpRun *r, size_t n, float scale, const float **host, bool f32, const float *values) {
    COLT_ASSERT(r->n_in < OP_MAX_TENSORS);
    int k = r->n_in++;
    float *x = malloc((n ? n : 1) * sizeof(float));
    if (r->replay) { /* the other backend's values, as it stored them */
        COLT_ASSERT(k < r->replay->n_in && r->replay->in_n[k] == n);
        memcpy(x, r->replay->in[k], n * sizeof(float));
    } else if (values) {
        memcpy(x, values, n * sizeof(float));
    } else {
        for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(11, r->key * OP_MAX_TENSORS + (uint64_t)k, i);
    }
    const Backend *be = r->be;
    void *buf = track_buf(r, f32 ? be->alloc_f32(be, n) : be->alloc(be, n));
    if (f32) {
        be->upload_f32(be, buf, x, n);
    } else {
        be->upload(be, buf, x, n);
        be->download(be, x, buf, n); /* bf16 storage rounds once: the values the op sees */
    }
    r->in[k] = x, r->in_n[k] = n;
    if (host) *host = x;
    return buf;
}

void *op_in(OpRun *r, size_t n, float scale, const float **host) { return op_in_kind(r, n, scale, host, false, NULL); }
void *op_in_f32(OpRun *r, size_t n, float scale, const float **host) {
    return op_in_kind(r, n, scale, host, true, NULL);
}
void *op_in_f32_values(OpRun *r, const float *values, size_t n) { return op_in_kind(r, n, 0, NULL, true, values); }

float *op_draw(OpRun *r, size_t n, float scale) {
    float *x = track_host(r, malloc((n ? n : 1) * sizeof(float)));
    uint64_t stream = r->key * OP_MAX_TENSORS + r->draws++;
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(17, stream, i);
    return x;
}

const float *op_input(const OpRun *r, int k) {
    COLT_ASSERT(k >= 0 && k < r->n_in);
    return r->in[k];
}

int *op_ints(OpRun *r, size_t n) {
    COLT_ASSERT(r->n_ints < OP_MAX_TENSORS);
    r->ints_n[r->n_ints] = n;
    return r->ints[r->n_ints++] = calloc(n ? n : 1, sizeof(int));
}

int op_rand_int(OpRun *r, int lo, int hi) { /* inclusive */
    float u = rng_uniform(13, r->key, r->int_draws++);
    int v = lo + (int)(u * (float)(hi - lo + 1));
    return v > hi ? hi : v;
}

void *op_alloc(OpRun *r, size_t n) { return track_buf(r, r->be->alloc(r->be, n)); }
void *op_alloc_f32(OpRun *r, size_t n) { return track_buf(r, r->be->alloc_f32(r->be, n)); }

float *op_download(OpRun *r, const void *buf, size_t n) {
    float *x = track_host(r, malloc((n ? n : 1) * sizeof(float)));
    r->be->download(r->be, x, buf, n);
    return x;
}

float *op_download_f32(OpRun *r, const void *buf, size_t n) {
    float *x = track_host(r, malloc((n ? n : 1) * sizeof(float)));
    r->be->download_f32(r->be, x, buf, n);
    return x;
}

static void out_add(OpRun *r, OpTol tol, float *x, size_t n, const char *fmt, va_list ap) {
    COLT_ASSERT(r->n_out < OP_MAX_TENSORS);
    int k = r->n_out++;
    char name[256];
    vsnprintf(name, sizeof name, fmt, ap);
    r->out_name[k] = strdup(name), r->out[k] = x, r->out_n[k] = n, r->out_tol[k] = tol;
}

static void out_download(OpRun *r, OpTol tol, const void *buf, size_t n, bool f32, const char *fmt, va_list ap) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    if (f32)
        r->be->download_f32(r->be, x, buf, n);
    else
        r->be->download(r->be, x, buf, n);
    out_add(r, tol, x, n, fmt, ap);
}

void op_out(OpRun *r, OpTol tol, const void *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    out_download(r, tol, buf, n, false, fmt, ap);
    va_end(ap);
}

void op_out_f32(OpRun *r, OpTol tol, const void *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    out_download(r, tol, buf, n, true, fmt, ap);
    va_end(ap);
}

void op_out_host(OpRun *r, OpTol tol, const float *x, size_t n, const char *fmt, ...) {
    float *copy = malloc((n ? n : 1) * sizeof(float));
    memcpy(copy, x, n * sizeof(float));
    va_list ap;
    va_start(ap, fmt);
    out_add(r, tol, copy, n, fmt, ap);
    va_end(ap);
}

static void op_run(OpRun *r, const Backend *be, int key, const OpRun *replay) {
    memset(r, 0, sizeof *r);
    r->be = be, r->c = &OP_CASES[key], r->key = (uint64_t)key, r->replay = replay;
    r->c->run(r);
}

static void op_run_free(OpRun *r) {
    for (int k = 0; k < r->n_in; k++) free(r->in[k]);
    for (int k = 0; k < r->n_ints; k++) free(r->ints[k]);
    for (int k = 0; k < r->n_out; k++) free(r->out[k]), free(r->out_name[k]);
    for (int k = 0; k < r->n_host; k++) free(r->host[k]);
    for (int k = 0; k < r->n_bufs; k++) r->be->free(r->be, r->bufs[k]);
    memset(r, 0, sizeof *r);
}

/* COLT_OP_CASES=linear,rope runs only those families (as test-backend-ops -o). */
static bool family_selected(const char *family) {
    const char *sel = getenv("COLT_OP_CASES");
    if (!sel || !*sel) return true;
    size_t len = strlen(family);
    for (const char *p = sel; (p = strstr(p, family)) != NULL; p += len)
        if ((p == sel || p[-1] == ',') && (p[len] == '\0' || p[len] == ',')) return true;
    return false;
}

/* ================================================================ buffers of tests that drive ops themselves */

void *op_upload(const Backend *be, float *x, size_t n) {
    void *buf = be->alloc(be, n);
    be->upload(be, buf, x, n);
    be->download(be, x, buf, n);
    return buf;
}

void *op_upload_f32(const Backend *be, const float *x, size_t n) {
    void *buf = be->alloc_f32(be, n);
    be->upload_f32(be, buf, x, n);
    return buf;
}

void *op_upload_i32(const Backend *be, const int *x, size_t n) {
    void *buf = be->alloc_i32(be, n);
    be->upload_i32(be, buf, x, n);
    return buf;
}

float *op_fetch(const Backend *be, const void *buf, size_t n) {
    float *x = xmalloc((n ? n : 1) * sizeof(float));
    be->download(be, x, buf, n);
    return x;
}

float *op_fetch_f32(const Backend *be, const void *buf, size_t n) {
    float *x = xmalloc((n ? n : 1) * sizeof(float));
    be->download_f32(be, x, buf, n);
    return x;
}

/* ================================================================ the two checks */

struct OpRefs {
    uint64_t inputs_hash[256]; /* per case: the inputs its references were computed from */
    int n_out[256];
    double *out[256][OP_MAX_TENSORS];
};

OpRefs *op_refs_create(void) {
    COLT_ASSERT(OP_CASE_COUNT <= 256);
    return calloc(1, sizeof(OpRefs));
}

void op_refs_free(OpRefs *refs) {
    if (!refs) return;
    for (int key = 0; key < 256; key++)
        for (int k = 0; k < refs->n_out[key]; k++) free(refs->out[key][k]);
    free(refs);
}

/* FNV-1a over the run's inputs, ints and output sizes: equal when the references would be. */
static uint64_t inputs_hash(const OpRun *r) {
    uint64_t h = 1469598103934665603ull;
#define MIX(p, bytes)                                                                             \
    for (size_t b_ = 0; b_ < (bytes); b_++) h = (h ^ ((const unsigned char *)(p))[b_]) * 1099511628211ull
    for (int k = 0; k < r->n_in; k++) MIX(r->in[k], r->in_n[k] * sizeof(float));
    for (int k = 0; k < r->n_ints; k++) MIX(r->ints[k], r->ints_n[k] * sizeof(int));
    for (int k = 0; k < r->n_out; k++) MIX(&r->out_n[k], sizeof(size_t));
#undef MIX
    return h ? h : 1;
}

/* The references of r's case: from refs when its inputs are the ones they were computed from. */
static double **references(const OpRun *r, OpRefs *refs, double **scratch) {
    int key = (int)r->key;
    uint64_t h = inputs_hash(r);
    if (refs && refs->inputs_hash[key] == h && refs->n_out[key] == r->n_out) return refs->out[key];
    double **ref = scratch;
    if (refs) {
        for (int k = 0; k < refs->n_out[key]; k++) free(refs->out[key][k]);
        refs->inputs_hash[key] = h, refs->n_out[key] = r->n_out, ref = refs->out[key];
    }
    for (int k = 0; k < r->n_out; k++) ref[k] = calloc(r->out_n[k] ? r->out_n[k] : 1, sizeof(double));
    r->c->ref(r, ref);
    return ref;
}

int op_cases_check_reference(const Backend *be, OpRefs *refs, int *checks) {
    int failures = 0;
    int device_only = 0;
    for (int key = 0; key < OP_CASE_COUNT; key++) {
        if (!family_selected(OP_CASES[key].family)) continue;
        if (OP_CASES[key].device_only) {
            device_only++;
            continue;
        }
        OpRun r;
        op_run(&r, be, key, NULL);
        double *scratch[OP_MAX_TENSORS], **ref = references(&r, refs, scratch);
        for (int k = 0; k < r.n_out; k++) {
            double worst = 0.0;
            for (size_t i = 0; i < r.out_n[k]; i++) {
                double d = fabs((double)r.out[k][i] - ref[k][i]);
                if (!(d <= worst)) worst = d; /* NaN counts as worst */
            }
            bool ok = r.out_n[k] > 0 && worst <= r.out_tol[k].ref_abs;
            (*checks)++;
            failures += !ok;
            printf("%s %-62s max |err| = %.3g (tol %.0e)\n", ok ? "ok  " : "FAIL", r.out_name[k], worst,
                   r.out_tol[k].ref_abs);
            if (!refs) free(ref[k]);
        }
        op_run_free(&r);
    }
    if (device_only) printf("(%d cases of device paths only, not run against the double reference)\n", device_only);
    return failures;
}

bool op_check_against(const char *tag, bool bf16, const char *what, const float *got, const float *ref, size_t n,
                      OpTol t) {
    if (bf16 && t.bf16_k == OP_BF16_ROUNDED) { /* the CPU's values rounded as the device stores them, then exact */
        float *rounded = xmalloc((n ? n : 1) * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)float_to_bf16(ref[i]) << 16;
            memcpy(&rounded[i], &u, sizeof u);
        }
        bool ok = op_check_against(tag, false, what, got, rounded, n, (OpTol){0, 0, 0, 0});
        free(rounded);
        return ok;
    }
    double maxref = 0.0;
    for (size_t i = 0; i < n; i++) maxref = fmax(maxref, fabs((double)ref[i]));
    double atol = bf16 ? t.bf16_abs * maxref : t.f32_rel * maxref;
    double k = bf16 ? t.bf16_k / 256.0 : 0.0;
    double worst_abs = 0.0, worst_rel = 0.0, worst_ratio = -1.0;
    size_t worst_i = 0, n_bad = 0;
    for (size_t i = 0; i < n; i++) {
        double r = ref[i], g = got[i];
        double err = fabs(g - r);
        if (isnan(g) || isinf(g)) err = INFINITY;
        double tol = atol + fabs(r) * k;
        if (err > worst_abs) worst_abs = err;
        if (fabs(r) > 1e-3 * maxref && err / fabs(r) > worst_rel) worst_rel = err / fabs(r);
        double ratio = tol > 0 ? err / tol : (err > 0 ? INFINITY : 0.0);
        if (ratio > worst_ratio) worst_ratio = ratio, worst_i = i;
        if (!(err <= tol)) n_bad++;
    }
    bool ok = n > 0 && n_bad == 0;
    printf("%s %-9s %-58s max|err| %.3e  max rel %.3e  tol %.1e + |ref|*%.2g  (max|ref| %.3g, n %zu)\n",
           ok ? "ok  " : "FAIL", tag, what, worst_abs, worst_rel, atol, k, maxref, n);
    if (!ok && n > 0)
        printf("     %zu elements out of tolerance; worst at [%zu]: %s %.9g cpu %.9g\n", n_bad, worst_i, tag,
               (double)got[worst_i], (double)ref[worst_i]);
    return ok;
}

int op_cases_check_backend(const Backend *dev, const char *tag, const Backend *cpu, int *checks) {
    int failures = 0;
    bool bf16 = dev->storage != DTYPE_F32;
    for (int key = 0; key < OP_CASE_COUNT; key++) {
        if (!family_selected(OP_CASES[key].family)) continue;
        OpRun d, c;
        op_run(&d, dev, key, NULL);
        op_run(&c, cpu, key, &d);
        COLT_ASSERT(c.n_out == d.n_out);
        for (int k = 0; k < d.n_out; k++) {
            COLT_ASSERT(c.out_n[k] == d.out_n[k]);
            (*checks)++;
            failures += !op_check_against(tag, bf16, d.out_name[k], d.out[k], c.out[k], d.out_n[k], d.out_tol[k]);
        }
        op_run_free(&d);
        op_run_free(&c);
    }
    return failures;
}

/* ================================================================ linear
 * i: N, in, out, with_bias; f: w scale (0: 1/sqrt(in)), bias scale. */

static void run_linear(OpRun *r) {
    const OpCase *c = r->c;
    int n = c->i[0], in = c->i[1], out = c->i[2], bias = c->i[3];
    float ws = c->f[0] > 0 ? c->f[0] : 1.0f / sqrtf((float)in);
    void *x = op_in(r, (size_t)n * in, 1.0f, NULL), *w = op_in(r, (size_t)out * in, ws, NULL),
         *b = op_in(r, out, c->f[1], NULL), *o = op_alloc(r, (size_t)n * out);
    r->be->linear(r->be, o, x, w, bias ? b : NULL, n, in, out);
    op_out(r, (OpTol){1e-5, 2e-5, 2e-3, 1.5}, o, (size_t)n * out, "linear%s [%d,%d]x[%d,%d]^T",
           bias ? " +bias" : "", n, in, out, in);
}

static void ref_linear(const OpRun *r, double **ref) {
    const OpCase *c = r->c;
    int n = c->i[0], in = c->i[1], out = c->i[2], bias = c->i[3];
    const float *x = op_input(r, 0), *w = op_input(r, 1), *b = op_input(r, 2);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double s = bias ? b[o] : 0.0;
            for (int k = 0; k < in; k++) s += (double)x[(size_t)i * in + k] * w[(size_t)o * in + k];
            ref[0][(size_t)i * out + o] = s;
        }
}

/* i: N, in, out, with_dx, accumulate dx, with_db; f: w scale (0: 1/sqrt(in)). dw and db are [f32] and
 * accumulate; every "+=" output starts from random values. */
static void run_linear_backward(OpRun *r) {
    const OpCase *c = r->c;
    int n = c->i[0], in = c->i[1], out = c->i[2], with_dx = c->i[3], acc = c->i[4], with_db = c->i[5];
    size_t nx = (size_t)n * in, nw = (size_t)out * in, ny = (size_t)n * out;
    float ws = c->f[0] > 0 ? c->f[0] : 1.0f / sqrtf((float)in);
    void *x = op_in(r, nx, 1.0f, NULL), *w = op_in(r, nw, ws, NULL), *dy = op_in(r, ny, 1.0f, NULL);
    void *dx = op_in(r, nx, 1.0f, NULL), *dw = op_in_f32(r, nw, 1.0f, NULL), *db = op_in_f32(r, out, 1.0f, NULL);
    r->be->linear_backward(r->be, with_dx ? dx : NULL, dw, with_db ? db : NULL, dy, x, w, n, in, out, acc);
    if (with_dx)
        op_out(r, (OpTol){1e-5, 2e-5, 2e-3, 1.5}, dx, nx, "linear_backward dx%s [%d,%d] w[%d,%d]",
               acc ? " (+=)" : " (=)", n, out, out, in);
    /* dw and db are fp32 sums over the N rows: against the double reference the bound grows with N
     * (1e-5 at N = 13; measured 5.2e-5 at N = 300, bound 2.3e-4) */
    OpTol sum_tol = {1e-5 * fmax(1.0, n / 13.0), 2e-5, 5e-5, 0};
    op_out_f32(r, sum_tol, dw, nw, "linear_backward dw [f32] += [%d,%d] (N=%d)", out, in, n);
    if (with_db) op_out_f32(r, sum_tol, db, out, "linear_backward db [f32] += [%d] (N=%d)", out, n);
}

static void ref_linear_backward(const OpRun *r, double **ref) {
    const OpCase *c = r->c;
    int n = c->i[0], in = c->i[1], out = c->i[2], with_dx = c->i[3], acc = c->i[4], with_db = c->i[5];
    const float *x = op_input(r, 0), *w = op_input(r, 1), *dy = op_input(r, 2), *dx0 = op_input(r, 3),
                *dw0 = op_input(r, 4), *db0 = op_input(r, 5);
    int k = 0;
    if (with_dx) {
        for (int i = 0; i < n; i++)
            for (int j = 0; j < in; j++) {
                double s = acc ? dx0[(size_t)i * in + j] : 0.0;
                for (int o = 0; o < out; o++) s += (double)dy[(size_t)i * out + o] * w[(size_t)o * in + j];
                ref[k][(size_t)i * in + j] = s;
            }
        k++;
    }
    for (int o = 0; o < out; o++)
        for (int j = 0; j < in; j++) {
            double s = dw0[(size_t)o * in + j];
            for (int i = 0; i < n; i++) s += (double)dy[(size_t)i * out + o] * x[(size_t)i * in + j];
            ref[k][(size_t)o * in + j] = s;
        }
    k++;
    if (with_db)
        for (int o = 0; o < out; o++) {
            double s = db0[o];
            for (int i = 0; i < n; i++) s += dy[(size_t)i * out + o];
            ref[k][o] = s;
        }
}

/* ================================================================ rmsnorm
 * i: N, D, in place (out = x: Qwen3's per-head q/k norm); f: eps, x scale. */

static void run_rmsnorm(OpRun *r) {
    const OpCase *c = r->c;
    int n = c->i[0], dim = c->i[1], in_place = c->i[2];
    size_t nx = (size_t)n * dim;
    void *x = op_in(r, nx, c->f[1], NULL), *w = op_in(r, dim, 1.0f, NULL), *o = in_place ? x : op_alloc(r, nx);
    r->be->rmsnorm(r->be, o, x, w, n, dim, c->f[0]);
    op_out(r, (OpTol){1e-5, 1e-5, 1e-4, 1.5}, o, nx, "rmsnorm%s [%d,%d]", in_place ? " in place" : "", n, dim);
}

static void rmsnorm_row_ref(double *y, const double *x, const double *w, int d, double eps) {
    double ss = 0;
    for (int j = 0; j < d; j++) ss += x[j] * x[j];
    double r = 1.0 / sqrt(ss / d + eps);
    for (int j = 0; j < d; j++) y[j] = x[j] * r * w[j];
}

static void ref_rmsnorm(const OpRun *r, double **ref) {
    const OpCase *c = r->c;
    int n = c->i[0], dim = c->i[1];
    const float *x = op_input(r, 0), *w = op_input(r, 1);
    double *xd = malloc((size_t)dim * sizeof(double)), *wd = malloc((size_t)dim * sizeof(double));
    for (int j = 0; j < dim; j++) wd[j] = w[j];
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < dim; j++) xd[j] = x[(size_t)i * dim + j];
        rmsnorm_row_ref(ref[0] + (size_t)i * dim, xd, wd, dim, c->f[0]);
    }
    free(xd), free(wd);
}

/* i: N, D, with dw (0: a frozen norm, dw NULL, left as it was); f: eps, x scale, dx start scale.
 * dx (storage) and dw ([f32]) accumulate onto random starting values. */
static void run_rmsnorm_backward(OpRun *r) {
    const OpCase *c = r->c;
    int n = c->i[0], dim = c->i[1], with_dw = c->i[2];
    size_t nx = (size_t)n * dim;
    void *x = op_in(r, nx, c->f[1], NULL), *w = op_in(r, dim, 1.0f, NULL), *dy = op_in(r, nx, 1.0f, NULL);
    void *dx = op_in(r, nx, c->f[2], NULL), *dw = op_in_f32(r, dim, 1.0f, NULL);
    r->be->rmsnorm_backward(r->be, dx, with_dw ? dw : NULL, dy, x, w, n, dim, c->f[0]);
    op_out(r, (OpTol){1e-5, 1e-5, 1e-3, 1.5}, dx, nx, "rmsnorm_backward dx (+=)%s [%d,%d]", with_dw ? "" : ", dw NULL",
           n, dim);
    op_out_f32(r, (OpTol){1e-5, 1e-5, 5e-5, 0}, dw, dim, "rmsnorm_backward dw [f32] %s [%d]",
               with_dw ? "+=" : "untouched (NULL)", dim);
}

/* Central finite differences (h = 1e-5 on a double forward, error ~1e-9): independent of the kernel's
 * formula. */
static void ref_rmsnorm_backward(const OpRun *r, double **ref) {
    const OpCase *c = r->c;
    int n = c->i[0], d = c->i[1], with_dw = c->i[2];
    double eps = c->f[0], h = 1e-5;
    const float *x = op_input(r, 0), *w = op_input(r, 1), *dy = op_input(r, 2), *dx0 = op_input(r, 3),
                *dw0 = op_input(r, 4);
    double *xi = malloc((size_t)d * sizeof(double)), *wd = malloc((size_t)d * sizeof(double));
    double *yp = malloc((size_t)d * sizeof(double)), *ym = malloc((size_t)d * sizeof(double));
    for (int j = 0; j < d; j++) wd[j] = w[j], ref[1][j] = dw0[j];
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < d; j++) xi[j] = x[(size_t)i * d + j];
        for (int k = 0; k < d; k++) { /* d/dx_k of sum_j dy_j y_j */
            double keep = xi[k], s = 0;
            xi[k] = keep + h, rmsnorm_row_ref(yp, xi, wd, d, eps);
            xi[k] = keep - h, rmsnorm_row_ref(ym, xi, wd, d, eps);
            xi[k] = keep;
            for (int j = 0; j < d; j++) s += dy[(size_t)i * d + j] * (yp[j] - ym[j]) / (2 * h);
            ref[0][(size_t)i * d + k] = dx0[(size_t)i * d + k] + s;
        }
        if (!with_dw) continue;
        /* d/dw_k: only y_k = x_k w_k / rms(x) depends on w_k, linearly: dy_k x_k / rms(x) */
        double ss = 0;
        for (int j = 0; j < d; j++) ss += xi[j] * xi[j];
        for (int k = 0; k < d; k++) ref[1][k] += dy[(size_t)i * d + k] * xi[k] / sqrt(ss / d + eps);
    }
    free(xi), free(wd), free(yp), free(ym);
}

/* ================================================================ rope
 * i: N, heads, Dh, max position, backward; f: theta; list: the positions (NULL: the first token at the
 * max position, the rest drawn below it). In place on x[N, heads, Dh]. */

static void run_rope(OpRun *r) {
    const OpCase *c = r->c;
    int n = c->i[0], heads = c->i[1], dh = c->i[2], max_pos = c->i[3], backward = c->i[4];
    float theta = c->f[0];
    size_t nx = (size_t)n * heads * dh;
    void *x = op_in(r, nx, 1.0f, NULL);
    int *pos = op_ints(r, (size_t)n);
    for (int i = 0; i < n; i++) pos[i] = c->list ? c->list[i] : i == 0 ? max_pos : op_rand_int(r, 0, max_pos);
    if (backward)
        r->be->rope_backward(r->be, x, pos, n, heads, dh, rope_table(dh, theta));
    else
        r->be->rope(r->be, x, pos, n, heads, dh, rope_table(dh, theta));
    /* fp32 angles (as transformers computes them) lose ~pos * 6e-8 rad against the double reference */
    op_out(r, (OpTol){1e-4, 1e-5, 1e-4, 1.5}, x, nx, "%s [%d,%d,%d] theta %g pos<=%d",
           backward ? "rope_backward (R^T)" : "rope", n, heads, dh, theta, max_pos);
}

static void ref_rope(const OpRun *r, double **ref) {
    const OpCase *c = r->c;
    int n = c->i[0], heads = c->i[1], dh = c->i[2], backward = c->i[4];
    double theta = c->f[0], sign = backward ? -1.0 : 1.0; /* backward: R^T, the inverse rotation */
    const float *x = op_input(r, 0);
    const int *pos = r->ints[0];
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++)
            for (int j = 0; j < dh / 2; j++) {
                double f = pos[i] * pow(theta, -2.0 * j / dh);
                size_t base = ((size_t)i * heads + h) * dh;
                double a = x[base + j], b = x[base + j + dh / 2];
                ref[0][base + j] = a * cos(f) - sign * b * sin(f);
                ref[0][base + j + dh / 2] = b * cos(f) + sign * a * sin(f);
            }
}

/* ================================================================ elementwise
 * i: n; f: gate scale. swiglu, swiglu_backward, add (and in place: out = a), mul_scalar (and in place), add_scaled
 * (and in place: out = a, as the reference model's sync runs it). */

static void run_elementwise(OpRun *r) {
    const OpCase *c = r->c;
    size_t n = (size_t)c->i[0];
    const Backend *be = r->be;
    void *g = op_in(r, n, c->f[0], NULL), *u = op_in(r, n, 1.0f, NULL), *dout = op_in(r, n, 1.0f, NULL);
    void *o = op_alloc(r, n), *o2 = op_alloc(r, n);
    OpTol swiglu_tol = {1e-5, 1e-5, 1e-5, 1.5}, add_tol = {1e-5, 1e-6, 1e-6, 1.0}; /* fp32 expf, |out| up to ~30 */
    be->swiglu(be, o, g, u, n);
    op_out(r, swiglu_tol, o, n, "swiglu [%zu]", n);
    be->swiglu_backward(be, o, o2, dout, g, u, n);
    op_out(r, swiglu_tol, o, n, "swiglu_backward dgate [%zu]", n);
    op_out(r, swiglu_tol, o2, n, "swiglu_backward dup [%zu]", n);
    be->add(be, o, g, u, n);
    op_out(r, add_tol, o, n, "add [%zu]", n);
    be->add(be, g, g, u, n); /* out aliases a */
    op_out(r, add_tol, g, n, "add in place (out = a) [%zu]", n);
    be->mul_scalar(be, o, u, 0.3711f, n);
    op_out(r, add_tol, o, n, "mul_scalar [%zu]", n);
    be->mul_scalar(be, u, u, 2.5f, n);
    op_out(r, add_tol, u, n, "mul_scalar in place [%zu]", n);
    void *x = op_in(r, n, 1.0f, NULL), *y = op_in(r, n, 1.0f, NULL);
    be->add_scaled(be, o, x, y, 0.6f, n);
    op_out(r, add_tol, o, n, "add_scaled [%zu]", n);
    /* in place, as the reference model's sync runs it (ref = (1 - a) ref by mul_scalar, then ref += a policy);
     * alone here, so the result is rounded once like the others (the pair is test_sync_ref's) */
    be->add_scaled(be, x, x, y, 0.6f, n);
    op_out(r, add_tol, x, n, "add_scaled in place (out = a) [%zu]", n);
}

static void swiglu_ref(double *out, double *dgate, double *dup, const float *g, const float *u, const float *dout,
                       size_t n) {
    for (size_t i = 0; i < n; i++) {
        double x = g[i], sg = 1.0 / (1.0 + exp(-x));
        if (out) out[i] = x * sg * u[i];
        if (dgate) dgate[i] = dout[i] * u[i] * (sg + x * sg * (1.0 - sg));
        if (dup) dup[i] = dout[i] * x * sg;
    }
}

static void ref_elementwise(const OpRun *r, double **ref) {
    size_t n = (size_t)r->c->i[0];
    const float *g = op_input(r, 0), *u = op_input(r, 1), *dout = op_input(r, 2);
    swiglu_ref(ref[0], ref[1], ref[2], g, u, dout, n);
    for (size_t i = 0; i < n; i++) {
        ref[3][i] = ref[4][i] = (double)g[i] + u[i];
        ref[5][i] = (double)u[i] * 0.3711f;
        ref[6][i] = (double)u[i] * 2.5;
    }
    const float *x = op_input(r, 3), *y = op_input(r, 4);
    for (size_t i = 0; i < n; i++) {
        ref[7][i] = (double)x[i] + 0.6 * y[i];
        ref[8][i] = ref[7][i];
    }
}

/* i: n, offset: swiglu, swiglu_backward and add on pointers `offset` elements into their buffers
 * (offset 1: misaligned for 16-byte vectors, the scalar path; n odd: a tail). */
static void run_elementwise_offset(OpRun *r) {
    const OpCase *c = r->c;
    size_t n = (size_t)c->i[0], off = (size_t)c->i[1], nb = n + off, es = dtype_size(r->be->storage);
    const Backend *be = r->be;
    void *g = op_in(r, nb, 3.0f, NULL), *u = op_in(r, nb, 1.0f, NULL), *dout = op_in(r, nb, 1.0f, NULL);
    void *o = op_alloc(r, nb), *o2 = op_alloc(r, nb);
#define AT(p) ((void *)((char *)(p) + off * es))
    OpTol swiglu_tol = {1e-5, 1e-5, 1e-5, 1.5}, add_tol = {1e-5, 1e-6, 1e-6, 1.0};
    be->swiglu(be, AT(o), AT(g), AT(u), n);
    op_out_host(r, swiglu_tol, op_download(r, o, nb) + off, n, "swiglu offset %zu [%zu]", off, n);
    be->swiglu_backward(be, AT(o), AT(o2), AT(dout), AT(g), AT(u), n);
    op_out_host(r, swiglu_tol, op_download(r, o2, nb) + off, n, "swiglu_backward dup offset %zu [%zu]", off, n);
    be->add(be, AT(o), AT(g), AT(u), n);
    op_out_host(r, add_tol, op_download(r, o, nb) + off, n, "add offset %zu [%zu]", off, n);
#undef AT
}

static void ref_elementwise_offset(const OpRun *r, double **ref) {
    size_t n = (size_t)r->c->i[0], off = (size_t)r->c->i[1];
    const float *g = op_input(r, 0) + off, *u = op_input(r, 1) + off, *dout = op_input(r, 2) + off;
    swiglu_ref(ref[0], NULL, ref[1], g, u, dout, n);
    for (size_t i = 0; i < n; i++) ref[2][i] = (double)g[i] + u[i];
}

/* ================================================================ copies
 * copy — i: n, dst offset, src offset, count: src[src_off, +count) into dst[dst_off, +count), the rest of
 * dst as it was (exact). gather_scatter — i: rows, D, n; list: the rows: gather_rows, then scatter_rows
 * of what it gathered back into the source (exact: the rows land where they came from). */

static void run_copy(OpRun *r) {
    const OpCase *c = r->c;
    size_t n = (size_t)c->i[0];
    void *dst = op_in(r, n, 1.0f, NULL), *src = op_in(r, n, 1.0f, NULL);
    r->be->copy(r->be, dst, (size_t)c->i[1], src, (size_t)c->i[2], (size_t)c->i[3]);
    op_out(r, (OpTol){0, 0, 0, 0}, dst, n, "copy [%d of %zu] (dst off %d, src off %d)", c->i[3], n, c->i[1], c->i[2]);
}

static void ref_copy(const OpRun *r, double **ref) {
    const OpCase *c = r->c;
    const float *dst = op_input(r, 0), *src = op_input(r, 1);
    size_t n = (size_t)c->i[0], lo = (size_t)c->i[1], hi = lo + (size_t)c->i[3];
    for (size_t i = 0; i < n; i++) ref[0][i] = i >= lo && i < hi ? src[i - lo + (size_t)c->i[2]] : dst[i];
}

static void run_gather_scatter(OpRun *r) {
    const OpCase *c = r->c;
    int rows = c->i[0], dim = c->i[1], n = c->i[2];
    int *idx = op_ints(r, (size_t)n);
    memcpy(idx, c->list, (size_t)n * sizeof(int));
    void *src = op_in(r, (size_t)rows * dim, 1.0f, NULL), *g = op_alloc(r, (size_t)n * dim);
    r->be->gather_rows(r->be, g, src, idx, n, dim);
    op_out(r, (OpTol){0, 0, 0, 0}, g, (size_t)n * dim, "gather_rows %d of [%d,%d]", n, rows, dim);
    r->be->scatter_rows(r->be, src, g, idx, n, dim);
    op_out(r, (OpTol){0, 0, 0, 0}, src, (size_t)rows * dim, "scatter_rows %d into [%d,%d]", n, rows, dim);
}

/* copy_2d — i: rows, columns, src stride, dst stride, src column, dst column: a block between strided
 * matrices (a vocabulary part cut out of logits, or put back), the rest of dst as it was (exact). */
static void run_copy_2d(OpRun *r) {
    const OpCase *c = r->c;
    int rows = c->i[0], cols = c->i[1], ss = c->i[2], ds = c->i[3], soff = c->i[4], doff = c->i[5];
    size_t es = dtype_size(r->be->storage);
    void *src = op_in(r, (size_t)rows * ss, 1.0f, NULL), *dst = op_in(r, (size_t)rows * ds, 1.0f, NULL);
    r->be->copy_2d(r->be, (char *)dst + (size_t)doff * es, (size_t)ds, (char *)src + (size_t)soff * es, (size_t)ss,
                   rows, cols);
    op_out(r, (OpTol){0, 0, 0, 0}, dst, (size_t)rows * ds,
           "copy_2d [%d,%d] from stride %d (col %d) to stride %d (col %d)", rows, cols, ss, soff, ds, doff);
}

static void ref_copy_2d(const OpRun *r, double **ref) {
    const OpCase *c = r->c;
    int rows = c->i[0], cols = c->i[1], ss = c->i[2], ds = c->i[3], soff = c->i[4], doff = c->i[5];
    const float *src = op_input(r, 0), *dst = op_input(r, 1);
    for (size_t e = 0; e < (size_t)rows * ds; e++) ref[0][e] = dst[e];
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) ref[0][(size_t)i * ds + doff + j] = src[(size_t)i * ss + soff + j];
}

static void ref_gather_scatter(const OpRun *r, double **ref) {
    int rows = r->c->i[0], dim = r->c->i[1], n = r->c->i[2];
    const float *src = op_input(r, 0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < dim; j++) ref[0][(size_t)i * dim + j] = src[(size_t)r->ints[0][i] * dim + j];
    for (size_t e = 0; e < (size_t)rows * dim; e++) ref[1][e] = src[e];
}

/* ================================================================ embedding
 * i: V, D, N; f: scale of dtable's starting values; list: the ids (NULL: drawn, with repeats, the first
 * the last row). embedding (exact), then embedding_backward into an [f32] table (+=, repeated ids sum). */

static void run_embedding(OpRun *r) {
    const OpCase *c = r->c;
    int vocab = c->i[0], dim = c->i[1], n = c->i[2];
    size_t nt = (size_t)vocab * dim, no = (size_t)n * dim;
    int *ids = op_ints(r, (size_t)n);
    for (int i = 0; i < n; i++)
        ids[i] = c->list ? c->list[i] : i % 3 == 2 ? ids[i - 1] : i == 0 ? vocab - 1 : op_rand_int(r, 0, vocab - 1);
    void *t = op_in(r, nt, 1.0f, NULL), *dout = op_in(r, no, 1.0f, NULL), *dt = op_in_f32(r, nt, c->f[0], NULL);
    void *o = op_alloc(r, no);
    r->be->embedding(r->be, o, t, ids, n, dim);
    op_out(r, (OpTol){0, 0, 0, 0}, o, no, "embedding V=%d D=%d N=%d (exact)", vocab, dim, n);
    r->be->embedding_backward(r->be, dt, dout, ids, n, dim);
    op_out_f32(r, (OpTol){1e-6, 1e-6, 1e-6, 0}, dt, nt, "embedding_backward dtable [f32] += V=%d D=%d N=%d", vocab,
               dim, n);
}

static void ref_embedding(const OpRun *r, double **ref) {
    int vocab = r->c->i[0], dim = r->c->i[1], n = r->c->i[2];
    const int *ids = r->ints[0];
    const float *t = op_input(r, 0), *dout = op_input(r, 1), *dt0 = op_input(r, 2);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < dim; j++) ref[0][(size_t)i * dim + j] = t[(size_t)ids[i] * dim + j];
    for (size_t e = 0; e < (size_t)vocab * dim; e++) ref[1][e] = dt0[e];
    for (int i = 0; i < n; i++)
        for (int j = 0; j < dim; j++) ref[1][(size_t)ids[i] * dim + j] += dout[(size_t)i * dim + j];
}

/* Tensor parallelism's vocabulary-parallel embedding — i: V, D, N, lo, hi: rows [lo, hi) of the table on
 * this "rank". vocab_shard_ids_i32 of drawn ids (both ends of the part and one just outside), exact; then
 * with those ids embedding and embedding_i32 (zero rows for ids < 0, written over stale contents) and
 * embedding_backward into an [f32] part (ids < 0 skipped). */
static void run_embedding_part(OpRun *r) {
    const OpCase *c = r->c;
    int vocab = c->i[0], dim = c->i[1], n = c->i[2], lo = c->i[3], hi = c->i[4], vp = hi - lo;
    size_t nt = (size_t)vp * dim, no = (size_t)n * dim;
    const Backend *be = r->be;
    int *ids = op_ints(r, (size_t)n), *part_ids = op_ints(r, (size_t)n);
    for (int i = 0; i < n; i++) ids[i] = op_rand_int(r, 0, vocab - 1);
    ids[0] = lo, ids[n - 1] = hi - 1;
    if (n > 2) ids[1] = lo > 0 ? lo - 1 : hi;
    void *gids = track_buf(r, op_upload_i32(be, ids, (size_t)n)), *gpart = track_buf(r, be->alloc_i32(be, (size_t)n));
    be->vocab_shard_ids_i32(be, gpart, gids, n, lo, hi);
    be->download_i32(be, part_ids, gpart, (size_t)n);
    float *as_float = track_host(r, malloc((size_t)n * sizeof(float)));
    for (int i = 0; i < n; i++) as_float[i] = (float)part_ids[i];
    OpTol exact = {0, 0, 0, 0};
    op_out_host(r, exact, as_float, (size_t)n, "vocab_shard_ids_i32 [%d,%d) of V=%d N=%d", lo, hi, vocab, n);
    void *t = op_in(r, nt, 1.0f, NULL), *o = op_in(r, no, 1.0f, NULL), *o_i32 = op_in(r, no, 1.0f, NULL);
    be->embedding(be, o, t, part_ids, n, dim);
    op_out(r, exact, o, no, "embedding part [%d,%d) D=%d N=%d, ids<0 zero (exact)", lo, hi, dim, n);
    be->embedding_i32(be, o_i32, t, gpart, n, dim);
    op_out(r, exact, o_i32, no, "embedding_i32 part [%d,%d) D=%d N=%d, ids<0 zero (exact)", lo, hi, dim, n);
    void *dout = op_in(r, no, 1.0f, NULL), *dt = op_in_f32(r, nt, 0.1f, NULL);
    be->embedding_backward(be, dt, dout, part_ids, n, dim);
    op_out_f32(r, (OpTol){1e-6, 1e-6, 1e-6, 0}, dt, nt, "embedding_backward part [%d,%d) D=%d N=%d, ids<0 skipped",
               lo, hi, dim, n);
}

static void ref_embedding_part(const OpRun *r, double **ref) {
    int dim = r->c->i[1], n = r->c->i[2], lo = r->c->i[3], hi = r->c->i[4], vp = hi - lo;
    const int *ids = r->ints[0];
    const float *t = op_input(r, 0), *dout = op_input(r, 3), *dt0 = op_input(r, 4);
    for (size_t e = 0; e < (size_t)vp * dim; e++) ref[3][e] = dt0[e];
    for (int i = 0; i < n; i++) {
        int p = ids[i] >= lo && ids[i] < hi ? ids[i] - lo : -1;
        ref[0][i] = p;
        for (int j = 0; j < dim; j++) {
            ref[1][(size_t)i * dim + j] = ref[2][(size_t)i * dim + j] = p < 0 ? 0.0 : t[(size_t)p * dim + j];
            if (p >= 0) ref[3][(size_t)p * dim + j] += dout[(size_t)i * dim + j];
        }
    }
}

/* ================================================================ kv cache
 * i: S, L, kv_dim, N. kv_store of N tokens over S slots (slot s holds L - 3s positions; each slot's last
 * position, the rest drawn, no (slot, pos) twice so the store is well defined), exact; then kv_gather of
 * the same tokens from [f32] caches into storage rows (bf16: rounded once). */

/* Tokens over n_slots slots of the given lengths: each slot's last position, then random distinct ones. */
static void make_tokens(OpRun *r, int *slot, int *pos, int n, int n_slots, const int *lens) {
    int k = 0;
    for (int s = 0; s < n_slots && k < n; s++) slot[k] = s, pos[k] = lens[s] - 1, k++;
    while (k < n) {
        int s = op_rand_int(r, 0, n_slots - 1), p = op_rand_int(r, 0, lens[s] - 1), dup = 0;
        for (int j = 0; j < k; j++) dup |= slot[j] == s && pos[j] == p;
        if (!dup) slot[k] = s, pos[k] = p, k++;
    }
}

static void run_kv(OpRun *r) {
    const OpCase *c = r->c;
    int n_slots = c->i[0], max_len = c->i[1], kv_dim = c->i[2], n = c->i[3], lens[8];
    COLT_ASSERT(n_slots <= 8);
    for (int s = 0; s < n_slots; s++) lens[s] = max_len - 3 * s;
    int *slot = op_ints(r, (size_t)n), *pos = op_ints(r, (size_t)n);
    make_tokens(r, slot, pos, n, n_slots, lens);
    size_t nc = (size_t)n_slots * max_len * kv_dim, nt = (size_t)n * kv_dim;
    void *kc = op_in(r, nc, 1.0f, NULL), *vc = op_in(r, nc, 1.0f, NULL), *k = op_in(r, nt, 1.0f, NULL),
         *v = op_in(r, nt, 1.0f, NULL);
    r->be->kv_store(r->be, kc, vc, k, v, slot, pos, n, kv_dim, max_len);
    OpTol exact = {0, 0, 0, 0}, rounded = {0, 0, 0, 1.0};
    op_out(r, exact, kc, nc, "kv_store k_cache [%d,%d,%d] N=%d (exact)", n_slots, max_len, kv_dim, n);
    op_out(r, exact, vc, nc, "kv_store v_cache [%d,%d,%d] N=%d (exact)", n_slots, max_len, kv_dim, n);
    void *fk = op_in_f32(r, nc, 1.0f, NULL), *fv = op_in_f32(r, nc, 1.0f, NULL);
    r->be->kv_gather(r->be, k, v, fk, fv, slot, pos, n, kv_dim, max_len);
    op_out(r, rounded, k, nt, "kv_gather k [%d,%d] from [f32] cache", n, kv_dim);
    op_out(r, rounded, v, nt, "kv_gather v [%d,%d] from [f32] cache", n, kv_dim);
}

static void ref_kv(const OpRun *r, double **ref) {
    const OpCase *c = r->c;
    int n_slots = c->i[0], max_len = c->i[1], kv_dim = c->i[2], n = c->i[3];
    const int *slot = r->ints[0], *pos = r->ints[1];
    size_t nc = (size_t)n_slots * max_len * kv_dim;
    for (int q = 0; q < 2; q++) { /* k, then v */
        const float *cache = op_input(r, q), *rows = op_input(r, 2 + q), *f32_cache = op_input(r, 4 + q);
        for (size_t e = 0; e < nc; e++) ref[q][e] = cache[e];
        for (int i = 0; i < n; i++)
            for (int j = 0; j < kv_dim; j++) {
                size_t at = ((size_t)slot[i] * max_len + pos[i]) * kv_dim + j;
                ref[q][at] = rows[(size_t)i * kv_dim + j];
                ref[2 + q][(size_t)i * kv_dim + j] = f32_cache[at];
            }
    }
}

/* ================================================================ log-softmax
 * i: N, V; f: temperature, logits scale; list: the targets (NULL: drawn, every fifth row from the fourth
 * without one: -1). log_softmax_target's log-probs and entropies [f32] (0 in a row without target), again
 * with entropy NULL; its backward with dlogprobs [f32], with the entropy's gradient as well
 * (log_softmax_entropy_backward, dentropy [f32]), and out of place and in place (dlogits = logits). */

static void run_log_softmax(OpRun *r) {
    const OpCase *c = r->c;
    int n = c->i[0], vocab = c->i[1];
    float temp = c->f[0];
    size_t nl = (size_t)n * vocab;
    const Backend *be = r->be;
    int *tg = op_ints(r, (size_t)n);
    for (int i = 0; i < n; i++) tg[i] = c->list ? c->list[i] : i % 5 == 3 ? -1 : op_rand_int(r, 0, vocab - 1);
    void *lg = op_in(r, nl, c->f[1], NULL), *dlp = op_in_f32(r, (size_t)n, 1.0f, NULL);
    void *lp = op_alloc_f32(r, (size_t)n), *ent = op_alloc_f32(r, (size_t)n), *dl = op_alloc(r, nl);
    OpTol stat_tol = {1e-5, 1e-5, 2e-5, 0}, grad_tol = {1e-6, 1e-5, 1e-4, 1.5};
    be->log_softmax_target(be, lp, ent, lg, tg, n, vocab, temp);
    op_out_f32(r, stat_tol, lp, (size_t)n, "log_softmax_target logprobs N=%d V=%d T=%g", n, vocab, temp);
    op_out_f32(r, stat_tol, ent, (size_t)n, "log_softmax_target entropy N=%d V=%d T=%g", n, vocab, temp);
    be->log_softmax_target(be, lp, NULL, lg, tg, n, vocab, temp);
    op_out_f32(r, stat_tol, lp, (size_t)n, "log_softmax_target (entropy NULL) N=%d V=%d", n, vocab);
    be->log_softmax_target_backward(be, dl, lg, tg, dlp, n, vocab, temp);
    op_out(r, grad_tol, dl, nl, "log_softmax_target_backward N=%d V=%d T=%g", n, vocab, temp);
    /* with the entropy's gradient too (TRL's entropy bonus): d/dlogits of dlp * logprob + dh * entropy */
    void *dh = op_in_f32(r, (size_t)n, 1.0f, NULL), *dle = op_alloc(r, nl);
    be->log_softmax_entropy_backward(be, dle, lg, tg, dlp, dh, n, vocab, temp);
    op_out(r, grad_tol, dle, nl, "log_softmax_entropy_backward N=%d V=%d T=%g", n, vocab, temp);
    be->log_softmax_target_backward(be, lg, lg, tg, dlp, n, vocab, temp);
    op_out(r, grad_tol, lg, nl, "log_softmax_target_backward in place N=%d V=%d", n, vocab);
}

/* entropy of row at temperature T (logprob_ref's, alone). */
static double entropy_ref(const double *row, int vocab, double temp) {
    double mx = -INFINITY, sum = 0, pz = 0;
    for (int v = 0; v < vocab; v++) mx = fmax(mx, row[v] / temp);
    for (int v = 0; v < vocab; v++) sum += exp(row[v] / temp - mx);
    double lse = mx + log(sum);
    for (int v = 0; v < vocab; v++) pz += exp(row[v] / temp - lse) * (row[v] / temp);
    return lse - pz;
}

/* log p(target) of row at temperature T, and its entropy when asked. */
static double logprob_ref(const double *row, int vocab, int target, double temp, double *entropy) {
    double mx = -INFINITY, sum = 0, pz = 0;
    for (int v = 0; v < vocab; v++) mx = fmax(mx, row[v] / temp);
    for (int v = 0; v < vocab; v++) sum += exp(row[v] / temp - mx);
    double lse = mx + log(sum);
    if (entropy) {
        for (int v = 0; v < vocab; v++) pz += exp(row[v] / temp - lse) * (row[v] / temp);
        *entropy = lse - pz;
    }
    return row[target] / temp - lse;
}

/* The gradient by central finite differences of logprob_ref (h = 1e-5) up to V = 300, independent of the
 * kernel's formula; above, the formula dlp (onehot - softmax) / T (finite differences cost V^2 a row). */
static void ref_log_softmax(const OpRun *r, double **ref) {
    int n = r->c->i[0], vocab = r->c->i[1];
    double temp = r->c->f[0], h = 1e-5;
    const int *tg = r->ints[0];
    const float *lg = op_input(r, 0), *dlp = op_input(r, 1), *dhs = op_input(r, 2);
    double *row = malloc((size_t)vocab * sizeof(double));
    for (int i = 0; i < n; i++) {
        if (tg[i] < 0) continue; /* no log-prob, no entropy, no gradient: 0 */
        for (int v = 0; v < vocab; v++) row[v] = lg[(size_t)i * vocab + v];
        ref[0][i] = ref[2][i] = logprob_ref(row, vocab, tg[i], temp, &ref[1][i]);
        double *dl = ref[3] + (size_t)i * vocab;
        if (vocab <= 300) {
            for (int v = 0; v < vocab; v++) {
                double keep = row[v];
                row[v] = keep + h;
                double lp = logprob_ref(row, vocab, tg[i], temp, NULL);
                row[v] = keep - h;
                double lm = logprob_ref(row, vocab, tg[i], temp, NULL);
                row[v] = keep;
                dl[v] = dlp[i] * (lp - lm) / (2 * h);
            }
        } else {
            double lse = ref[0][i] - row[tg[i]] / temp; /* -lse */
            for (int v = 0; v < vocab; v++) dl[v] = dlp[i] * ((v == tg[i]) - exp(row[v] / temp + lse)) / temp;
        }
        /* the entropy's gradient: dh (p (H - (z/T - ... ))) by central differences up to V = 300, else
         * d H / d z_v = -p_v (z_v / T - sum_u p_u z_u / T + ... ) written out: -p_v (log p_v + H) / T */
        double *dle = ref[4] + (size_t)i * vocab, dh = dhs[i];
        if (vocab <= 300) {
            for (int v = 0; v < vocab; v++) {
                double keep = row[v];
                row[v] = keep + h;
                double ep = entropy_ref(row, vocab, temp);
                row[v] = keep - h;
                double em = entropy_ref(row, vocab, temp);
                row[v] = keep;
                dle[v] = dl[v] + dh * (ep - em) / (2 * h);
            }
        } else {
            double lse = row[tg[i]] / temp - ref[0][i], H = ref[1][i];
            for (int v = 0; v < vocab; v++) {
                double logp = row[v] / temp - lse;
                dle[v] = dl[v] - dh * exp(logp) * (logp + H) / temp;
            }
        }
        memcpy(ref[5] + (size_t)i * vocab, dl, (size_t)vocab * sizeof(double));
    }
    free(row);
}

/* Vocabulary-parallel log-softmax — i: N, V, parts; f: temperature, logits scale; list: the targets (NULL:
 * drawn as log_softmax's). The logits [N, V] cut into `parts` column parts (uneven when V is not a multiple)
 * with copy_2d (exact); per part logits_shard_stats {max z, sum e^(z-max), sum e^(z-max) z, z[target]}
 * (z = logit / T; 0 for a part without the target), field by field over the parts; the parts' stats
 * combined on the host as the ranks do (lse, log-prob of rows with a target, entropy); then
 * log_softmax_shard_backward of each part with one lse (the stored logits' own, in double: the same input
 * on every backend), out of place and in place, put back into [N, V] with copy_2d. */

static void shard_bounds(int vocab, int parts, int p, int *lo, int *hi) {
    *lo = (int)((long)vocab * p / parts), *hi = (int)((long)vocab * (p + 1) / parts);
}

static void run_log_softmax_shards(OpRun *r) {
    const OpCase *c = r->c;
    int n = c->i[0], vocab = c->i[1], parts = c->i[2];
    float temp = c->f[0];
    size_t nl = (size_t)n * vocab, es = dtype_size(r->be->storage);
    const Backend *be = r->be;
    int *tg = op_ints(r, (size_t)n);
    for (int i = 0; i < n; i++) tg[i] = c->list ? c->list[i] : i % 5 == 3 ? -1 : op_rand_int(r, 0, vocab - 1);
    void *lg = op_in(r, nl, c->f[1], NULL), *dlp = op_in_f32(r, (size_t)n, 1.0f, NULL);
    const float *x = op_input(r, 0);
    /* bounds of one fp32 rounding of each stat against double: |z| <= zmax, sums <= the widest part */
    double zmax = 0, inv_t = 1.0 / (double)temp;
    for (size_t e = 0; e < nl; e++) zmax = fmax(zmax, fabs(x[e] * inv_t));
    double ulp = ldexp(1.0, -23), widest = ceil((double)vocab / parts);
    float *cut = track_host(r, malloc(nl * sizeof(float)));
    float *fields = track_host(r, malloc((size_t)4 * parts * n * sizeof(float)));
    double *acc = track_host(r, malloc((size_t)4 * n * sizeof(double))); /* {M, S, T, z[target]} */
    for (int i = 0; i < n; i++) acc[4 * i] = -INFINITY, acc[4 * i + 1] = acc[4 * i + 2] = acc[4 * i + 3] = 0;
    void **part = track_host(r, malloc((size_t)parts * sizeof(void *)));
    int **tq = track_host(r, malloc((size_t)parts * sizeof(int *)));
    for (int p = 0; p < parts; p++) {
        int lo, hi;
        shard_bounds(vocab, parts, p, &lo, &hi);
        int vp = hi - lo;
        part[p] = op_alloc(r, (size_t)n * vp);
        be->copy_2d(be, part[p], (size_t)vp, (char *)lg + (size_t)lo * es, (size_t)vocab, n, vp);
        float *a = op_download(r, part[p], (size_t)n * vp);
        for (int i = 0; i < n; i++) memcpy(cut + (size_t)i * vocab + lo, a + (size_t)i * vp, (size_t)vp * sizeof(float));
        tq[p] = op_ints(r, (size_t)n);
        for (int i = 0; i < n; i++) tq[p][i] = tg[i] >= lo && tg[i] < hi ? tg[i] - lo : -1;
        void *stats = op_alloc_f32(r, (size_t)4 * n);
        be->logits_shard_stats(be, stats, part[p], tq[p], n, vp, temp);
        float *st = op_download_f32(r, stats, (size_t)4 * n);
        for (int i = 0; i < n; i++) {
            double *a4 = acc + 4 * i, m = st[4 * i], M = fmax(a4[0], m); /* from M = -inf: exp(-inf) = 0 */
            a4[1] = a4[1] * exp(a4[0] - M) + st[4 * i + 1] * exp(m - M);
            a4[2] = a4[2] * exp(a4[0] - M) + st[4 * i + 2] * exp(m - M);
            a4[0] = M, a4[3] += st[4 * i + 3];
            for (int k = 0; k < 4; k++) fields[(size_t)k * parts * n + (size_t)p * n + i] = st[4 * i + k];
        }
    }
    op_out_host(r, (OpTol){0, 0, 0, 0}, cut, nl, "copy_2d %d column parts out of [%d,%d] (exact)", parts, n, vocab);
    static const char *stat_names[4] = {"max z", "sum e^(z-max)", "sum e^(z-max) z", "z[target]"};
    double stat_bound[4] = {ulp * zmax, ulp * widest, ulp * widest * zmax, ulp * zmax};
    for (int k = 0; k < 4; k++)
        op_out_host(r, (OpTol){stat_bound[k], 1e-5, 2e-5, 0}, fields + (size_t)k * parts * n, (size_t)parts * n,
                    "logits_shard_stats %s N=%d V=%d/%d T=%g", stat_names[k], n, vocab, parts, temp);
    float *comb = track_host(r, malloc((size_t)3 * n * sizeof(float))); /* lse, log-prob, entropy */
    int with_target = 0;
    for (int i = 0; i < n; i++) {
        const double *a4 = acc + 4 * i;
        double lse = a4[0] + log(a4[1]);
        comb[i] = (float)lse, comb[2 * n + i] = (float)(lse - a4[2] / a4[1]);
        if (tg[i] >= 0) comb[n + with_target++] = (float)(a4[3] - lse);
    }
    static const char *comb_names[3] = {"lse", "logprobs", "entropy"};
    for (int q = 0; q < 3; q++)
        op_out_host(r, (OpTol){1e-5, 1e-5, 2e-5, 0}, comb + (size_t)q * n, q == 1 ? (size_t)with_target : (size_t)n,
                    "shard stats combined: %s N=%d V=%d/%d T=%g", comb_names[q], n, vocab, parts, temp);

    float *lse_host = op_draw(r, (size_t)n, 0.0f); /* a run-owned array, filled here */
    for (int i = 0; i < n; i++) {
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < vocab; v++) mx = fmax(mx, x[(size_t)i * vocab + v] * inv_t);
        for (int v = 0; v < vocab; v++) s += exp(x[(size_t)i * vocab + v] * inv_t - mx);
        lse_host[i] = (float)(mx + log(s));
    }
    void *lse = op_in_f32_values(r, lse_host, (size_t)n);
    void *whole = op_alloc(r, nl), *whole_ip = op_alloc(r, nl);
    for (int p = 0; p < parts; p++) {
        int lo, hi;
        shard_bounds(vocab, parts, p, &lo, &hi);
        int vp = hi - lo;
        void *d = op_alloc(r, (size_t)n * vp);
        be->log_softmax_shard_backward(be, d, part[p], tq[p], dlp, lse, n, vp, temp);
        be->copy_2d(be, (char *)whole + (size_t)lo * es, (size_t)vocab, d, (size_t)vp, n, vp);
        be->log_softmax_shard_backward(be, part[p], part[p], tq[p], dlp, lse, n, vp, temp); /* in place */
        be->copy_2d(be, (char *)whole_ip + (size_t)lo * es, (size_t)vocab, part[p], (size_t)vp, n, vp);
    }
    OpTol grad_tol = {1e-6, 1e-5, 1e-4, 1.5};
    op_out(r, grad_tol, whole, nl, "log_softmax_shard_backward N=%d V=%d/%d T=%g", n, vocab, parts, temp);
    op_out(r, grad_tol, whole_ip, nl, "log_softmax_shard_backward in place N=%d V=%d/%d", n, vocab, parts);
}

static void ref_log_softmax_shards(const OpRun *r, double **ref) {
    const OpCase *c = r->c;
    int n = c->i[0], vocab = c->i[1], parts = c->i[2];
    double inv_t = 1.0 / (double)c->f[0];
    const int *tg = r->ints[0];
    const float *x = op_input(r, 0), *dlp = op_input(r, 1), *lse_in = op_input(r, 2);
    size_t nl = (size_t)n * vocab;
    for (size_t e = 0; e < nl; e++) ref[0][e] = x[e];
    int with_target = 0;
    for (int i = 0; i < n; i++) {
        const float *row = x + (size_t)i * vocab;
        double mx = -INFINITY, s = 0, t = 0;
        for (int p = 0; p < parts; p++) {
            int lo, hi;
            shard_bounds(vocab, parts, p, &lo, &hi);
            double m = -INFINITY, sp = 0, tp = 0;
            for (int v = lo; v < hi; v++) m = fmax(m, row[v] * inv_t);
            for (int v = lo; v < hi; v++) {
                double z = row[v] * inv_t, e = exp(z - m);
                sp += e, tp += e * z;
            }
            size_t at = (size_t)p * n + i;
            ref[1][at] = m, ref[2][at] = sp, ref[3][at] = tp;
            ref[4][at] = tg[i] >= lo && tg[i] < hi ? row[tg[i]] * inv_t : 0.0;
        }
        for (int v = 0; v < vocab; v++) mx = fmax(mx, row[v] * inv_t);
        for (int v = 0; v < vocab; v++) {
            double z = row[v] * inv_t, e = exp(z - mx);
            s += e, t += e * z;
        }
        double lse = mx + log(s);
        ref[5][i] = lse, ref[7][i] = lse - t / s;
        if (tg[i] >= 0) ref[6][with_target++] = row[tg[i]] * inv_t - lse;
        double g = (double)dlp[i] * inv_t; /* the op's formula, with the lse it was given */
        for (int v = 0; v < vocab; v++)
            ref[8][(size_t)i * vocab + v] = ref[9][(size_t)i * vocab + v] =
                -g * exp(row[v] * inv_t - (double)lse_in[i]) + (v == tg[i] ? g : 0.0);
    }
}

/* ================================================================ optimizer
 * i: n, first step, steps; f: weight decay, m and sqrt(v) scale, gradient scale. AdamW (lr 1e-3, betas 0.9
 * and 0.999, eps 1e-8) over `steps` steps from `first` (bias corrections of each step), a fresh [f32]
 * gradient a step. At bf16 storage the update goes to an fp32 master (the starting weights) and the param
 * gets bf16(master); at fp32 storage to the param itself: "fp32 weights" is the master or that param. */

static void run_adamw(OpRun *r) {
    const OpCase *c = r->c;
    size_t n = (size_t)c->i[0];
    int first = c->i[1], steps = c->i[2];
    const Backend *be = r->be;
    float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = c->f[0];
    const float *p;
    void *p32 = op_in_f32(r, n, 1.0f, &p), *param = op_alloc(r, n);
    be->upload(be, param, p, n); /* bf16: rounded once, the master keeps p */
    bool master = be->storage != DTYPE_F32;
    float *v0 = op_draw(r, n, c->f[1]);
    for (size_t i = 0; i < n; i++) v0[i] = v0[i] * v0[i];
    void *m = op_in_f32(r, n, c->f[1], NULL), *v = op_in_f32_values(r, v0, n);
    for (int step = first; step < first + steps; step++) {
        void *g = op_in_f32(r, n, c->f[2], NULL);
        float bc1 = (float)(1.0 - pow(b1, step)), bc2 = (float)(1.0 - pow(b2, step));
        be->adamw(be, param, master ? p32 : NULL, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2);
    }
    OpTol tol = {1e-6 * steps, 1e-6, 1e-6, 0}; /* against double: one fp32 rounding of each step's update */
    if (master)
        op_out_f32(r, tol, p32, n, "adamw fp32 weights (master) (%d steps) [%zu]", steps, n);
    else
        op_out(r, tol, param, n, "adamw fp32 weights (param) (%d steps) [%zu]", steps, n);
    op_out(r, (OpTol){1e-6 * steps, 1e-6, 1e-6, 1.0}, param, n, "adamw param (%d steps) [%zu]", steps, n);
    op_out_f32(r, tol, m, n, "adamw m [f32] [%zu]", n);
    op_out_f32(r, tol, v, n, "adamw v [f32] [%zu]", n);
}

/* The formula in backend.h, in double. */
static void ref_adamw(const OpRun *r, double **ref) {
    const OpCase *c = r->c;
    size_t n = (size_t)c->i[0];
    int first = c->i[1], steps = c->i[2];
    double lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = c->f[0];
    const float *p = op_input(r, 0), *m0 = op_input(r, 1), *v0 = op_input(r, 2);
    for (size_t i = 0; i < n; i++) {
        double pp = p[i], m = m0[i], v = v0[i];
        for (int s = 0; s < steps; s++) {
            int step = first + s;
            double g = op_input(r, 3 + s)[i];
            float bc1 = (float)(1.0 - pow((float)b1, step)), bc2 = (float)(1.0 - pow((float)b2, step));
            pp *= 1.0 - lr * wd;
            m = b1 * m + (1.0 - b1) * g;
            v = b2 * v + (1.0 - b2) * g * g;
            pp -= (lr / bc1) * m / (sqrt(v) / sqrt((double)bc2) + eps);
        }
        ref[0][i] = ref[1][i] = pp, ref[2][i] = m, ref[3][i] = v;
    }
}

/* ================================================================ dropout
 * i: n, seed, stream; f: p, x scale. In place: kept exactly where rng_uniform(seed, stream, i) >= p, as
 * x / (1 - p) in storage (a bf16 device rounds it once), 0 elsewhere; and the kept fraction (about 1 - p:
 * within 5 sigma against double). */

static void run_dropout(OpRun *r) {
    const OpCase *c = r->c;
    size_t n = (size_t)c->i[0];
    float p = c->f[0];
    void *x = op_in(r, n, c->f[1], NULL);
    r->be->dropout(r->be, x, x, n, p, (uint64_t)c->i[1], (uint64_t)c->i[2]);
    float *got = op_download(r, x, n);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) kept += got[i] != 0.0f || op_input(r, 0)[i] == 0.0f;
    float frac = (float)kept / (float)n;
    double sigma = sqrt(p * (1.0 - p) / (double)n);
    op_out(r, (OpTol){0, 0, 0, OP_BF16_ROUNDED}, x, n, "dropout p %g [%zu] in place (exact)", p, n);
    op_out_host(r, (OpTol){5 * sigma, 0, 0, 0}, &frac, 1, "dropout p %g [%zu]: fraction kept (5 sigma %.4f)", p, n,
                5 * sigma);
}

static void ref_dropout(const OpRun *r, double **ref) {
    const OpCase *c = r->c;
    size_t n = (size_t)c->i[0];
    float p = c->f[0], scale = 1.0f / (1.0f - p);
    const float *x = op_input(r, 0);
    for (size_t i = 0; i < n; i++) /* fp32 x * (1 / (1 - p)), as the CPU computes it: exact */
        ref[0][i] = rng_uniform((uint64_t)c->i[1], (uint64_t)c->i[2], i) >= p ? (double)(x[i] * scale) : 0.0;
    ref[1][0] = 1.0 - p;
}

/* ================================================================ apply_token_bitmask
 * i: n rows, vocab V. Structured outputs' mask: logits[i, v] = -inf where bit v % 32 of word v / 32 of row
 * i's mask is clear, else unchanged (exact). Compared with -inf written as -1000 (the inputs are N(0, 1)),
 * and the count of -inf against the mask's clear bits. */

static uint32_t bitmask_word(int row, int w) { /* about half the bits set, the same on every backend */
    uint32_t words[4];
    rng_philox(words, 77, (uint64_t)row, (uint64_t)w);
    return words[0] & words[1] ? words[0] | words[2] : words[0];
}

static void run_apply_token_bitmask(OpRun *r) {
    const OpCase *c = r->c;
    const int n = c->i[0], V = c->i[1], W = (V + 31) / 32;
    void *logits = op_in(r, (size_t)n * V, 1.0f, NULL);
    int *mask = op_ints(r, (size_t)n * W);
    for (int i = 0; i < n; i++)
        for (int w = 0; w < W; w++) mask[(size_t)i * W + w] = (int)bitmask_word(i, w);
    void *dmask = track_buf(r, op_upload_i32(r->be, mask, (size_t)n * W));
    r->be->apply_token_bitmask(r->be, logits, dmask, n, V);
    float *got = op_download(r, logits, (size_t)n * V);
    float n_inf = 0;
    for (size_t k = 0; k < (size_t)n * V; k++)
        if (isinf(got[k]) && got[k] < 0) got[k] = -1000.0f, n_inf++;
    op_out_host(r, (OpTol){0, 0, 0, OP_BF16_ROUNDED}, got, (size_t)n * V, "apply_token_bitmask [%d, %d] (exact)", n, V);
    op_out_host(r, (OpTol){0, 0, 0, 0}, &n_inf, 1, "apply_token_bitmask [%d, %d]: logits masked", n, V);
}

static void ref_apply_token_bitmask(const OpRun *r, double **ref) {
    const OpCase *c = r->c;
    const int n = c->i[0], V = c->i[1];
    const float *x = op_input(r, 0);
    ref[1][0] = 0;
    for (int i = 0; i < n; i++)
        for (int v = 0; v < V; v++) {
            bool keep = bitmask_word(i, v / 32) >> (v % 32) & 1u;
            ref[0][(size_t)i * V + v] = keep ? (double)x[(size_t)i * V + v] : -1000.0;
            ref[1][0] += !keep;
        }
}

/* ================================================================ apply_penalties
 * i: n rows, vocab V, history length L (sequence s holds L - s tokens, the first P its prompt's), B logit
 * biases per sequence; f: repetition, frequency, presence penalties. Row i is sequence n - 1 - i and the
 * last row is padding (seq -1, left alone). History tokens come from the first 40 ids, so they repeat.
 * vLLM's order (sampler_apply_penalties): bias, then per distinct history token the repetition penalty,
 * then - frequency * count - presence over the completion part. The reference in double; fp32 backends
 * exact against the CPU, bf16 ones the CPU's fp32 value rounded once. */

static void run_apply_penalties(OpRun *r) {
    const OpCase *c = r->c;
    const int n = c->i[0], V = c->i[1], L = c->i[2], P = c->i[3], B = c->i[4];
    SamplingParams p = sampling_params_greedy();
    p.repetition_penalty = c->f[0], p.frequency_penalty = c->f[1], p.presence_penalty = c->f[2];
    void *logits = op_in(r, (size_t)n * V, 2.0f, NULL);
    int *seq = op_ints(r, (size_t)n), *hist = op_ints(r, (size_t)n * L), *hist_len = op_ints(r, (size_t)n);
    int *prompt_len = op_ints(r, (size_t)n), *bias_ids = op_ints(r, (size_t)n * (B > 0 ? B : 1));
    int *bias_len = op_ints(r, (size_t)n);
    for (int i = 0; i < n; i++) seq[i] = i == n - 1 ? -1 : n - 1 - i;
    for (int s = 0; s < n; s++) {
        hist_len[s] = L - s > 0 ? L - s : 0;
        prompt_len[s] = P;
        bias_len[s] = B - s % 2;
        for (int k = 0; k < L; k++) hist[(size_t)s * L + k] = op_rand_int(r, 0, 39 < V - 1 ? 39 : V - 1);
        for (int j = 0; j < B; j++) bias_ids[(size_t)s * B + j] = (j * 7 + s) % V; /* distinct: 7 B < V */
    }
    float *bias_draw = op_draw(r, (size_t)n * (B > 0 ? B : 1), 5.0f);
    void *d_bias_values = op_in_f32_values(r, bias_draw, (size_t)n * (B > 0 ? B : 1));
    void *d_seq = track_buf(r, op_upload_i32(r->be, seq, (size_t)n));
    void *d_hist = track_buf(r, op_upload_i32(r->be, hist, (size_t)n * L));
    void *d_hist_len = track_buf(r, op_upload_i32(r->be, hist_len, (size_t)n));
    void *d_prompt_len = track_buf(r, op_upload_i32(r->be, prompt_len, (size_t)n));
    void *d_bias_ids = track_buf(r, op_upload_i32(r->be, bias_ids, (size_t)n * (B > 0 ? B : 1)));
    void *d_bias_len = track_buf(r, op_upload_i32(r->be, bias_len, (size_t)n));
    r->be->apply_penalties(r->be, logits, n, V, &p, d_seq, d_hist, d_hist_len, d_prompt_len, L,
                           B > 0 ? d_bias_ids : NULL, d_bias_values, d_bias_len, B);
    op_out(r, (OpTol){1e-5, 0, 0, OP_BF16_ROUNDED}, logits, (size_t)n * V, "apply_penalties [%d, %d], history %d "
           "(prompt %d), bias %d, penalties %g/%g/%g", n, V, L, P, B, c->f[0], c->f[1], c->f[2]);
}

static void ref_apply_penalties(const OpRun *r, double **ref) {
    const OpCase *c = r->c;
    const int n = c->i[0], V = c->i[1], L = c->i[2], P = c->i[3], B = c->i[4];
    const float *x = op_input(r, 0), *bias_values = op_input(r, 1);
    const int *seq = r->ints[0], *hist = r->ints[1], *hist_len = r->ints[2], *bias_ids = r->ints[4];
    const int *bias_len = r->ints[5];
    for (int i = 0; i < n; i++) {
        double *y = ref[0] + (size_t)i * V;
        for (int v = 0; v < V; v++) y[v] = x[(size_t)i * V + v];
        int s = seq[i];
        if (s < 0) continue;
        for (int j = 0; j < (B > 0 ? bias_len[s] : 0); j++) y[bias_ids[(size_t)s * B + j]] += bias_values[(size_t)s * B + j];
        const int *h = hist + (size_t)s * L;
        for (int k = 0; k < hist_len[s]; k++) {
            bool first = true; /* each distinct token once */
            for (int q = 0; q < k; q++) first &= h[q] != h[k];
            if (!first) continue;
            int count = 0;
            for (int q = P; q < hist_len[s]; q++) count += h[q] == h[k];
            double l = y[h[k]];
            if (c->f[0] != 1.0f) l = l > 0 ? l / c->f[0] : l * c->f[0];
            if (count > 0) l -= (double)c->f[1] * count + (double)c->f[2];
            y[h[k]] = l;
        }
    }
}

/* ================================================================ the table */

static const int ROPE_POS_A[6] = {0, 1, 7, 63, 100, 255}, ROPE_POS_B[4] = {0, 3, 50, 127};
static const int EMBED_IDS_A[7] = {0, 49, 3, 3, 17, 1, 48}, EMBED_IDS_B[6] = {3, 19, 3, 0, 7, 3};
static const int GATHER_ROWS[6] = {19, 0, 7, 3, 12, 8};
static const int LOGSOFTMAX_TARGETS[5] = {0, 299, -1, 17, 17}; /* first and last column, none, a repeat */
static const int SHARD_TARGETS[5] = {0, 36, -1, 12, 23}; /* first and last column, none, both sides of a boundary */

#define LINEAR(n, in, out, bias, ws, bs) {"linear", run_linear, ref_linear, {n, in, out, bias}, {ws, bs}, NULL, 0}
#define LINEAR_BACKWARD(n, in, out, dx, acc, db, ws) \
    {"linear_backward", run_linear_backward, ref_linear_backward, {n, in, out, dx, acc, db}, {ws}, NULL, 0}
#define RMSNORM(n, d, in_place, eps) {"rmsnorm", run_rmsnorm, ref_rmsnorm, {n, d, in_place}, {eps, 3.0f}, NULL, 0}
#define RMSNORM_BACKWARD(n, d, with_dw, xs, dxs) \
    {"rmsnorm_backward", run_rmsnorm_backward, ref_rmsnorm_backward, {n, d, with_dw}, {1e-5f, xs, dxs}, NULL, 0}
#define ROPE(n, h, dh, max_pos, backward, theta, list) \
    {"rope", run_rope, ref_rope, {n, h, dh, max_pos, backward}, {theta}, list, 0}
#define ELEMENTWISE(n, gs) {"elementwise", run_elementwise, ref_elementwise, {n}, {gs}, NULL, 0}
#define ELEMENTWISE_OFFSET(n, off) \
    {"elementwise", run_elementwise_offset, ref_elementwise_offset, {n, off}, {0}, NULL, 0}
#define EMBEDDING(v, d, n, dts, list) {"embedding", run_embedding, ref_embedding, {v, d, n}, {dts}, list, 0}
#define LOG_SOFTMAX(n, v, temp, scale, list) \
    {"log_softmax", run_log_softmax, ref_log_softmax, {n, v}, {temp, scale}, list, 0}
#define ADAMW(n, first, steps, wd, mv_scale, g_scale) \
    {"adamw", run_adamw, ref_adamw, {n, first, steps}, {wd, mv_scale, g_scale}, NULL, 0}

const OpCase OP_CASES[] = {
    /* linear: small random weights (0.1) and 1/sqrt(in) ones; stories260K's F = 172; odd leading dims */
    LINEAR(37, 96, 80, 0, 0.1f, 1.0f),
    LINEAR(37, 96, 80, 1, 0.1f, 1.0f),
    LINEAR(37, 96, 80, 1, 0, 0.5f),
    LINEAR(37, 96, 80, 0, 0, 0.5f),
    LINEAR(129, 136, 1000, 1, 0, 0.5f),
    LINEAR(64, 172, 64, 0, 0, 0.5f),
    LINEAR(300, 896, 200, 1, 0, 0.5f),
    LINEAR(5, 64, 1003, 0, 0, 0.5f),
    LINEAR(33, 97, 45, 1, 0, 0.5f),
    LINEAR_BACKWARD(13, 40, 24, 1, 0, 1, 0.3f),
    LINEAR_BACKWARD(13, 40, 24, 1, 1, 1, 0.3f),
    LINEAR_BACKWARD(37, 96, 80, 1, 0, 1, 0),
    LINEAR_BACKWARD(129, 136, 1000, 1, 1, 1, 0),
    LINEAR_BACKWARD(64, 172, 64, 1, 0, 0, 0),
    LINEAR_BACKWARD(20, 64, 33, 0, 0, 1, 0),
    LINEAR_BACKWARD(300, 896, 200, 1, 1, 0, 0),
    /* rmsnorm: D % 8 != 0 (75: the block-per-row path); Qwen3's q norm: rows of Dh, in place */
    RMSNORM(9, 72, 0, 1e-5f),
    RMSNORM(9, 72, 0, 1e-6f),
    RMSNORM(33, 896, 0, 1e-6f),
    RMSNORM(5, 200, 0, 1e-6f),
    RMSNORM(3, 8960, 0, 1e-6f),
    RMSNORM(7, 75, 0, 1e-6f),
    RMSNORM(7 * 16, 128, 1, 1e-6f),
    RMSNORM(5 * 4, 24, 1, 1e-6f),
    RMSNORM_BACKWARD(5, 24, 1, 2.0f, 1.0f),
    RMSNORM_BACKWARD(9, 72, 1, 3.0f, 0.1f),
    RMSNORM_BACKWARD(33, 896, 1, 3.0f, 0.1f),
    RMSNORM_BACKWARD(17, 200, 1, 3.0f, 0.1f),
    RMSNORM_BACKWARD(5, 75, 1, 3.0f, 0.1f),   /* D % 8 != 0: the block-per-row dx path */
    RMSNORM_BACKWARD(33, 896, 0, 3.0f, 0.1f), /* frozen norm (LoRA) */
    RMSNORM_BACKWARD(9 * 16, 128, 1, 3.0f, 0.1f), /* Qwen3's q/k norm: many rows of Dh */
    /* rope and its backward (R^T) */
    ROPE(6, 3, 32, 255, 0, 10000.0f, ROPE_POS_A),
    ROPE(4, 2, 16, 127, 1, 10000.0f, ROPE_POS_B),
    ROPE(50, 4, 64, 300, 0, 10000.0f, NULL),
    ROPE(20, 2, 128, 300, 0, 1000000.0f, NULL),
    ROPE(10, 3, 8, 100, 0, 10000.0f, NULL),
    ROPE(50, 4, 64, 300, 1, 10000.0f, NULL),
    ROPE(20, 2, 128, 300, 1, 1000000.0f, NULL),
    ROPE(10, 3, 8, 100, 1, 10000.0f, NULL),
    /* elementwise: a vector tail (n odd), many blocks, pointers off 16-byte alignment */
    ELEMENTWISE(1000, 4.0f),
    ELEMENTWISE(1031, 3.0f),
    ELEMENTWISE(3 * 4864 + 5, 3.0f),
    ELEMENTWISE(1 << 20, 3.0f),
    ELEMENTWISE_OFFSET(1037, 1),
    ELEMENTWISE_OFFSET(4099, 8),
    {"copy", run_copy, ref_copy, {1000, 100, 300, 200}, {0}, NULL, 0},
    {"copy", run_copy, ref_copy, {1000, 5, 11, 37}, {0}, NULL, 0},
    {"gather_scatter", run_gather_scatter, ref_gather_scatter, {20, 24, 6}, {0}, GATHER_ROWS, 0},
    /* copy_2d: a block inside both; vocabulary parts cut out (of 4 and 5 columns: no vector body; odd, so
     * rows not 16-byte aligned; one row) and put back */
    {"copy_2d", run_copy_2d, ref_copy_2d, {4, 5, 9, 7, 3, 1}, {0}, NULL, 0},
    {"copy_2d", run_copy_2d, ref_copy_2d, {5, 4, 13, 4, 9, 0}, {0}, NULL, 0},
    {"copy_2d", run_copy_2d, ref_copy_2d, {37, 335, 1003, 335, 334, 0}, {0}, NULL, 0},
    {"copy_2d", run_copy_2d, ref_copy_2d, {37, 334, 334, 1003, 0, 669}, {0}, NULL, 0},
    {"copy_2d", run_copy_2d, ref_copy_2d, {1, 258, 517, 258, 259, 0}, {0}, NULL, 0},
    /* embedding: fixed ids (first and last row, repeats), drawn ones */
    EMBEDDING(50, 24, 7, 1.0f, EMBED_IDS_A),
    EMBEDDING(20, 12, 6, 1.0f, EMBED_IDS_B),
    EMBEDDING(1000, 72, 50, 0.1f, NULL),
    EMBEDDING(1003, 200, 9, 0.1f, NULL),
    /* a vocabulary part: rows of 75 (element copies in embedding_i32); Qwen's last quarter (16-byte chunks) */
    {"embedding_part", run_embedding_part, ref_embedding_part, {1000, 72, 50, 250, 500}, {0}, NULL, 0},
    {"embedding_part", run_embedding_part, ref_embedding_part, {1003, 75, 9, 0, 334}, {0}, NULL, 0},
    {"embedding_part", run_embedding_part, ref_embedding_part, {151936, 128, 64, 3 * 37984, 151936}, {0}, NULL, 1},
    /* kv cache */
    {"kv", run_kv, ref_kv, {3, 40, 128, 30}, {0}, NULL, 0},
    {"kv", run_kv, ref_kv, {2, 17, 144, 20}, {0}, NULL, 0},
    /* log-softmax of the logits: Qwen's vocabulary (151936), more rows than SMs (blocks walk rows) */
    LOG_SOFTMAX(5, 300, 0.7f, 3.0f, LOGSOFTMAX_TARGETS),
    LOG_SOFTMAX(37, 1000, 0.7f, 3.0f, NULL),
    LOG_SOFTMAX(9, 1003, 1.0f, 1.0f, NULL),
    LOG_SOFTMAX(4, 151936, 1.0f, 4.0f, NULL),
    {"log_softmax", run_log_softmax, ref_log_softmax, {300, 151936}, {1.0f, 4.0f}, NULL, .device_only = 1},
    /* vocabulary-parallel log-softmax: Qwen's vocabulary over 4 ranks (37984 columns), odd parts (rows not
     * 16-byte aligned), parts narrower than a block, parts of 4 and 5 (no vector body), one row */
    {"log_softmax_shards", run_log_softmax_shards, ref_log_softmax_shards, {5, 37, 3}, {0.7f, 3.0f}, SHARD_TARGETS, 0},
    {"log_softmax_shards", run_log_softmax_shards, ref_log_softmax_shards, {4, 151936, 4}, {1.0f, 4.0f}, NULL, 0},
    {"log_softmax_shards", run_log_softmax_shards, ref_log_softmax_shards, {33, 151936, 4}, {0.7f, 4.0f}, NULL, 1},
    {"log_softmax_shards", run_log_softmax_shards, ref_log_softmax_shards, {37, 1003, 3}, {0.7f, 3.0f}, NULL, 0},
    {"log_softmax_shards", run_log_softmax_shards, ref_log_softmax_shards, {9, 75, 2}, {1.0f, 1.0f}, NULL, 0},
    {"log_softmax_shards", run_log_softmax_shards, ref_log_softmax_shards, {5, 13, 3}, {1.0f, 2.0f}, NULL, 0},
    {"log_softmax_shards", run_log_softmax_shards, ref_log_softmax_shards, {1, 517, 2}, {1.0f, 2.0f}, NULL, 0},
    /* dropout (LoRA's lora_dropout): an odd length */
    {"dropout", run_dropout, ref_dropout, {100000, 42, 7}, {0.25f, 2.0f}, NULL, 0},
    {"dropout", run_dropout, ref_dropout, {1000003, 99, 12345}, {0.3f, 2.0f}, NULL, 0},
    {"dropout", run_dropout, ref_dropout, {37, 99, 12345}, {0.3f, 2.0f}, NULL, 0},
    /* apply_token_bitmask (structured outputs): a vocabulary not a multiple of 32, one word, Qwen2.5's */
    {"apply_token_bitmask", run_apply_token_bitmask, ref_apply_token_bitmask, {3, 1000}, {0}, NULL, 0},
    {"apply_token_bitmask", run_apply_token_bitmask, ref_apply_token_bitmask, {2, 33}, {0}, NULL, 0},
    {"apply_token_bitmask", run_apply_token_bitmask, ref_apply_token_bitmask, {5, 151936}, {0}, NULL, 0},
    /* apply_penalties (vLLM's penalties and logit bias): every setting, the bias alone, the penalties
     * alone; Qwen2.5's vocabulary with a long history */
    {"apply_penalties", run_apply_penalties, ref_apply_penalties, {4, 1000, 30, 10, 6}, {1.3f, 0.5f, 0.7f}, NULL, 0},
    {"apply_penalties", run_apply_penalties, ref_apply_penalties, {3, 333, 1, 1, 3}, {1.0f, 0.0f, 0.0f}, NULL, 0},
    {"apply_penalties", run_apply_penalties, ref_apply_penalties, {3, 64, 20, 0, 0}, {0.8f, -1.5f, 2.0f}, NULL, 0},
    {"apply_penalties", run_apply_penalties, ref_apply_penalties, {5, 151936, 600, 200, 40}, {1.1f, 1.0f, 0.5f}, NULL, 0},
    /* AdamW: one update at step 3's bias corrections; three steps from the first */
    ADAMW(777, 3, 1, 0.1f, 0.1f, 1.0f),
    ADAMW(1003 * 7, 1, 3, 0.01f, 0.01f, 0.1f),
    ADAMW((1 << 16) + 3, 1, 3, 0.01f, 0.01f, 0.1f),
};
const int OP_CASE_COUNT = (int)(sizeof OP_CASES / sizeof OP_CASES[0]);

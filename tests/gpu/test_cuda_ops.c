/* test_cuda_ops.c — every op of the CUDA tables against the CPU reference,
 * then whole models: forward log-probs and one training step's gradients.
 *
 * Two tables: cuda_f32 (fp32 storage, same kernels) must match the CPU to
 * ~1e-5 of the output's max |value|; cuda (bf16 storage) must match within
 * atol + |ref| * k * 2^-8, stated per op. bf16 inputs are rounded once: the
 * test uploads fp32 data, downloads the device copy back and gives those
 * values to the CPU op, so only the op's own error is measured.
 * Prints one line per op and table (max abs error, max rel error, tolerance);
 * exits 1 on any failure, 77 (skip) without a CUDA device.
 *
 * Dimension legend: N tokens, D width, H query heads, KVH key/value heads,
 * Dh head dim, S cache slots, L max cache length, F MLP width, V vocab. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_instance.h"
#include "core/error.h"
#include "core/floats.h"
#include "core/rng.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/model_train.h"
#include "train/optim.h"
#include "../rope_table.h"
#include "../harness.h"

#define CHECKED(cond, ...)                                \
    do {                                                  \
        g_checks++;                                       \
        if (!(cond)) {                                    \
            g_failures++;                                 \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);   \
            printf(__VA_ARGS__);                          \
            printf("\n");                                 \
        }                                                 \
    } while (0)
static uint64_t g_stream = 0;
static const Backend *CPU;

typedef struct Dev {
    const Backend *be;
    int bf16;
    const char *tag;
} Dev;

/* f32 table: |err| <= f32_rel * max|ref|. bf16 table: |err| <= bf16_abs * max|ref| + |ref| * bf16_k * 2^-8. */
typedef struct Tol {
    double f32_rel, bf16_abs, bf16_k;
} Tol;

/* ---------------------------------------------------------------- helpers */

static float *rand_floats(size_t n, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    uint64_t s = g_stream++;
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(11, s, i);
    return x;
}

static int rand_int(int lo, int hi) { /* inclusive */
    static uint64_t counter = 0;
    float u = rng_uniform(13, 0, counter++);
    int v = lo + (int)(u * (float)(hi - lo + 1));
    return v > hi ? hi : v;
}

/* Storage input: upload, then read the device copy back into x (bf16 rounding). */
static void *dev_in(const Dev *d, float *x, size_t n) {
    void *buf = d->be->alloc(d->be, n);
    d->be->upload(d->be, buf, x, n);
    d->be->download(d->be, x, buf, n);
    return buf;
}

static void *dev_in_f32(const Dev *d, const float *x, size_t n) {
    void *buf = d->be->alloc_f32(d->be, n);
    d->be->upload_f32(d->be, buf, x, n);
    return buf;
}

static void *cpu_in(const float *x, size_t n) {
    void *buf = CPU->alloc(CPU, n);
    CPU->upload(CPU, buf, x, n);
    return buf;
}

static float *dev_out(const Dev *d, const void *buf, size_t n) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    d->be->download(d->be, x, buf, n);
    return x;
}

static float *dev_out_f32(const Dev *d, const void *buf, size_t n) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    d->be->download_f32(d->be, x, buf, n);
    return x;
}

static float *cpu_out(const void *buf, size_t n) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    CPU->download(CPU, x, buf, n);
    return x;
}

static float *dup_floats(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* Compares got (CUDA) with ref (CPU) under t, prints one line, counts failures. */
static void check(const Dev *d, const char *what, const float *got, const float *ref, size_t n, Tol t) {
    double maxref = 0.0;
    for (size_t i = 0; i < n; i++) maxref = fmax(maxref, fabs((double)ref[i]));
    double atol = d->bf16 ? t.bf16_abs * maxref : t.f32_rel * maxref;
    double k = d->bf16 ? t.bf16_k / 256.0 : 0.0;
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
    int ok = n > 0 && n_bad == 0;
    g_checks++;
    if (!ok) g_failures++;
    printf("%s %-9s %-58s max|err| %.3e  max rel %.3e  tol %.1e + |ref|*%.2g  (max|ref| %.3g, n %zu)\n",
           ok ? "ok  " : "FAIL", d->tag, what, worst_abs, worst_rel, atol, k, maxref, n);
    if (!ok && n > 0)
        printf("     %zu elements out of tolerance; worst at [%zu]: cuda %.9g cpu %.9g\n", n_bad, worst_i,
               (double)got[worst_i], (double)ref[worst_i]);
}

/* ---------------------------------------------------------------- memory ops */

static void test_memory(const Dev *d) {
    size_t n = 1000;
    float *x = rand_floats(n, 2.0f);
    void *buf = d->be->alloc(d->be, n);
    d->be->upload(d->be, buf, x, n);
    float *back = dev_out(d, buf, n);
    check(d, "upload/download round trip [1000]", back, x, n, (Tol){0.0, 0.0, 1.0});

    /* copy with element offsets: dst[5..42) = src[11..48) */
    float *y = rand_floats(60, 1.0f);
    void *dst = dev_in(d, y, 60);
    float *src_host = dup_floats(back, n);
    d->be->copy(d->be, dst, 5, buf, 11, 37);
    memcpy(y + 5, src_host + 11, 37 * sizeof(float));
    float *got = dev_out(d, dst, 60);
    check(d, "copy (dst off 5, src off 11, 37 elems)", got, y, 60, (Tol){0, 0, 0});
    free(got);

    d->be->zero(d->be, dst, 60);
    got = dev_out(d, dst, 60);
    float zeros[60] = {0};
    check(d, "zero [60]", got, zeros, 60, (Tol){0, 0, 0});
    free(got);

    void *f = dev_in_f32(d, x, n);
    got = dev_out_f32(d, f, n);
    check(d, "upload_f32/download_f32 round trip [1000] (exact)", got, x, n, (Tol){0, 0, 0});
    free(got);
    d->be->zero_f32(d->be, f, 60);
    got = dev_out_f32(d, f, n);
    float *expect = dup_floats(x, n);
    memset(expect, 0, 60 * sizeof(float));
    check(d, "zero_f32 [first 60 of 1000]", got, expect, n, (Tol){0, 0, 0});
    free(got), free(expect);

    /* raw byte copies through pinned host memory (offload's path): exact */
    size_t bytes = n * dtype_size(d->be->storage);
    unsigned char *pinned = d->be->alloc_host(d->be, bytes), *plain = malloc(bytes);
    CHECKED(pinned != NULL, "alloc_host of %zu bytes", bytes);
    d->be->copy_to_host(d->be, pinned, buf, bytes);
    void *buf2 = d->be->alloc(d->be, n);
    d->be->copy_from_host(d->be, buf2, pinned, bytes);
    got = dev_out(d, buf2, n);
    check(d, "copy_to_host / copy_from_host (pinned) round trip [1000] (exact)", got, back, n, (Tol){0, 0, 0});
    free(got);
    d->be->copy_to_host(d->be, plain, buf, bytes);
    CHECKED(memcmp(plain, pinned, bytes) == 0, "copy_to_host into pageable memory differs from pinned");
    d->be->free_host(d->be, pinned);
    free(plain);

    /* memory accounting: alloc / alloc_f32 counted, freed bytes given back */
    size_t in0 = 0, peak0 = 0, in1 = 0, peak1 = 0, in2 = 0;
    d->be->memory_stats(d->be, &in0, &peak0, true);
    void *a = d->be->alloc(d->be, 4096), *b = d->be->alloc_f32(d->be, 1024);
    d->be->memory_stats(d->be, &in1, &peak1, false);
    d->be->free(d->be, a), d->be->free(d->be, b);
    d->be->memory_stats(d->be, &in2, NULL, false);
    size_t want = 4096 * dtype_size(d->be->storage) + 1024 * 4;
    CHECKED(in1 - in0 == want && peak1 == in1 && in2 == in0, "memory_stats: +%zu (want %zu), peak %zu, after free %zu "
            "(was %zu)", in1 - in0, want, peak1, in2, in0);
    printf("[%s] memory_stats: alloc + alloc_f32 of %zu bytes counted, given back on free\n", d->tag, want);

    free(x), free(back), free(y), free(src_host);
    d->be->free(d->be, buf), d->be->free(d->be, buf2), d->be->free(d->be, dst), d->be->free(d->be, f);
}

/* ---------------------------------------------------------------- linear */

static void test_linear(const Dev *d, int n, int in, int out, int with_bias) {
    char name[128];
    snprintf(name, sizeof name, "linear%s [%d,%d]x[%d,%d]^T", with_bias ? " +bias" : "", n, in, out, in);
    float *x = rand_floats((size_t)n * in, 1.0f), *w = rand_floats((size_t)out * in, 1.0f / sqrtf((float)in)),
          *b = rand_floats(out, 0.5f);
    void *gx = dev_in(d, x, (size_t)n * in), *gw = dev_in(d, w, (size_t)out * in), *gb = dev_in(d, b, out);
    void *go = d->be->alloc(d->be, (size_t)n * out);
    void *cx = cpu_in(x, (size_t)n * in), *cw = cpu_in(w, (size_t)out * in), *cb = cpu_in(b, out);
    void *co = CPU->alloc(CPU, (size_t)n * out);
    d->be->linear(d->be, go, gx, gw, with_bias ? gb : NULL, n, in, out);
    CPU->linear(CPU, co, cx, cw, with_bias ? cb : NULL, n, in, out);
    float *got = dev_out(d, go, (size_t)n * out), *ref = cpu_out(co, (size_t)n * out);
    check(d, name, got, ref, (size_t)n * out, (Tol){2e-5, 2e-3, 1.5});
    free(x), free(w), free(b), free(got), free(ref);
    d->be->free(d->be, gx), d->be->free(d->be, gw), d->be->free(d->be, gb), d->be->free(d->be, go);
    CPU->free(CPU, cx), CPU->free(CPU, cw), CPU->free(CPU, cb), CPU->free(CPU, co);
}

static void test_linear_backward(const Dev *d, int n, int in, int out, int with_dx, int acc_dx, int with_db) {
    char name[160];
    size_t nx = (size_t)n * in, nw = (size_t)out * in, ny = (size_t)n * out;
    float *x = rand_floats(nx, 1.0f), *w = rand_floats(nw, 1.0f / sqrtf((float)in)), *dy = rand_floats(ny, 1.0f);
    float *dx0 = rand_floats(nx, 1.0f), *dw0 = rand_floats(nw, 1.0f), *db0 = rand_floats(out, 1.0f);
    void *gx = dev_in(d, x, nx), *gw = dev_in(d, w, nw), *gdy = dev_in(d, dy, ny), *gdx = dev_in(d, dx0, nx);
    void *gdw = dev_in_f32(d, dw0, nw), *gdb = dev_in_f32(d, db0, out);
    void *cx = cpu_in(x, nx), *cw = cpu_in(w, nw), *cdy = cpu_in(dy, ny), *cdx = cpu_in(dx0, nx);
    void *cdw = cpu_in(dw0, nw), *cdb = cpu_in(db0, out);
    d->be->linear_backward(d->be, with_dx ? gdx : NULL, gdw, with_db ? gdb : NULL, gdy, gx, gw, n, in, out, acc_dx);
    CPU->linear_backward(CPU, with_dx ? cdx : NULL, cdw, with_db ? cdb : NULL, cdy, cx, cw, n, in, out, acc_dx);
    if (with_dx) {
        float *got = dev_out(d, gdx, nx), *ref = cpu_out(cdx, nx);
        snprintf(name, sizeof name, "linear_backward dx%s [%d,%d] w[%d,%d]", acc_dx ? " (+=)" : " (=)", n, out, out, in);
        check(d, name, got, ref, nx, (Tol){2e-5, 2e-3, 1.5});
        free(got), free(ref);
    }
    {
        float *got = dev_out_f32(d, gdw, nw), *ref = cpu_out(cdw, nw);
        snprintf(name, sizeof name, "linear_backward dw [f32] += [%d,%d] (N=%d)", out, in, n);
        check(d, name, got, ref, nw, (Tol){2e-5, 5e-5, 0});
        free(got), free(ref);
    }
    if (with_db) {
        float *got = dev_out_f32(d, gdb, out), *ref = cpu_out(cdb, out);
        snprintf(name, sizeof name, "linear_backward db [f32] += [%d] (N=%d)", out, n);
        check(d, name, got, ref, out, (Tol){2e-5, 5e-5, 0});
        free(got), free(ref);
    }
    free(x), free(w), free(dy), free(dx0), free(dw0), free(db0);
    d->be->free(d->be, gx), d->be->free(d->be, gw), d->be->free(d->be, gdy), d->be->free(d->be, gdx), d->be->free(d->be, gdw), d->be->free(d->be, gdb);
    CPU->free(CPU, cx), CPU->free(CPU, cw), CPU->free(CPU, cdy), CPU->free(CPU, cdx), CPU->free(CPU, cdw), CPU->free(CPU, cdb);
}

/* ---------------------------------------------------------------- rmsnorm */

/* in_place: out = x (Qwen3's per-head q/k norm in the engine). */
static void test_rmsnorm(const Dev *d, int n, int dim, int in_place) {
    char name[128];
    float eps = 1e-6f;
    size_t nx = (size_t)n * dim;
    float *x = rand_floats(nx, 3.0f), *w = rand_floats(dim, 1.0f);
    void *gx = dev_in(d, x, nx), *gw = dev_in(d, w, dim), *go = d->be->alloc(d->be, nx);
    void *cx = cpu_in(x, nx), *cw = cpu_in(w, dim), *co = CPU->alloc(CPU, nx);
    d->be->rmsnorm(d->be, in_place ? gx : go, gx, gw, n, dim, eps);
    CPU->rmsnorm(CPU, in_place ? cx : co, cx, cw, n, dim, eps);
    float *got = dev_out(d, in_place ? gx : go, nx), *ref = cpu_out(in_place ? cx : co, nx);
    snprintf(name, sizeof name, "rmsnorm%s [%d,%d]", in_place ? " in place" : "", n, dim);
    check(d, name, got, ref, nx, (Tol){1e-5, 1e-4, 1.5});
    free(x), free(w), free(got), free(ref);
    d->be->free(d->be, gx), d->be->free(d->be, gw), d->be->free(d->be, go), CPU->free(CPU, cx), CPU->free(CPU, cw), CPU->free(CPU, co);
}

/* with_dw 0: a frozen norm (dw NULL), dx only. */
static void test_rmsnorm_backward(const Dev *d, int n, int dim, int with_dw) {
    char name[128];
    float eps = 1e-5f;
    size_t nx = (size_t)n * dim;
    float *x = rand_floats(nx, 3.0f), *w = rand_floats(dim, 1.0f), *dy = rand_floats(nx, 1.0f);
    float *dx0 = rand_floats(nx, 0.1f), *dw0 = rand_floats(dim, 1.0f);
    void *gx = dev_in(d, x, nx), *gw = dev_in(d, w, dim), *gdy = dev_in(d, dy, nx), *gdx = dev_in(d, dx0, nx);
    void *gdw = dev_in_f32(d, dw0, dim);
    void *cx = cpu_in(x, nx), *cw = cpu_in(w, dim), *cdy = cpu_in(dy, nx), *cdx = cpu_in(dx0, nx), *cdw = cpu_in(dw0, dim);
    d->be->rmsnorm_backward(d->be, gdx, with_dw ? gdw : NULL, gdy, gx, gw, n, dim, eps);
    CPU->rmsnorm_backward(CPU, cdx, with_dw ? cdw : NULL, cdy, cx, cw, n, dim, eps);
    float *got = dev_out(d, gdx, nx), *ref = cpu_out(cdx, nx);
    snprintf(name, sizeof name, "rmsnorm_backward dx (+=)%s [%d,%d]", with_dw ? "" : ", dw NULL", n, dim);
    check(d, name, got, ref, nx, (Tol){1e-5, 1e-3, 1.5});
    free(got), free(ref);
    got = dev_out_f32(d, gdw, dim), ref = cpu_out(cdw, dim);
    snprintf(name, sizeof name, "rmsnorm_backward dw [f32] %s [%d]", with_dw ? "+=" : "untouched (NULL)", dim);
    check(d, name, got, ref, dim, (Tol){1e-5, 5e-5, 0});
    free(got), free(ref);
    free(x), free(w), free(dy), free(dx0), free(dw0);
    d->be->free(d->be, gx), d->be->free(d->be, gw), d->be->free(d->be, gdy), d->be->free(d->be, gdx), d->be->free(d->be, gdw);
    CPU->free(CPU, cx), CPU->free(CPU, cw), CPU->free(CPU, cdy), CPU->free(CPU, cdx), CPU->free(CPU, cdw);
}

/* ---------------------------------------------------------------- rope */

static void test_rope(const Dev *d, int n, int heads, int head_dim, float theta, int max_pos, int backward) {
    char name[128];
    size_t nx = (size_t)n * heads * head_dim;
    float *x = rand_floats(nx, 1.0f);
    int *pos = malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) pos[i] = i == 0 ? max_pos : rand_int(0, max_pos);
    void *gx = dev_in(d, x, nx), *cx = cpu_in(x, nx);
    if (backward) {
        d->be->rope_backward(d->be, gx, pos, n, heads, head_dim, rope_table(head_dim, theta));
        CPU->rope_backward(CPU, cx, pos, n, heads, head_dim, rope_table(head_dim, theta));
    } else {
        d->be->rope(d->be, gx, pos, n, heads, head_dim, rope_table(head_dim, theta));
        CPU->rope(CPU, cx, pos, n, heads, head_dim, rope_table(head_dim, theta));
    }
    float *got = dev_out(d, gx, nx), *ref = cpu_out(cx, nx);
    snprintf(name, sizeof name, "%s [%d,%d,%d] theta %g pos<=%d", backward ? "rope_backward" : "rope", n, heads,
             head_dim, theta, max_pos);
    check(d, name, got, ref, nx, (Tol){1e-5, 1e-4, 1.5});
    free(x), free(pos), free(got), free(ref);
    d->be->free(d->be, gx), CPU->free(CPU, cx);
}

/* ---------------------------------------------------------------- kv cache and attention */

/* A batch of n tokens over S slots of the given lengths: each slot's last
 * position appears, the rest are random positions below the length; no two
 * tokens share (slot, pos) so kv_store is well defined. */
static void make_tokens(int *slot, int *pos, int n, int n_slots, const int *lens) {
    int k = 0;
    for (int s = 0; s < n_slots && k < n; s++) slot[k] = s, pos[k] = lens[s] - 1, k++;
    while (k < n) {
        int s = rand_int(0, n_slots - 1), p = rand_int(0, lens[s] - 1), dup = 0;
        for (int j = 0; j < k; j++) dup |= slot[j] == s && pos[j] == p;
        if (!dup) slot[k] = s, pos[k] = p, k++;
    }
}

static void test_kv(const Dev *d, int n_slots, int max_len, int kv_dim, int n) {
    char name[128];
    int lens[8];
    for (int s = 0; s < n_slots; s++) lens[s] = max_len - 3 * s;
    int *slot = malloc((size_t)n * sizeof(int)), *pos = malloc((size_t)n * sizeof(int));
    make_tokens(slot, pos, n, n_slots, lens);
    size_t nc = (size_t)n_slots * max_len * kv_dim, nt = (size_t)n * kv_dim;
    float *kc = rand_floats(nc, 1.0f), *vc = rand_floats(nc, 1.0f), *k = rand_floats(nt, 1.0f), *v = rand_floats(nt, 1.0f);
    void *gkc = dev_in(d, kc, nc), *gvc = dev_in(d, vc, nc), *gk = dev_in(d, k, nt), *gv = dev_in(d, v, nt);
    void *ckc = cpu_in(kc, nc), *cvc = cpu_in(vc, nc), *ck = cpu_in(k, nt), *cv = cpu_in(v, nt);
    d->be->kv_store(d->be, gkc, gvc, gk, gv, slot, pos, n, kv_dim, max_len);
    CPU->kv_store(CPU, ckc, cvc, ck, cv, slot, pos, n, kv_dim, max_len);
    float *got = dev_out(d, gkc, nc), *ref = cpu_out(ckc, nc);
    snprintf(name, sizeof name, "kv_store k_cache [%d,%d,%d] N=%d (exact)", n_slots, max_len, kv_dim, n);
    check(d, name, got, ref, nc, (Tol){0, 0, 0});
    free(got), free(ref);
    got = dev_out(d, gvc, nc), ref = cpu_out(cvc, nc);
    snprintf(name, sizeof name, "kv_store v_cache [%d,%d,%d] N=%d (exact)", n_slots, max_len, kv_dim, n);
    check(d, name, got, ref, nc, (Tol){0, 0, 0});
    free(got), free(ref);

    /* gather from [f32] caches into storage rows */
    float *fk = rand_floats(nc, 1.0f), *fv = rand_floats(nc, 1.0f);
    void *gfk = dev_in_f32(d, fk, nc), *gfv = dev_in_f32(d, fv, nc), *cfk = cpu_in(fk, nc), *cfv = cpu_in(fv, nc);
    d->be->kv_gather(d->be, gk, gv, gfk, gfv, slot, pos, n, kv_dim, max_len);
    CPU->kv_gather(CPU, ck, cv, cfk, cfv, slot, pos, n, kv_dim, max_len);
    got = dev_out(d, gk, nt), ref = cpu_out(ck, nt);
    snprintf(name, sizeof name, "kv_gather k [%d,%d] from [f32] cache", n, kv_dim);
    check(d, name, got, ref, nt, (Tol){0, 0, 1.0});
    free(got), free(ref);
    got = dev_out(d, gv, nt), ref = cpu_out(cv, nt);
    snprintf(name, sizeof name, "kv_gather v [%d,%d] from [f32] cache", n, kv_dim);
    check(d, name, got, ref, nt, (Tol){0, 0, 1.0});
    free(got), free(ref);

    free(slot), free(pos), free(kc), free(vc), free(k), free(v), free(fk), free(fv);
    d->be->free(d->be, gkc), d->be->free(d->be, gvc), d->be->free(d->be, gk), d->be->free(d->be, gv), d->be->free(d->be, gfk), d->be->free(d->be, gfv);
    CPU->free(CPU, ckc), CPU->free(CPU, cvc), CPU->free(CPU, ck), CPU->free(CPU, cv), CPU->free(CPU, cfk), CPU->free(CPU, cfv);
}

/* bf16 round to nearest even (as __float2bfloat16_rn) */
static double attn_round_bf16(double x) {
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* FlashAttention-2's rounding, on the CPU: the attention backward in double
 * with P and dS rounded to bf16 (once) before the products dV += P^T dO,
 * dK += scale dS^T Q and dQ = scale dS K, as FA2's kernels and colt's bf16
 * tensor-core tiles (unless COLT_FA_PRECISE=1) feed them to the MMAs; with
 * delta_from_out, delta = dO . O with O the forward's output rounded to bf16
 * (FA2's preprocessing pass; colt's when the forward hands over its output
 * and lse), else delta = sum P dP exact (colt's statistics pass); all else
 * exact. dk and dv hold the starting [f32] values and accumulate. Its distance
 * to the CPU op is the error that rounding alone makes: the GPU test allows
 * the bf16 kernels that much (twice) on top of the tight bound. */
static void attn_backward_fa2_reference(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                        const float *kc, const float *vc, const int *slot, const int *pos, int n,
                                        int heads, int kv_heads, int head_dim, int n_slots, int max_len,
                                        int delta_from_out) {
    int group = heads / kv_heads, kv_dim = kv_heads * head_dim;
    double scale = 1.0 / sqrt((double)head_dim);
    double *sc = malloc(sizeof(double) * max_len), *dp = malloc(sizeof(double) * max_len);
    double *acc = malloc(sizeof(double) * head_dim), *o = malloc(sizeof(double) * head_dim);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++) {
            const float *qi = q + ((size_t)i * heads + h) * head_dim, *gi = dout + ((size_t)i * heads + h) * head_dim;
            float *dqi = dq + ((size_t)i * heads + h) * head_dim;
            if (slot[i] < 0 || slot[i] >= n_slots) continue;
            size_t base = (size_t)slot[i] * max_len * kv_dim + (size_t)(h / group) * head_dim;
            int len = pos[i] + 1;
            double mx = -INFINITY, sum = 0.0, delta = 0.0;
            for (int t = 0; t < len; t++) {
                const float *kt = kc + base + (size_t)t * kv_dim, *vt = vc + base + (size_t)t * kv_dim;
                double a = 0.0, b = 0.0;
                for (int e = 0; e < head_dim; e++) a += (double)qi[e] * kt[e], b += (double)gi[e] * vt[e];
                sc[t] = a * scale, dp[t] = b;
                if (sc[t] > mx) mx = sc[t];
            }
            for (int t = 0; t < len; t++) sum += exp(sc[t] - mx);
            if (delta_from_out) {
                for (int e = 0; e < head_dim; e++) o[e] = 0.0;
                for (int t = 0; t < len; t++) {
                    const float *vt = vc + base + (size_t)t * kv_dim;
                    double p = exp(sc[t] - mx) / sum;
                    for (int e = 0; e < head_dim; e++) o[e] += p * vt[e];
                }
                for (int e = 0; e < head_dim; e++) delta += (double)gi[e] * attn_round_bf16(o[e]);
            } else {
                for (int t = 0; t < len; t++) delta += exp(sc[t] - mx) / sum * dp[t];
            }
            for (int e = 0; e < head_dim; e++) acc[e] = 0.0;
            for (int t = 0; t < len; t++) {
                double p = exp(sc[t] - mx) / sum, ds = p * (dp[t] - delta);
                double pr = attn_round_bf16(p), dsr = attn_round_bf16(ds);
                const float *kt = kc + base + (size_t)t * kv_dim;
                float *dkt = dk + base + (size_t)t * kv_dim, *dvt = dv + base + (size_t)t * kv_dim;
                for (int e = 0; e < head_dim; e++) {
                    acc[e] += dsr * kt[e];
                    dkt[e] = (float)(dkt[e] + scale * dsr * qi[e]);
                    dvt[e] = (float)(dvt[e] + pr * gi[e]);
                }
            }
            for (int e = 0; e < head_dim; e++) dqi[e] = (float)(scale * acc[e]);
        }
    free(sc), free(dp), free(acc), free(o);
}

/* check() with `allow` added to the absolute tolerance; also prints the FA2
 * reference's own error (fa2_err) and the ratio of the two. */
static void check_attn_allow(const Dev *d, const char *what, const float *got, const float *ref, size_t n, Tol t,
                             double fa2_err) {
    double maxref = 0.0;
    for (size_t i = 0; i < n; i++) maxref = fmax(maxref, fabs((double)ref[i]));
    double atol = (d->bf16 ? t.bf16_abs : t.f32_rel) * maxref + 2.0 * fa2_err;
    double k = d->bf16 ? t.bf16_k / 256.0 : 0.0, worst_abs = 0.0, worst_ratio = -1.0;
    size_t worst_i = 0, n_bad = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - ref[i]);
        if (isnan(got[i]) || isinf(got[i])) err = INFINITY;
        double tol = atol + fabs((double)ref[i]) * k, ratio = err / tol;
        if (err > worst_abs) worst_abs = err;
        if (ratio > worst_ratio) worst_ratio = ratio, worst_i = i;
        if (!(err <= tol)) n_bad++;
    }
    int ok = n > 0 && n_bad == 0;
    g_checks++;
    if (!ok) g_failures++;
    printf("%s %-9s %-58s max|err| %.3e  FA2-rounding err %.3e (ratio %.2f)  tol %.1e + |ref|*%.2g  (max|ref| %.3g, "
           "n %zu)\n",
           ok ? "ok  " : "FAIL", d->tag, what, worst_abs, fa2_err, fa2_err > 0 ? worst_abs / fa2_err : 0.0, atol, k,
           maxref, n);
    if (!ok && n > 0)
        printf("     %zu elements out of tolerance; worst at [%zu]: cuda %.9g cpu %.9g\n", n_bad, worst_i,
               (double)got[worst_i], (double)ref[worst_i]);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* When set, test_attention lays its tokens out as a training / prefill batch:
 * slot s holds positions g_attn_run_starts[s]..lens[s]-1 in order (the tiled
 * kernels' path); n must be the sum of the run lengths. */
static const int *g_attn_run_starts = NULL;

static void test_attention(const Dev *d, int n_slots, const int *lens, int max_len, int n, int heads, int kv_heads,
                           int head_dim, float q_scale) {
    char name[224], shape[96];
    int *slot = malloc((size_t)n * sizeof(int)), *pos = malloc((size_t)n * sizeof(int));
    if (g_attn_run_starts) {
        int k = 0;
        for (int s = 0; s < n_slots; s++)
            for (int p = g_attn_run_starts[s]; p < lens[s] && k < n; p++) slot[k] = s, pos[k] = p, k++;
    } else {
        make_tokens(slot, pos, n, n_slots, lens);
    }
    size_t kv_dim = (size_t)kv_heads * head_dim, nc = (size_t)n_slots * max_len * kv_dim,
           nq = (size_t)n * heads * head_dim;
    snprintf(shape, sizeof shape, "N=%d H=%d KVH=%d Dh=%d S=%d L=%d lens %d..%d", n, heads, kv_heads, head_dim,
             n_slots, max_len, lens[0], lens[n_slots - 1]);
    float *kc = rand_floats(nc, 1.0f), *vc = rand_floats(nc, 1.0f), *q = rand_floats(nq, q_scale);
    float *dout = rand_floats(nq, 1.0f), *dk0 = rand_floats(nc, 0.1f), *dv0 = rand_floats(nc, 0.1f);
    void *gkc = dev_in(d, kc, nc), *gvc = dev_in(d, vc, nc), *gq = dev_in(d, q, nq), *go = d->be->alloc(d->be, nq);
    void *ckc = cpu_in(kc, nc), *cvc = cpu_in(vc, nc), *cq = cpu_in(q, nq), *co = CPU->alloc(CPU, nq);
    size_t nl = (size_t)n * heads;
    void *glse = d->be->alloc_f32(d->be, nl), *clse = CPU->alloc_f32(CPU, nl);

    d->be->attention(d->be, go, glse, gq, gkc, gvc, slot, pos, n, heads, kv_heads, head_dim, max_len);
    CPU->attention(CPU, co, clse, cq, ckc, cvc, slot, pos, n, heads, kv_heads, head_dim, max_len);
    float *got = dev_out(d, go, nq), *ref = cpu_out(co, nq);
    snprintf(name, sizeof name, "attention %s", shape);
    check(d, name, got, ref, nq, (Tol){1e-5, 2e-3, 2.0});
    free(got), free(ref);
    got = dev_out_f32(d, glse, nl), ref = malloc(nl * sizeof(float));
    CPU->download_f32(CPU, ref, clse, nl);
    snprintf(name, sizeof name, "attention lse [f32] %s", shape);
    check(d, name, got, ref, nl, (Tol){1e-6, 1e-6, 0});
    free(got), free(ref);

    void *gdo = dev_in(d, dout, nq), *gdq = d->be->alloc(d->be, nq), *gdk = dev_in_f32(d, dk0, nc), *gdv = dev_in_f32(d, dv0, nc);
    void *cdo = cpu_in(dout, nq), *cdq = CPU->alloc(CPU, nq), *cdk = cpu_in(dk0, nc), *cdv = cpu_in(dv0, nc);
    d->be->attention_backward(d->be, gdq, gdk, gdv, gdo, gq, go, glse, gkc, gvc, slot, pos, n, heads, kv_heads, head_dim,
                              n_slots, max_len);
    CPU->attention_backward(CPU, cdq, cdk, cdv, cdo, cq, co, clse, ckc, cvc, slot, pos, n, heads, kv_heads, head_dim,
                            n_slots, max_len);
    float *ref_dq = cpu_out(cdq, nq), *ref_dk = cpu_out(cdk, nc), *ref_dv = cpu_out(cdv, nc);
    /* The bf16 tensor-core tiles (bf16 storage, runs of positions, Dh 64 or 128) round P and dS to bf16 for
     * the gradient products, as FlashAttention-2 does (cuda_attention.cu, "Rounding"): their bound is the tight
     * one plus twice the error of that rounding alone (a CPU reference that rounds the same way); with
     * COLT_FA_PRECISE=1 (hi + lo P and dS) the same kernels must meet the tight bound. Elsewhere the GPU
     * keeps P and dS in fp32 and meets the tight bound. */
    int fa2 = d->bf16 && g_attn_run_starts && (head_dim == 64 || head_dim == 128);
    if (fa2) {
        /* (a) the forward's lse and output handed over (delta = dO . O): the training path; (b) both NULL
         * (statistics recomputed, delta = sum P dP); (c) as (a) with dq recomputed instead of formed from the
         * stored dS (COLT_FA_DS_MAX_MB=0, the path above the scratch cap); (a) bit-identical when run again */
        float *dq_a = NULL, *dk_a = NULL, *dv_a = NULL;
        CudaOptions *opt = backend_cuda_options(d->be), opened = *opt; /* COLT_FA_DS_MAX_MB, COLT_FA_PRECISE */
        static const char *hows[3] = {"FA2 rounding, forward's lse + out", "FA2 rounding, stats recomputed",
                                      "FA2 rounding, dq recomputed"};
        for (int variant = 0; variant < 3; variant++) {
            float *fdq = calloc(nq, sizeof(float)), *fdk = dup_floats(dk0, nc), *fdv = dup_floats(dv0, nc);
            attn_backward_fa2_reference(fdq, fdk, fdv, dout, q, kc, vc, slot, pos, n, heads, kv_heads, head_dim,
                                        n_slots, max_len, variant != 1);
            double e_dq = max_abs_diff(fdq, ref_dq, nq), e_dk = max_abs_diff(fdk, ref_dk, nc);
            double e_dv = max_abs_diff(fdv, ref_dv, nc);
            const char *how = hows[variant];
            if (variant > 0) {
                d->be->free(d->be, gdk), d->be->free(d->be, gdv);
                gdk = dev_in_f32(d, dk0, nc), gdv = dev_in_f32(d, dv0, nc);
                if (variant == 2) opt->fa_ds_max_mb = 0;
                d->be->attention_backward(d->be, gdq, gdk, gdv, gdo, gq, variant == 1 ? NULL : go, variant == 1 ? NULL : glse,
                                          gkc, gvc, slot, pos, n, heads, kv_heads, head_dim, n_slots, max_len);
                *opt = opened;
            }
            float *gq_out = dev_out(d, gdq, nq), *gk_out = dev_out_f32(d, gdk, nc), *gv_out = dev_out_f32(d, gdv, nc);
            snprintf(name, sizeof name, "attention_backward dq (%s) %s", how, shape);
            check_attn_allow(d, name, gq_out, ref_dq, nq, (Tol){2e-5, 3e-3, 2.0}, e_dq);
            snprintf(name, sizeof name, "attention_backward dk [f32] += (%s) %s", how, shape);
            check_attn_allow(d, name, gk_out, ref_dk, nc, (Tol){2e-5, 2e-4, 0}, e_dk);
            snprintf(name, sizeof name, "attention_backward dv [f32] += (%s) %s", how, shape);
            check_attn_allow(d, name, gv_out, ref_dv, nc, (Tol){2e-5, 2e-4, 0}, e_dv);
            if (variant == 0) {
                dq_a = gq_out, dk_a = gk_out, dv_a = gv_out;
            } else {
                free(gq_out), free(gk_out), free(gv_out);
            }
            free(fdq), free(fdk), free(fdv);
        }
        /* determinism: (a) again on fresh accumulators, bit for bit */
        d->be->free(d->be, gdk), d->be->free(d->be, gdv);
        gdk = dev_in_f32(d, dk0, nc), gdv = dev_in_f32(d, dv0, nc);
        d->be->attention_backward(d->be, gdq, gdk, gdv, gdo, gq, go, glse, gkc, gvc, slot, pos, n, heads, kv_heads, head_dim,
                                  n_slots, max_len);
        float *gq_out = dev_out(d, gdq, nq), *gk_out = dev_out_f32(d, gdk, nc), *gv_out = dev_out_f32(d, gdv, nc);
        int same = !memcmp(gq_out, dq_a, nq * sizeof(float)) && !memcmp(gk_out, dk_a, nc * sizeof(float)) &&
                   !memcmp(gv_out, dv_a, nc * sizeof(float));
        g_checks++;
        if (!same) g_failures++;
        printf("%s %-9s attention_backward run twice: dq, dk, dv bit-identical %s\n", same ? "ok  " : "FAIL", d->tag,
               shape);
        free(gq_out), free(gk_out), free(gv_out), free(dq_a), free(dk_a), free(dv_a);
        /* the precise mode on fresh accumulators */
        d->be->free(d->be, gdk), d->be->free(d->be, gdv);
        gdk = dev_in_f32(d, dk0, nc), gdv = dev_in_f32(d, dv0, nc);
        opt->fa_precise = 1;
        d->be->attention_backward(d->be, gdq, gdk, gdv, gdo, gq, go, glse, gkc, gvc, slot, pos, n, heads, kv_heads, head_dim,
                                  n_slots, max_len);
        *opt = opened;
    }
    const char *mode = fa2 ? " COLT_FA_PRECISE=1" : "";
    got = dev_out(d, gdq, nq);
    snprintf(name, sizeof name, "attention_backward dq%s %s", mode, shape);
    check(d, name, got, ref_dq, nq, (Tol){2e-5, 3e-3, 2.0});
    free(got);
    got = dev_out_f32(d, gdk, nc);
    snprintf(name, sizeof name, "attention_backward dk [f32] +=%s %s", mode, shape);
    check(d, name, got, ref_dk, nc, (Tol){2e-5, 2e-4, 0});
    free(got);
    got = dev_out_f32(d, gdv, nc);
    snprintf(name, sizeof name, "attention_backward dv [f32] +=%s %s", mode, shape);
    check(d, name, got, ref_dv, nc, (Tol){2e-5, 2e-4, 0});
    free(got), free(ref_dq), free(ref_dk), free(ref_dv);

    free(slot), free(pos), free(kc), free(vc), free(q), free(dout), free(dk0), free(dv0);
    d->be->free(d->be, gkc), d->be->free(d->be, gvc), d->be->free(d->be, gq), d->be->free(d->be, go), d->be->free(d->be, gdo), d->be->free(d->be, gdq);
    d->be->free(d->be, gdk), d->be->free(d->be, gdv), d->be->free(d->be, glse);
    CPU->free(CPU, ckc), CPU->free(CPU, cvc), CPU->free(CPU, cq), CPU->free(CPU, co), CPU->free(CPU, cdo), CPU->free(CPU, cdq), CPU->free(CPU, cdk),
        CPU->free(CPU, cdv), CPU->free(CPU, clse);
}

/* ---------------------------------------------------------------- elementwise, embedding */

static void test_elementwise(const Dev *d, size_t n) {
    char name[128];
    float *g = rand_floats(n, 3.0f), *u = rand_floats(n, 1.0f), *dout = rand_floats(n, 1.0f);
    void *gg = dev_in(d, g, n), *gu = dev_in(d, u, n), *gdo = dev_in(d, dout, n), *go = d->be->alloc(d->be, n),
         *go2 = d->be->alloc(d->be, n);
    void *cg = cpu_in(g, n), *cu = cpu_in(u, n), *cdo = cpu_in(dout, n), *co = CPU->alloc(CPU, n), *co2 = CPU->alloc(CPU, n);

    d->be->swiglu(d->be, go, gg, gu, n);
    CPU->swiglu(CPU, co, cg, cu, n);
    float *got = dev_out(d, go, n), *ref = cpu_out(co, n);
    snprintf(name, sizeof name, "swiglu [%zu]", n);
    check(d, name, got, ref, n, (Tol){1e-5, 1e-5, 1.5});
    free(got), free(ref);

    d->be->swiglu_backward(d->be, go, go2, gdo, gg, gu, n);
    CPU->swiglu_backward(CPU, co, co2, cdo, cg, cu, n);
    got = dev_out(d, go, n), ref = cpu_out(co, n);
    snprintf(name, sizeof name, "swiglu_backward dgate [%zu]", n);
    check(d, name, got, ref, n, (Tol){1e-5, 1e-5, 1.5});
    free(got), free(ref);
    got = dev_out(d, go2, n), ref = cpu_out(co2, n);
    snprintf(name, sizeof name, "swiglu_backward dup [%zu]", n);
    check(d, name, got, ref, n, (Tol){1e-5, 1e-5, 1.5});
    free(got), free(ref);

    d->be->add(d->be, go, gg, gu, n);
    CPU->add(CPU, co, cg, cu, n);
    got = dev_out(d, go, n), ref = cpu_out(co, n);
    snprintf(name, sizeof name, "add [%zu]", n);
    check(d, name, got, ref, n, (Tol){1e-6, 1e-6, 1.0});
    free(got), free(ref);
    d->be->add(d->be, gg, gg, gu, n); /* out aliases a */
    CPU->add(CPU, cg, cg, cu, n);
    got = dev_out(d, gg, n), ref = cpu_out(cg, n);
    snprintf(name, sizeof name, "add in place (out = a) [%zu]", n);
    check(d, name, got, ref, n, (Tol){1e-6, 1e-6, 1.0});
    free(got), free(ref);

    d->be->mul_scalar(d->be, go, gu, 0.3711f, n);
    CPU->mul_scalar(CPU, co, cu, 0.3711f, n);
    got = dev_out(d, go, n), ref = cpu_out(co, n);
    snprintf(name, sizeof name, "mul_scalar [%zu]", n);
    check(d, name, got, ref, n, (Tol){1e-6, 1e-6, 1.0});
    free(got), free(ref);
    d->be->mul_scalar(d->be, gu, gu, 2.5f, n); /* in place */
    CPU->mul_scalar(CPU, cu, cu, 2.5f, n);
    got = dev_out(d, gu, n), ref = cpu_out(cu, n);
    snprintf(name, sizeof name, "mul_scalar in place [%zu]", n);
    check(d, name, got, ref, n, (Tol){1e-6, 1e-6, 1.0});
    free(got), free(ref);

    free(g), free(u), free(dout);
    d->be->free(d->be, gg), d->be->free(d->be, gu), d->be->free(d->be, gdo), d->be->free(d->be, go), d->be->free(d->be, go2);
    CPU->free(CPU, cg), CPU->free(CPU, cu), CPU->free(CPU, cdo), CPU->free(CPU, co), CPU->free(CPU, co2);
}

/* swiglu, swiglu_backward and add on pointers `off` elements into their buffers
 * (off = 1: misaligned for 16-byte vectors, the scalar path; n odd: a tail). */
static void test_elementwise_offset(const Dev *d, size_t n, size_t off) {
    char name[128];
    size_t nb = n + off, es = dtype_size(d->be->storage);
    float *g = rand_floats(nb, 3.0f), *u = rand_floats(nb, 1.0f), *dout = rand_floats(nb, 1.0f);
    void *gg = dev_in(d, g, nb), *gu = dev_in(d, u, nb), *gdo = dev_in(d, dout, nb), *go = d->be->alloc(d->be, nb),
         *go2 = d->be->alloc(d->be, nb);
    void *cg = cpu_in(g, nb), *cu = cpu_in(u, nb), *cdo = cpu_in(dout, nb), *co = CPU->alloc(CPU, nb), *co2 = CPU->alloc(CPU, nb);
#define DOFF(p) ((void *)((char *)(p) + off * es))
#define COFF(p) ((void *)((float *)(p) + off))
    d->be->swiglu(d->be, DOFF(go), DOFF(gg), DOFF(gu), n);
    CPU->swiglu(CPU, COFF(co), COFF(cg), COFF(cu), n);
    float *got = dev_out(d, go, nb), *ref = cpu_out(co, nb);
    snprintf(name, sizeof name, "swiglu offset %zu [%zu]", off, n);
    check(d, name, got + off, ref + off, n, (Tol){1e-5, 1e-5, 1.5});
    free(got), free(ref);
    d->be->swiglu_backward(d->be, DOFF(go), DOFF(go2), DOFF(gdo), DOFF(gg), DOFF(gu), n);
    CPU->swiglu_backward(CPU, COFF(co), COFF(co2), COFF(cdo), COFF(cg), COFF(cu), n);
    got = dev_out(d, go2, nb), ref = cpu_out(co2, nb);
    snprintf(name, sizeof name, "swiglu_backward dup offset %zu [%zu]", off, n);
    check(d, name, got + off, ref + off, n, (Tol){1e-5, 1e-5, 1.5});
    free(got), free(ref);
    d->be->add(d->be, DOFF(go), DOFF(gg), DOFF(gu), n);
    CPU->add(CPU, COFF(co), COFF(cg), COFF(cu), n);
    got = dev_out(d, go, nb), ref = cpu_out(co, nb);
    snprintf(name, sizeof name, "add offset %zu [%zu]", off, n);
    check(d, name, got + off, ref + off, n, (Tol){1e-6, 1e-6, 1.0});
    free(got), free(ref);
#undef DOFF
#undef COFF
    free(g), free(u), free(dout);
    d->be->free(d->be, gg), d->be->free(d->be, gu), d->be->free(d->be, gdo), d->be->free(d->be, go), d->be->free(d->be, go2);
    CPU->free(CPU, cg), CPU->free(CPU, cu), CPU->free(CPU, cdo), CPU->free(CPU, co), CPU->free(CPU, co2);
}

static void test_embedding(const Dev *d, int vocab, int dim, int n) {
    char name[128];
    size_t nt = (size_t)vocab * dim, no = (size_t)n * dim;
    int *ids = malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = i % 3 == 2 ? ids[i - 1] : rand_int(0, vocab - 1); /* repeats */
    ids[0] = vocab - 1;
    float *t = rand_floats(nt, 1.0f), *dout = rand_floats(no, 1.0f), *dt0 = rand_floats(nt, 0.1f);
    void *gt = dev_in(d, t, nt), *go = d->be->alloc(d->be, no), *ct = cpu_in(t, nt), *co = CPU->alloc(CPU, no);
    d->be->embedding(d->be, go, gt, ids, n, dim);
    CPU->embedding(CPU, co, ct, ids, n, dim);
    float *got = dev_out(d, go, no), *ref = cpu_out(co, no);
    snprintf(name, sizeof name, "embedding V=%d D=%d N=%d (exact)", vocab, dim, n);
    check(d, name, got, ref, no, (Tol){0, 0, 0});
    free(got), free(ref);

    void *gdo = dev_in(d, dout, no), *gdt = dev_in_f32(d, dt0, nt), *cdo = cpu_in(dout, no), *cdt = cpu_in(dt0, nt);
    d->be->embedding_backward(d->be, gdt, gdo, ids, n, dim);
    CPU->embedding_backward(CPU, cdt, cdo, ids, n, dim);
    got = dev_out_f32(d, gdt, nt), ref = cpu_out(cdt, nt);
    snprintf(name, sizeof name, "embedding_backward dtable [f32] += V=%d D=%d N=%d", vocab, dim, n);
    check(d, name, got, ref, nt, (Tol){1e-6, 1e-6, 0});
    free(got), free(ref);

    free(ids), free(t), free(dout), free(dt0);
    d->be->free(d->be, gt), d->be->free(d->be, go), d->be->free(d->be, gdo), d->be->free(d->be, gdt);
    CPU->free(CPU, ct), CPU->free(CPU, co), CPU->free(CPU, cdo), CPU->free(CPU, cdt);
}

/* Tensor parallelism's vocabulary-parallel embedding: rows [lo, hi) of the
 * table on this "rank". vocab_shard_ids_i32 (exact vs the CPU op), then
 * embedding, embedding_i32 (both zero rows for ids < 0, written over stale
 * contents) and embedding_backward (ids < 0 skipped) with those ids vs the CPU. */
static void test_embedding_vocab_part(const Dev *d, int vocab, int dim, int n, int lo, int hi) {
    char name[160];
    int vp = hi - lo;
    size_t nt = (size_t)vp * dim, no = (size_t)n * dim;
    int *ids = malloc((size_t)n * sizeof(int)), *want = malloc((size_t)n * sizeof(int)),
        *got_ids = malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = rand_int(0, vocab - 1);
    ids[0] = lo, ids[n - 1] = hi - 1; /* both ends of the part; and one just outside */
    if (n > 2) ids[1] = lo > 0 ? lo - 1 : hi;
    void *gids = d->be->alloc_i32(d->be, (size_t)n), *gpids = d->be->alloc_i32(d->be, (size_t)n);
    d->be->upload_i32(d->be, gids, ids, (size_t)n);
    d->be->vocab_shard_ids_i32(d->be, gpids, gids, n, lo, hi);
    d->be->download_i32(d->be, got_ids, gpids, (size_t)n);
    CPU->vocab_shard_ids_i32(CPU, want, ids, n, lo, hi); /* the CPU's [i32] buffers are host arrays */
    int wrong = 0, inside = 0;
    for (int i = 0; i < n; i++) wrong += got_ids[i] != want[i], inside += want[i] >= 0;
    g_checks++;
    if (wrong) g_failures++;
    printf("%s %-9s vocab_shard_ids_i32 [%d,%d) of V=%d N=%d: %d wrong (%d inside)\n", wrong ? "FAIL" : "ok  ",
           d->tag, lo, hi, vocab, n, wrong, inside);

    float *t = rand_floats(nt, 1.0f), *stale = rand_floats(no, 1.0f), *dout = rand_floats(no, 1.0f),
          *dt0 = rand_floats(nt, 0.1f);
    void *gt = dev_in(d, t, nt), *go = d->be->alloc(d->be, no), *ct = cpu_in(t, nt), *co = CPU->alloc(CPU, no);
    CPU->embedding(CPU, co, ct, want, n, dim);
    float *ref = cpu_out(co, no);
    d->be->upload(d->be, go, stale, no); /* a skipped row would keep these */
    d->be->embedding(d->be, go, gt, want, n, dim);
    float *got = dev_out(d, go, no);
    snprintf(name, sizeof name, "embedding part [%d,%d) D=%d N=%d, ids<0 zero (exact)", lo, hi, dim, n);
    check(d, name, got, ref, no, (Tol){0, 0, 0});
    free(got);
    d->be->upload(d->be, go, stale, no);
    d->be->embedding_i32(d->be, go, gt, gpids, n, dim);
    got = dev_out(d, go, no);
    snprintf(name, sizeof name, "embedding_i32 part [%d,%d) D=%d N=%d, ids<0 zero (exact)", lo, hi, dim, n);
    check(d, name, got, ref, no, (Tol){0, 0, 0});
    free(got), free(ref);

    void *gdo = dev_in(d, dout, no), *gdt = dev_in_f32(d, dt0, nt), *cdo = cpu_in(dout, no), *cdt = cpu_in(dt0, nt);
    d->be->embedding_backward(d->be, gdt, gdo, want, n, dim);
    CPU->embedding_backward(CPU, cdt, cdo, want, n, dim);
    got = dev_out_f32(d, gdt, nt), ref = cpu_out(cdt, nt);
    snprintf(name, sizeof name, "embedding_backward part [%d,%d) D=%d N=%d, ids<0 skipped", lo, hi, dim, n);
    check(d, name, got, ref, nt, (Tol){1e-6, 1e-6, 0});
    free(got), free(ref);

    free(ids), free(want), free(got_ids), free(t), free(stale), free(dout), free(dt0);
    d->be->free(d->be, gids), d->be->free(d->be, gpids), d->be->free(d->be, gt), d->be->free(d->be, go);
    d->be->free(d->be, gdo), d->be->free(d->be, gdt);
    CPU->free(CPU, ct), CPU->free(CPU, co), CPU->free(CPU, cdo), CPU->free(CPU, cdt);
}

/* ---------------------------------------------------------------- log-softmax */

static void test_log_softmax(const Dev *d, int n, int vocab, float temperature, float scale) {
    char name[128];
    size_t nl = (size_t)n * vocab;
    int *tg = malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) tg[i] = i % 5 == 3 ? -1 : rand_int(0, vocab - 1);
    float *lg = rand_floats(nl, scale), *dlp = rand_floats(n, 1.0f);
    void *gl = dev_in(d, lg, nl), *glp = d->be->alloc_f32(d->be, n), *gent = d->be->alloc_f32(d->be, n);
    void *cl = cpu_in(lg, nl), *clp = CPU->alloc(CPU, n), *cent = CPU->alloc(CPU, n);
    d->be->log_softmax_target(d->be, glp, gent, gl, tg, n, vocab, temperature);
    CPU->log_softmax_target(CPU, clp, cent, cl, tg, n, vocab, temperature);
    float *got = dev_out_f32(d, glp, n), *ref = cpu_out(clp, n);
    snprintf(name, sizeof name, "log_softmax_target logprobs N=%d V=%d T=%g", n, vocab, temperature);
    check(d, name, got, ref, n, (Tol){1e-5, 2e-5, 0});
    free(got), free(ref);
    got = dev_out_f32(d, gent, n), ref = cpu_out(cent, n);
    snprintf(name, sizeof name, "log_softmax_target entropy N=%d V=%d T=%g", n, vocab, temperature);
    check(d, name, got, ref, n, (Tol){1e-5, 2e-5, 0});
    free(got), free(ref);
    /* entropy may be NULL */
    d->be->log_softmax_target(d->be, glp, NULL, gl, tg, n, vocab, temperature);
    got = dev_out_f32(d, glp, n), ref = cpu_out(clp, n);
    snprintf(name, sizeof name, "log_softmax_target (entropy NULL) N=%d V=%d", n, vocab);
    check(d, name, got, ref, n, (Tol){1e-5, 2e-5, 0});
    free(got), free(ref);

    void *gdlp = dev_in_f32(d, dlp, n), *gdl = d->be->alloc(d->be, nl), *cdlp = cpu_in(dlp, n), *cdl = CPU->alloc(CPU, nl);
    d->be->log_softmax_target_backward(d->be, gdl, gl, tg, gdlp, n, vocab, temperature);
    CPU->log_softmax_target_backward(CPU, cdl, cl, tg, cdlp, n, vocab, temperature);
    got = dev_out(d, gdl, nl), ref = cpu_out(cdl, nl);
    snprintf(name, sizeof name, "log_softmax_target_backward N=%d V=%d T=%g", n, vocab, temperature);
    check(d, name, got, ref, nl, (Tol){1e-5, 1e-4, 1.5});
    free(got), free(ref);
    /* with the entropy's gradient (TRL's entropy bonus), out of place */
    float *dh = rand_floats(n, 1.0f);
    void *gdh = dev_in_f32(d, dh, n), *cdh = cpu_in(dh, n);
    d->be->log_softmax_entropy_backward(d->be, gdl, gl, tg, gdlp, gdh, n, vocab, temperature);
    CPU->log_softmax_entropy_backward(CPU, cdl, cl, tg, cdlp, cdh, n, vocab, temperature);
    got = dev_out(d, gdl, nl), ref = cpu_out(cdl, nl);
    snprintf(name, sizeof name, "log_softmax_entropy_backward N=%d V=%d T=%g", n, vocab, temperature);
    check(d, name, got, ref, nl, (Tol){1e-5, 1e-4, 1.5});
    free(got), free(ref);
    /* in place, on copies of the logits (the plain backward's in-place check below needs them) */
    void *gl2 = dev_in(d, lg, nl), *cl2 = cpu_in(lg, nl);
    d->be->log_softmax_entropy_backward(d->be, gl2, gl2, tg, gdlp, gdh, n, vocab, temperature);
    CPU->log_softmax_entropy_backward(CPU, cl2, cl2, tg, cdlp, cdh, n, vocab, temperature);
    got = dev_out(d, gl2, nl), ref = cpu_out(cl2, nl);
    snprintf(name, sizeof name, "log_softmax_entropy_backward in place N=%d V=%d", n, vocab);
    check(d, name, got, ref, nl, (Tol){1e-5, 1e-4, 1.5});
    free(got), free(ref), free(dh);
    d->be->free(d->be, gdh), d->be->free(d->be, gl2), CPU->free(CPU, cdh), CPU->free(CPU, cl2);
    /* in place: dlogits aliases logits */
    d->be->log_softmax_target_backward(d->be, gl, gl, tg, gdlp, n, vocab, temperature);
    CPU->log_softmax_target_backward(CPU, cl, cl, tg, cdlp, n, vocab, temperature);
    got = dev_out(d, gl, nl), ref = cpu_out(cl, nl);
    snprintf(name, sizeof name, "log_softmax_target_backward in place N=%d V=%d", n, vocab);
    check(d, name, got, ref, nl, (Tol){1e-5, 1e-4, 1.5});
    free(got), free(ref);

    free(tg), free(lg), free(dlp);
    d->be->free(d->be, gl), d->be->free(d->be, glp), d->be->free(d->be, gent), d->be->free(d->be, gdlp), d->be->free(d->be, gdl);
    CPU->free(CPU, cl), CPU->free(CPU, clp), CPU->free(CPU, cent), CPU->free(CPU, cdlp), CPU->free(CPU, cdl);
}

/* One part's stats[N, 4] folded into acc[N, 4] = {M, S, T, z[target]} as the
 * ranks combine them: M = max m, S = sum s e^(m-M), T = sum t e^(m-M), z[target]
 * summed (0 from the parts without it). acc starts at {-inf, 0, 0, 0}. */
static void shard_stats_fold(double *acc, const float *st, int n) {
    for (int i = 0; i < n; i++) {
        double *a = acc + 4 * i, m = st[4 * i], M = fmax(a[0], m);
        a[1] = a[1] * exp(a[0] - M) + st[4 * i + 1] * exp(m - M);
        a[2] = a[2] * exp(a[0] - M) + st[4 * i + 2] * exp(m - M);
        a[0] = M, a[3] += st[4 * i + 3];
    }
}

/* Vocabulary-parallel log-softmax: logits [N, V] split into `parts` column
 * parts (uneven when V is not a multiple), each cut out with copy_2d (exact vs
 * the CPU's cut). Per part: logits_shard_stats vs the CPU op, field by field;
 * then the parts' stats combined on the host as the ranks do, the device's vs
 * the CPU's (lse, log-prob, entropy; test_backend_ops checks the CPU's
 * combination against log_softmax_target on whole rows). Then
 * log_softmax_shard_backward on each part with the CPU's combined lse (the same
 * input to both), out of place and in place, reassembled into [N, V] with
 * copy_2d, vs the CPU's reassembly. Tolerances as log_softmax_target's. */
static void test_log_softmax_shards(const Dev *d, int n, int vocab, int parts, float temperature, float scale) {
    char name[160];
    size_t nl = (size_t)n * vocab, es = dtype_size(d->be->storage);
    int *tg = malloc((size_t)n * sizeof(int)), *tq = malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) tg[i] = i % 5 == 3 ? -1 : rand_int(0, vocab - 1);
    float *lg = rand_floats(nl, scale), *dlp = rand_floats(n, 1.0f);
    void *gl = dev_in(d, lg, nl), *cl = cpu_in(lg, nl);
    void *gdlp = dev_in_f32(d, dlp, n), *cdlp = cpu_in(dlp, n);
    void *glse = d->be->alloc_f32(d->be, n), *clse = CPU->alloc(CPU, n);
    void *gstats = d->be->alloc_f32(d->be, (size_t)n * 4), *cstats = CPU->alloc(CPU, (size_t)n * 4);
    void *gwhole = d->be->alloc(d->be, nl), *cwhole = CPU->alloc(CPU, nl);       /* reassembled dlogits */
    void *gwhole_ip = d->be->alloc(d->be, nl), *cwhole_ip = CPU->alloc(CPU, nl); /* ... computed in place */
    float *cut = malloc(nl * sizeof(float)), *cut_ref = malloc(nl * sizeof(float)); /* the parts, as [N, V] */
    float *fields[2][4]; /* [device, cpu][stat] over parts x rows */
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < 4; k++) fields[b][k] = malloc((size_t)parts * n * sizeof(float));
    double *acc[2]; /* [device, cpu]: shard_stats_fold's [N, 4] */
    for (int b = 0; b < 2; b++) {
        acc[b] = calloc((size_t)n * 4, sizeof(double));
        for (int i = 0; i < n; i++) acc[b][4 * i] = -INFINITY;
    }
    void **gpart = malloc((size_t)parts * sizeof(void *)), **cpart = malloc((size_t)parts * sizeof(void *));

    for (int p = 0; p < parts; p++) {
        int lo = (int)((long)vocab * p / parts), hi = (int)((long)vocab * (p + 1) / parts), vp = hi - lo;
        size_t np = (size_t)n * vp;
        gpart[p] = d->be->alloc(d->be, np), cpart[p] = CPU->alloc(CPU, np);
        d->be->copy_2d(d->be, gpart[p], vp, (char *)gl + lo * es, vocab, n, vp);
        CPU->copy_2d(CPU, cpart[p], vp, (float *)cl + lo, vocab, n, vp);
        float *a = dev_out(d, gpart[p], np), *b = cpu_out(cpart[p], np);
        for (int i = 0; i < n; i++)
            for (int v = 0; v < vp; v++) {
                cut[(size_t)i * vocab + lo + v] = a[(size_t)i * vp + v];
                cut_ref[(size_t)i * vocab + lo + v] = b[(size_t)i * vp + v];
            }
        free(a), free(b);
        for (int i = 0; i < n; i++) tq[i] = tg[i] >= lo && tg[i] < hi ? tg[i] - lo : -1;
        d->be->logits_shard_stats(d->be, gstats, gpart[p], tq, n, vp, temperature);
        CPU->logits_shard_stats(CPU, cstats, cpart[p], tq, n, vp, temperature);
        float *st[2] = {dev_out_f32(d, gstats, (size_t)n * 4), cpu_out(cstats, (size_t)n * 4)};
        for (int b = 0; b < 2; b++) {
            for (int i = 0; i < n; i++)
                for (int k = 0; k < 4; k++) fields[b][k][(size_t)p * n + i] = st[b][4 * i + k];
            shard_stats_fold(acc[b], st[b], n);
            free(st[b]);
        }
    }
    snprintf(name, sizeof name, "copy_2d %d column parts out of [%d,%d] (exact)", parts, n, vocab);
    check(d, name, cut, cut_ref, nl, (Tol){0, 0, 0});
    static const char *stat_names[4] = {"max z", "sum e^(z-max)", "sum e^(z-max) z", "z[target]"};
    for (int k = 0; k < 4; k++) {
        snprintf(name, sizeof name, "logits_shard_stats %s N=%d V=%d/%d T=%g", stat_names[k], n, vocab, parts,
                 temperature);
        check(d, name, fields[0][k], fields[1][k], (size_t)parts * n, (Tol){1e-5, 2e-5, 0});
    }

    /* combined: [device, cpu][lse, log-prob (rows with a target), entropy] */
    float *comb[2][3];
    int with_target = 0;
    for (int b = 0; b < 2; b++) {
        with_target = 0;
        for (int q = 0; q < 3; q++) comb[b][q] = malloc((size_t)n * sizeof(float));
        for (int i = 0; i < n; i++) {
            const double *a = acc[b] + 4 * i;
            double lse = a[0] + log(a[1]);
            comb[b][0][i] = (float)lse, comb[b][2][i] = (float)(lse - a[2] / a[1]);
            if (tg[i] >= 0) comb[b][1][with_target++] = (float)(a[3] - lse);
        }
    }
    static const char *comb_names[3] = {"lse", "logprobs", "entropy"};
    for (int q = 0; q < 3; q++) {
        snprintf(name, sizeof name, "shard stats combined: %s N=%d V=%d/%d T=%g", comb_names[q], n, vocab, parts,
                 temperature);
        check(d, name, comb[0][q], comb[1][q], q == 1 ? (size_t)with_target : (size_t)n, (Tol){1e-5, 2e-5, 0});
    }

    d->be->upload_f32(d->be, glse, comb[1][0], n);
    CPU->upload(CPU, clse, comb[1][0], n);
    /* the entropy bonus's shard backward: the CPU's combined sum p z, a d entropy per row */
    float *pz = malloc((size_t)n * sizeof(float)), *dh = rand_floats(n, 1.0f);
    for (int i = 0; i < n; i++) pz[i] = (float)(acc[1][4 * i + 2] / acc[1][4 * i + 1]);
    void *gpz = dev_in_f32(d, pz, n), *cpz = cpu_in(pz, n), *gdh = dev_in_f32(d, dh, n), *cdh = cpu_in(dh, n);
    void *gwhole_e = d->be->alloc(d->be, nl), *cwhole_e = CPU->alloc(CPU, nl);
    for (int p = 0; p < parts; p++) {
        int lo = (int)((long)vocab * p / parts), hi = (int)((long)vocab * (p + 1) / parts), vp = hi - lo;
        size_t np = (size_t)n * vp;
        for (int i = 0; i < n; i++) tq[i] = tg[i] >= lo && tg[i] < hi ? tg[i] - lo : -1;
        void *gd = d->be->alloc(d->be, np), *cd = CPU->alloc(CPU, np);
        d->be->log_softmax_shard_backward(d->be, gd, gpart[p], tq, gdlp, glse, n, vp, temperature);
        CPU->log_softmax_shard_backward(CPU, cd, cpart[p], tq, cdlp, clse, n, vp, temperature);
        d->be->copy_2d(d->be, (char *)gwhole + lo * es, vocab, gd, vp, n, vp);
        CPU->copy_2d(CPU, (float *)cwhole + lo, vocab, cd, vp, n, vp);
        d->be->log_softmax_shard_entropy_backward(d->be, gd, gpart[p], tq, gdlp, gdh, glse, gpz, n, vp, temperature);
        CPU->log_softmax_shard_entropy_backward(CPU, cd, cpart[p], tq, cdlp, cdh, clse, cpz, n, vp, temperature);
        d->be->copy_2d(d->be, (char *)gwhole_e + lo * es, vocab, gd, vp, n, vp);
        CPU->copy_2d(CPU, (float *)cwhole_e + lo, vocab, cd, vp, n, vp);
        /* in place: dlogits aliases the part's logits */
        d->be->log_softmax_shard_backward(d->be, gpart[p], gpart[p], tq, gdlp, glse, n, vp, temperature);
        CPU->log_softmax_shard_backward(CPU, cpart[p], cpart[p], tq, cdlp, clse, n, vp, temperature);
        d->be->copy_2d(d->be, (char *)gwhole_ip + lo * es, vocab, gpart[p], vp, n, vp);
        CPU->copy_2d(CPU, (float *)cwhole_ip + lo, vocab, cpart[p], vp, n, vp);
        d->be->free(d->be, gd), CPU->free(CPU, cd);
    }
    float *got = dev_out(d, gwhole, nl), *ref = cpu_out(cwhole, nl);
    snprintf(name, sizeof name, "log_softmax_shard_backward N=%d V=%d/%d T=%g", n, vocab, parts, temperature);
    check(d, name, got, ref, nl, (Tol){1e-5, 1e-4, 1.5});
    free(got), free(ref);
    got = dev_out(d, gwhole_ip, nl), ref = cpu_out(cwhole_ip, nl);
    snprintf(name, sizeof name, "log_softmax_shard_backward in place N=%d V=%d/%d", n, vocab, parts);
    check(d, name, got, ref, nl, (Tol){1e-5, 1e-4, 1.5});
    free(got), free(ref);
    got = dev_out(d, gwhole_e, nl), ref = cpu_out(cwhole_e, nl);
    snprintf(name, sizeof name, "log_softmax_shard_entropy_backward N=%d V=%d/%d T=%g", n, vocab, parts, temperature);
    check(d, name, got, ref, nl, (Tol){1e-5, 1e-4, 1.5});
    free(got), free(ref), free(pz), free(dh);
    d->be->free(d->be, gpz), d->be->free(d->be, gdh), d->be->free(d->be, gwhole_e);
    CPU->free(CPU, cpz), CPU->free(CPU, cdh), CPU->free(CPU, cwhole_e);

    for (int p = 0; p < parts; p++) d->be->free(d->be, gpart[p]), CPU->free(CPU, cpart[p]);
    for (int b = 0; b < 2; b++) {
        for (int k = 0; k < 4; k++) free(fields[b][k]);
        for (int q = 0; q < 3; q++) free(comb[b][q]);
        free(acc[b]);
    }
    free(gpart), free(cpart), free(tg), free(tq), free(lg), free(dlp), free(cut), free(cut_ref);
    d->be->free(d->be, gl), d->be->free(d->be, gdlp), d->be->free(d->be, glse), d->be->free(d->be, gstats);
    d->be->free(d->be, gwhole), d->be->free(d->be, gwhole_ip);
    CPU->free(CPU, cl), CPU->free(CPU, cdlp), CPU->free(CPU, clse), CPU->free(CPU, cstats), CPU->free(CPU, cwhole),
        CPU->free(CPU, cwhole_ip);
}

/* ---------------------------------------------------------------- optimizer, reductions */

/* Three AdamW steps. fp32 storage updates param directly; bf16 storage updates
 * an fp32 master (compared with the CPU's fp32 param) and writes param = bf16(master). */
static void test_adamw(const Dev *d, size_t n) {
    char name[128];
    float *p = rand_floats(n, 1.0f), *m0 = rand_floats(n, 0.01f), *v0 = rand_floats(n, 0.01f);
    for (size_t i = 0; i < n; i++) v0[i] = v0[i] * v0[i];
    void *cp = cpu_in(p, n), *cm = cpu_in(m0, n), *cv = cpu_in(v0, n), *cg = CPU->alloc(CPU, n);
    void *gm = dev_in_f32(d, m0, n), *gv = dev_in_f32(d, v0, n), *gg = d->be->alloc_f32(d->be, n);
    void *gmaster = d->bf16 ? dev_in_f32(d, p, n) : NULL;
    float *pp = dup_floats(p, n);
    void *gp = d->bf16 ? dev_in(d, pp, n) : dev_in(d, p, n);
    float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
    for (int step = 1; step <= 3; step++) {
        float *g = rand_floats(n, 0.1f);
        CPU->upload(CPU, cg, g, n);
        d->be->upload_f32(d->be, gg, g, n);
        float bc1 = (float)(1.0 - pow(b1, step)), bc2 = (float)(1.0 - pow(b2, step));
        d->be->adamw(d->be, gp, gmaster, gg, gm, gv, n, lr, b1, b2, eps, wd, bc1, bc2);
        CPU->adamw(CPU, cp, NULL, cg, cm, cv, n, lr, b1, b2, eps, wd, bc1, bc2);
        free(g);
    }
    float *ref = cpu_out(cp, n), *got;
    if (d->bf16) {
        got = dev_out_f32(d, gmaster, n);
        snprintf(name, sizeof name, "adamw master [f32] (3 steps) [%zu]", n);
        check(d, name, got, ref, n, (Tol){1e-6, 1e-6, 0});
        free(got);
    }
    got = dev_out(d, gp, n);
    snprintf(name, sizeof name, "adamw param (3 steps) [%zu]", n);
    check(d, name, got, ref, n, (Tol){1e-6, 1e-6, 1.0});
    free(got), free(ref);
    got = dev_out_f32(d, gm, n), ref = cpu_out(cm, n);
    check(d, "adamw m [f32]", got, ref, n, (Tol){1e-6, 1e-6, 0});
    free(got), free(ref);
    got = dev_out_f32(d, gv, n), ref = cpu_out(cv, n);
    check(d, "adamw v [f32]", got, ref, n, (Tol){1e-6, 1e-6, 0});
    free(got), free(ref);
    free(p), free(m0), free(v0), free(pp);
    CPU->free(CPU, cp), CPU->free(CPU, cm), CPU->free(CPU, cv), CPU->free(CPU, cg);
    d->be->free(d->be, gm), d->be->free(d->be, gv), d->be->free(d->be, gg), d->be->free(d->be, gp);
    if (gmaster) d->be->free(d->be, gmaster);
}

static void test_reductions(const Dev *d, size_t n) {
    char name[128];
    float *x = rand_floats(n, 1.0f);
    void *gx = dev_in_f32(d, x, n), *cx = cpu_in(x, n);
    double got = d->be->sum_squares(d->be, gx, n), ref = CPU->sum_squares(CPU, cx, n);
    /* both sum in double, in different orders: agreement to ~1e-15 relative */
    double err = fabs(got - ref), tol = 1e-12 * fabs(ref);
    int ok = err <= tol && ref > 0;
    g_checks++;
    if (!ok) g_failures++;
    snprintf(name, sizeof name, "sum_squares [%zu] = %.15g (cpu %.15g)", n, got, ref);
    printf("%s %-9s %-58s |err| %.3e  rel %.3e  tol %.1e\n", ok ? "ok  " : "FAIL", d->tag, name, err,
           err / fabs(ref), tol);
    d->be->scale(d->be, gx, 0.37f, n);
    CPU->scale(CPU, cx, 0.37f, n);
    float *g = dev_out_f32(d, gx, n), *r = cpu_out(cx, n);
    snprintf(name, sizeof name, "scale [f32] x0.37 [%zu] (exact)", n);
    check(d, name, g, r, n, (Tol){0, 0, 0});
    free(g), free(r);
    /* add_f32 (ZeRO-2's shard accumulation), also at an odd offset (the scalar tail) */
    float *y = rand_floats(n, 1.0f);
    void *gy = dev_in_f32(d, y, n), *cy = cpu_in(y, n);
    d->be->add_f32(d->be, gy, gx, n);
    CPU->add_f32(CPU, cy, cx, n);
    d->be->add_f32(d->be, (float *)gy + 3, (float *)gx + 5, n - 7);
    CPU->add_f32(CPU, (float *)cy + 3, (float *)cx + 5, n - 7);
    g = dev_out_f32(d, gy, n), r = cpu_out(cy, n);
    snprintf(name, sizeof name, "add_f32 [%zu], then at offsets 3 / 5 (exact)", n);
    check(d, name, g, r, n, (Tol){0, 0, 0});
    free(g), free(r), free(x), free(y);
    d->be->free(d->be, gx), CPU->free(CPU, cx), d->be->free(d->be, gy), CPU->free(CPU, cy);
}

/* dropout (LoRA's lora_dropout): the CPU's mask bit for bit, the kept values x / (1 - p) in storage;
 * also in place and at an odd length. */
static void test_dropout(const Dev *d, size_t n) {
    char name[128];
    float *x = rand_floats(n, 2.0f);
    void *gx = dev_in(d, x, n), *cx = cpu_in(x, n); /* x now holds the storage's values */
    d->be->dropout(d->be, gx, gx, n, 0.3f, 99, 12345);
    CPU->dropout(CPU, cx, cx, n, 0.3f, 99, 12345);
    float *g = dev_out(d, gx, n), *r = cpu_out(cx, n);
    size_t mask_differs = 0;
    for (size_t i = 0; i < n; i++) {
        mask_differs += (g[i] == 0.0f) != (r[i] == 0.0f) && x[i] != 0.0f;
        if (d->bf16) { /* the device rounds x / (1 - p) once */
            uint32_t u = (uint32_t)float_to_bf16(r[i]) << 16;
            memcpy(&r[i], &u, 4);
        }
    }
    snprintf(name, sizeof name, "dropout p 0.3 [%zu] in place (exact; %zu mask differences)", n, mask_differs);
    if (mask_differs) g_failures++;
    check(d, name, g, r, n, (Tol){0, 0, 0});
    free(g), free(r), free(x);
    d->be->free(d->be, gx), CPU->free(CPU, cx);
}

/* ---------------------------------------------------------------- model level */

static int dir_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Host log-softmax of logits rows [rows, V] into out, in double. */
static void host_log_softmax(float *out, const float *logits, int rows, int vocab) {
    for (int r = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * vocab;
        double mx = -INFINITY, s = 0.0;
        for (int v = 0; v < vocab; v++) mx = fmax(mx, row[v]);
        for (int v = 0; v < vocab; v++) s += exp(row[v] - mx);
        double lse = mx + log(s);
        for (int v = 0; v < vocab; v++) out[(size_t)r * vocab + v] = (float)(row[v] - lse);
    }
}

/* Token i of the model tests: its own keyed stream, so the tokens (and the
 * bf16 error statistics) do not shift when op tests are added before it. */
static int model_token(int i, int vocab) {
    int v = (int)(rng_uniform(17, 99, (uint64_t)i) * (float)vocab);
    return v < vocab ? v : vocab - 1;
}

/* Prefill of two sequences (lengths 41 and 23, interleaved in one call), then
 * one decode step of each; log-probs of every position compared to the CPU. */
static void test_model_forward(const Dev *d, const char *dir, const char *label, double tol_abs, double tol_mean) {
    char err[ERR_LEN], name[160];
    Model *mc = NULL, *mg = NULL;
    ModelState *sc = NULL, *sg = NULL;
    if (!dir_exists(dir)) {
        g_checks++, g_failures++;
        printf("FAIL %-9s model %s: directory %s not found\n", d->tag, label, dir);
        return;
    }
    if (model_load(&mc, dir, CPU, err) != 0 || model_load(&mg, dir, d->be, err) != 0) {
        g_checks++, g_failures++;
        printf("FAIL %-9s model %s: model_load: %s\n", d->tag, label, err);
        goto done;
    }
    const ModelConfig *cfg = model_config(mc);
    int V = cfg->vocab_size, lens[2] = {41, 23}, n = lens[0] + lens[1];
    COLT_ASSERT(model_state_create(&sc, mc, 2, 64, n, err) == 0);
    COLT_ASSERT(model_state_create(&sg, mg, 2, 64, n, err) == 0);
    int *tok = malloc((size_t)n * sizeof(int)), *slot = malloc((size_t)n * sizeof(int)),
        *pos = malloc((size_t)n * sizeof(int));
    int next[2] = {0, 0};
    for (int i = 0; i < n; i++) { /* interleave the two sequences */
        int s = (i % 3 == 2 && next[1] < lens[1]) || next[0] >= lens[0] ? 1 : 0;
        slot[i] = s, pos[i] = next[s]++, tok[i] = model_token(i, V);
    }
    float *lc = malloc((size_t)n * V * sizeof(float)), *lgpu = malloc((size_t)n * V * sizeof(float));
    float *pc = malloc((size_t)n * V * sizeof(float)), *pg = malloc((size_t)n * V * sizeof(float));
    for (int phase = 0; phase < 2; phase++) {
        int m = n;
        if (phase == 1) { /* decode: one token per sequence at its next position */
            m = 2;
            for (int s = 0; s < 2; s++) slot[s] = s, pos[s] = lens[s], tok[s] = model_token(1000 + s, V);
        }
        if (model_forward(mc, sc, tok, slot, pos, m, NULL, lc, err) != 0 ||
            model_forward(mg, sg, tok, slot, pos, m, NULL, lgpu, err) != 0) {
            g_checks++, g_failures++;
            printf("FAIL %-9s model %s: model_forward: %s\n", d->tag, label, err);
            break;
        }
        host_log_softmax(pc, lc, m, V);
        host_log_softmax(pg, lgpu, m, V);
        double worst = 0.0, sum = 0.0;
        for (size_t e = 0; e < (size_t)m * V; e++) {
            double diff = fabs((double)pc[e] - pg[e]);
            if (!(diff <= worst)) worst = diff;
            sum += diff;
        }
        double mean = sum / ((double)m * V);
        int ok = worst <= tol_abs && mean <= tol_mean;
        g_checks++;
        if (!ok) g_failures++;
        snprintf(name, sizeof name, "model %s %s logprobs (%d tokens x V=%d)", label,
                 phase ? "decode" : "prefill", m, V);
        printf("%s %-9s %-58s max|err| %.3e  mean|err| %.3e  tol max %.1e mean %.1e\n", ok ? "ok  " : "FAIL",
               d->tag, name, worst, mean, tol_abs, tol_mean);
    }
    free(tok), free(slot), free(pos), free(lc), free(lgpu), free(pc), free(pg);
done:
    if (sc) model_state_free(sc);
    if (sg) model_state_free(sg);
    if (mc) model_free(mc);
    if (mg) model_free(mg);
}

/* One training forward + backward (dlogprobs = fixed weights) on two whole
 * sequences; log-probs, entropies and every parameter gradient vs the CPU. */
/* adapter: a PEFT LoRA folder attached to both models (the gradients are then the adapters'), or NULL. */
static void test_train_step(const Dev *d, const char *dir, const char *adapter, const char *label, double lp_tol,
                            double grad_rel, float lora_dropout) {
    char err[ERR_LEN], name[200];
    Model *mc = NULL, *mg = NULL;
    TrainState *sc = NULL, *sg = NULL;
    ModelGrads *gc = NULL, *gg = NULL;
    if (model_load(&mc, dir, CPU, err) != 0 || model_load(&mg, dir, d->be, err) != 0 ||
        (adapter && (model_lora_load(mc, adapter, err) != 0 || model_lora_load(mg, adapter, err) != 0))) {
        g_checks++, g_failures++;
        printf("FAIL %-9s train %s: model_load: %s\n", d->tag, label, err);
        goto done;
    }
    if (lora_dropout > 0.0f) { /* the same masks on both: keyed, not drawn from a device's RNG */
        model_lora_set_dropout(mc, lora_dropout), model_lora_set_dropout(mg, lora_dropout);
        model_lora_set_dropout_key(mc, 5, 3), model_lora_set_dropout_key(mg, 5, 3);
    }
    int V = model_config(mc)->vocab_size, lens[2] = {30, 19}, n = lens[0] + lens[1];
    COLT_ASSERT(train_state_create(&sc, mc, 2, 64, n, err) == 0 && train_state_create(&sg, mg, 2, 64, n, err) == 0);
    COLT_ASSERT(model_grads_create(&gc, mc, err) == 0 && model_grads_create(&gg, mg, err) == 0);
    model_grads_zero(gc), model_grads_zero(gg);
    int *tok = malloc((size_t)n * sizeof(int)), *slot = malloc((size_t)n * sizeof(int)),
        *pos = malloc((size_t)n * sizeof(int)), *tg = malloc((size_t)n * sizeof(int));
    float *w = malloc((size_t)n * sizeof(float)), *lpc = malloc((size_t)n * sizeof(float)),
          *lpg = malloc((size_t)n * sizeof(float)), *enc = malloc((size_t)n * sizeof(float)),
          *eng = malloc((size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) {
        int s = i < lens[0] ? 0 : 1, p = s ? i - lens[0] : i;
        slot[i] = s, pos[i] = p, tok[i] = rand_int(0, V - 1);
        /* prompt (first 6 tokens) and each sequence's last token have no target */
        tg[i] = p < 6 || p == lens[s] - 1 ? -1 : rand_int(0, V - 1);
        w[i] = tg[i] < 0 ? 0.0f : rng_normal(17, 0, (uint64_t)i) / (float)n;
    }
    float temperature = 0.9f;
    if (model_train_forward(mc, sc, tok, slot, pos, tg, n, temperature, lpc, enc, err) != 0 ||
        model_train_forward(mg, sg, tok, slot, pos, tg, n, temperature, lpg, eng, err) != 0 ||
        model_train_backward(mc, sc, w, gc, err) != 0 || model_train_backward(mg, sg, w, gg, err) != 0) {
        g_checks++, g_failures++;
        printf("FAIL %-9s train %s: %s\n", d->tag, label, err);
        goto free_batch;
    }
    {
        double worst_lp = 0.0, worst_ent = 0.0;
        for (int i = 0; i < n; i++) {
            worst_lp = fmax(worst_lp, fabs((double)lpc[i] - lpg[i]));
            worst_ent = fmax(worst_ent, fabs((double)enc[i] - eng[i]));
            if (isnan(lpg[i]) || isnan(eng[i])) worst_lp = INFINITY;
        }
        int ok = worst_lp <= lp_tol && worst_ent <= lp_tol;
        g_checks++;
        if (!ok) g_failures++;
        snprintf(name, sizeof name, "train %s forward logprobs/entropy (N=%d)", label, n);
        printf("%s %-9s %-58s max|err| lp %.3e ent %.3e  tol %.1e\n", ok ? "ok  " : "FAIL", d->tag, name, worst_lp,
               worst_ent, lp_tol);
    }
    for (int p = 0; p < model_param_count(mc); p++) {
        ModelParam pc = model_param(mc, p);
        float *ref = malloc(pc.numel * sizeof(float)), *got = malloc(pc.numel * sizeof(float));
        CPU->download_f32(CPU, ref, model_grad(gc, p), pc.numel);
        d->be->download_f32(d->be, got, model_grad(gg, p), pc.numel);
        snprintf(name, sizeof name, "train %s grad %s", label, pc.name);
        check(d, name, got, ref, pc.numel, (Tol){grad_rel, grad_rel, 0});
        free(ref), free(got);
    }
free_batch:
    free(tok), free(slot), free(pos), free(tg), free(w), free(lpc), free(lpg), free(enc), free(eng);
done:
    if (gc) model_grads_free(gc);
    if (gg) model_grads_free(gg);
    if (sc) train_state_free(sc);
    if (sg) train_state_free(sg);
    if (mc) model_free(mc);
    if (mg) model_free(mg);
}

/* ---------------------------------------------------------------- main */

static void run_ops(const Dev *d) {
    printf("---- %s (storage %s) ----\n", d->tag, d->bf16 ? "bf16" : "fp32");
    test_memory(d);

    test_linear(d, 37, 96, 80, 1);
    test_linear(d, 37, 96, 80, 0);
    test_linear(d, 129, 136, 1000, 1);
    test_linear(d, 64, 172, 64, 0); /* stories260K's F = 172 */
    test_linear(d, 300, 896, 200, 1);
    test_linear(d, 5, 64, 1003, 0);
    test_linear(d, 33, 97, 45, 1); /* odd leading dimensions */

    test_linear_backward(d, 37, 96, 80, 1, 0, 1);
    test_linear_backward(d, 129, 136, 1000, 1, 1, 1);
    test_linear_backward(d, 64, 172, 64, 1, 0, 0);
    test_linear_backward(d, 20, 64, 33, 0, 0, 1);
    test_linear_backward(d, 300, 896, 200, 1, 1, 0);

    test_rmsnorm(d, 9, 72, 0);
    test_rmsnorm(d, 33, 896, 0);
    test_rmsnorm(d, 5, 200, 0);
    test_rmsnorm(d, 3, 8960, 0);
    test_rmsnorm(d, 7, 75, 0); /* dim % 8 != 0: the block-per-row path */
    test_rmsnorm(d, 7 * 16, 128, 1); /* Qwen3's q norm: rows of head_dim, in place */
    test_rmsnorm(d, 5 * 4, 24, 1);
    test_rmsnorm_backward(d, 9, 72, 1);
    test_rmsnorm_backward(d, 33, 896, 1);
    test_rmsnorm_backward(d, 17, 200, 1);
    test_rmsnorm_backward(d, 5, 75, 1); /* dim % 8 != 0: the block-per-row dx path */
    test_rmsnorm_backward(d, 33, 896, 0); /* frozen norm (LoRA) */
    test_rmsnorm_backward(d, 9 * 16, 128, 1); /* Qwen3's q/k norm: many rows of head_dim */

    for (int b = 0; b < 2; b++) {
        test_rope(d, 50, 4, 64, 10000.0f, 300, b);
        test_rope(d, 20, 2, 128, 1000000.0f, 300, b);
        test_rope(d, 10, 3, 8, 10000.0f, 100, b);
    }

    test_kv(d, 3, 40, 128, 30);
    test_kv(d, 2, 17, 144, 20);

    {
        int lens_a[3] = {301, 120, 17}, lens_b[2] = {257, 33}, lens_c[2] = {50, 9}, lens_d[2] = {70, 5};
        test_attention(d, 3, lens_a, 320, 64, 8, 2, 64, 1.0f);
        test_attention(d, 3, lens_a, 320, 48, 14, 2, 64, 2.0f);
        test_attention(d, 2, lens_b, 260, 40, 4, 1, 128, 1.0f);
        test_attention(d, 2, lens_c, 64, 20, 8, 4, 8, 1.0f);
        test_attention(d, 2, lens_d, 80, 16, 6, 3, 48, 1.0f);

        /* training / prefill layouts: runs of consecutive positions per slot */
        int run_lens_a[3] = {300, 130, 64}, run_starts_a[3] = {0, 50, 0};
        int run_lens_b[2] = {200, 77}, run_starts_b[2] = {0, 13};
        int run_lens_c[2] = {90, 40}, run_starts_c[2] = {0, 0};
        g_attn_run_starts = run_starts_a;
        test_attention(d, 3, run_lens_a, 320, 300 + 80 + 64, 14, 2, 64, 1.0f);
        g_attn_run_starts = run_starts_b;
        test_attention(d, 2, run_lens_b, 260, 200 + 64, 4, 1, 128, 2.0f);
        g_attn_run_starts = run_starts_c;
        test_attention(d, 2, run_lens_c, 96, 130, 6, 3, 48, 1.0f);
        test_attention(d, 2, run_lens_c, 96, 130, 8, 4, 8, 1.0f);
        g_attn_run_starts = NULL;
    }

    test_elementwise(d, 1031);
    test_elementwise(d, (size_t)3 * 4864 + 5);
    test_elementwise(d, (size_t)1 << 20);
    test_elementwise_offset(d, 1037, 1);
    test_elementwise_offset(d, 4099, 8);
    test_embedding(d, 1000, 72, 50);
    test_embedding(d, 1003, 200, 9);
    test_embedding_vocab_part(d, 1000, 72, 50, 250, 500);
    test_embedding_vocab_part(d, 1003, 75, 9, 0, 334); /* rows of 75: element copies in embedding_i32 */
    test_embedding_vocab_part(d, 151936, 128, 64, 3 * 37984, 151936); /* 16-byte chunks */

    test_log_softmax(d, 37, 1000, 0.7f, 3.0f);
    test_log_softmax(d, 9, 1003, 1.0f, 1.0f);
    test_log_softmax(d, 4, 151936, 1.0f, 4.0f);
    test_log_softmax(d, 300, 151936, 1.0f, 4.0f); /* more rows than SMs: blocks walk rows */
    test_log_softmax_shards(d, 4, 151936, 4, 1.0f, 4.0f); /* Qwen's vocabulary over 4 ranks: 37984 columns */
    test_log_softmax_shards(d, 33, 151936, 4, 0.7f, 4.0f);
    test_log_softmax_shards(d, 37, 1003, 3, 0.7f, 3.0f);   /* odd parts: rows not 16-byte aligned */
    test_log_softmax_shards(d, 9, 75, 2, 1.0f, 1.0f);      /* parts narrower than a block */
    test_log_softmax_shards(d, 5, 13, 3, 1.0f, 2.0f);      /* parts of 4 and 5: no vector body */
    test_log_softmax_shards(d, 1, 517, 2, 1.0f, 2.0f);     /* one row: copy_2d's plain copy */

    test_adamw(d, (size_t)1003 * 7);
    test_adamw(d, ((size_t)1 << 16) + 3);
    test_reductions(d, 1000003);
    test_reductions(d, 37);
    test_dropout(d, 1000003);
    test_dropout(d, 37);
    test_reductions(d, (size_t)1 << 24);
}

/* offload_optimizer cpu against the optimizer on the device: three AdamW
 * steps of a whole model from the same weights and gradients (both groups,
 * weight decay on) give the same weight bits — the host AdamW repeats the
 * device op's arithmetic. And a ZeRO-1 shard of it updates exactly its range. */
static void test_offload_optimizer(const Dev *d, const char *dir) {
    Model *ma = NULL, *mb = NULL;
    char err[ERR_LEN];
    if (model_load(&ma, dir, d->be, err) != 0 || model_load(&mb, dir, d->be, err) != 0) {
        CHECKED(0, "%s: %s", dir, err);
        return;
    }
    ModelGrads *g = NULL;
    CHECKED(model_grads_create(&g, ma, err) == 0, "grads: %s", err);
    AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
    Optimizer *oa = NULL, *ob = NULL;
    OptimShardOptions off = {.rank = 0, .world = 1, .offload = true};
    CHECKED(optim_create(&oa, ma, &ac, d->be, err) == 0, "optimizer: %s", err);
    CHECKED(optim_create_sharded(&ob, mb, &ac, d->be, &off, err) == 0, "offloaded optimizer: %s", err);
    size_t n = 0;
    model_grads_flat(g, &n);
    for (int step = 0; step < 3; step++) {
        float *gr = rand_floats(n, 0.05f);
        d->be->upload_f32(d->be, model_grads_flat(g, &n), gr, n);
        free(gr);
        optim_step(oa, g, 1e-3f);
        optim_step(ob, g, 1e-3f);
    }
    size_t es = dtype_size(d->be->storage);
    unsigned char *wa = malloc(n * es), *wb = malloc(n * es);
    d->be->copy_to_host(d->be, wa, model_params_flat(ma, &n), n * es);
    d->be->copy_to_host(d->be, wb, model_params_flat(mb, &n), n * es);
    size_t differ = 0;
    for (size_t i = 0; i < n * es; i += es) differ += memcmp(wa + i, wb + i, es) != 0;
    printf("[%s] offload_optimizer cpu vs device AdamW, 3 steps of %s (%zu parameters): %zu weights differ "
           "(host AdamW %.3f ms)\n",
           d->tag, dir, n, differ, 1e3 * optim_last_host_seconds(ob));
    CHECKED(differ == 0, "[%s] offloaded AdamW: %zu of %zu weights differ from the device's", d->tag, differ, n);
    free(wa), free(wb);
    optim_free(oa), optim_free(ob);
    model_grads_free(g);
    model_free(ma), model_free(mb);
}

int main(void) {
    CPU = backend_cpu();
    const Backend *f32 = backend_cuda_f32(), *bf16 = backend_cuda();
    if (!f32 || !bf16) {
        printf("no CUDA device (cudaGetDeviceCount failed or found none): skipping test_cuda_ops\n");
        return 77;
    }
    Dev devs[2] = {{f32, 0, "cuda_f32"}, {bf16, 1, "cuda_bf16"}};
    for (int k = 0; k < 2; k++) run_ops(&devs[k]);

    char qwen[1024], stories[1024];
    /* Relative to the repository root (ctest's working directory), so the test
     * runs wherever the tree is copied, e.g. on the GPU machine. */
    snprintf(qwen, sizeof qwen, "tests/data/models/tiny-qwen2-f32");
    snprintf(stories, sizeof stories, "models/stories260K");
    printf("---- models ----\n");
    /* bf16: weights and activations rounded to 8 significant bits through
     * every layer; measured on H200: mean |err| 0.013 (tiny-qwen2) and 0.034
     * (stories260K, 5 layers), max 0.12 and 0.30. */
    for (int k = 0; k < 2; k++) {
        double tol_max = devs[k].bf16 ? 0.5 : 1e-4, tol_mean = devs[k].bf16 ? 0.06 : 1e-5;
        test_model_forward(&devs[k], qwen, "tiny-qwen2-f32", tol_max, tol_mean);
        test_model_forward(&devs[k], stories, "stories260K", tol_max, tol_mean);
        /* llama3 RoPE scaling (the table the rope ops take), sharded weights */
        test_model_forward(&devs[k], "tests/data/models/tiny-llama3-f32", "tiny-llama3-f32", tol_max, tol_mean);
        test_model_forward(&devs[k], "tests/data/models/tiny-qwen3-f32", "tiny-qwen3-f32", tol_max, tol_mean);
    }
    test_train_step(&devs[0], qwen, NULL, "tiny-qwen2-f32", 1e-4, 1e-4, 0.0f);
    test_train_step(&devs[0], "tests/data/models/tiny-llama3-f32", NULL, "tiny-llama3-f32", 1e-4, 1e-4, 0.0f);
    test_train_step(&devs[0], "tests/data/models/tiny-qwen3-f32", NULL, "tiny-qwen3-f32", 1e-4, 1e-4, 0.0f);
    test_train_step(&devs[0], "tests/data/models/tiny-qwen3-f32", "tests/data/lora/qwen3-all-linear", "qwen3+lora",
                    1e-4, 1e-4, 0.0f);
    test_train_step(&devs[0], "tests/data/models/tiny-qwen3-f32", "tests/data/lora/qwen3-all-linear",
                    "qwen3+lora, lora_dropout 0.25", 1e-4, 1e-4, 0.25f);
    test_train_step(&devs[0], "tests/data/models/tiny-llama-f32", "tests/data/lora/llama-qv-rslora", "llama+rslora",
                    1e-4, 1e-4, 0.0f);
    test_train_step(&devs[0], stories, NULL, "stories260K", 1e-4, 1e-4, 0.0f);
    for (int k = 0; k < 2; k++) test_offload_optimizer(&devs[k], "tests/data/models/tiny-qwen2-f32");

    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}

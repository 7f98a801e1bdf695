/* test_cuda_skinny.c — the decode-sized linear (src/backend/cuda/cuda_skinny.cu) against the CPU
 * backend's linear, on the Qwen2.5 projection shapes (0.5B, 1.5B, 7B) and a few ragged ones, for
 * n = 1..33 token rows, with and without bias, on both CUDA tables.
 *
 * What it checks, per shape, table and bias:
 *  - every n against the CPU: cuda_f32 within 1e-5 * max|ref|; cuda (bf16) within
 *    2e-4 * max|ref| (fp32 accumulation in another order) + |ref| * 2^-7 (twice the final bf16
 *    rounding) where the skinny path served the call, and within test_cuda_ops's cuBLAS tolerance
 *    (2e-3 * max|ref| + |ref| * 1.5 * 2^-8) where it fell back;
 *  - the path really ran (its call counter) for every n <= 16, on a prefix n = 1..M of the n tried;
 *  - batch invariance: every row of every skinny call is bit-identical to the same row of the
 *    largest skinny call (other n, other rows beside it), and to that row moved to another position
 *    (rows reversed);
 *  - determinism: the same call twice gives the same bits.
 * Then the fallbacks and views: in_dim not a multiple of 8 goes to cuBLAS (and is right); x and w
 * 8 elements into their buffers and out 1 element in are served and bit-identical to the plain call.
 * Inputs are rounded to the storage type once (uploaded, downloaded back, given to the CPU), so
 * only the op's own error is measured. Prints one line per case; exits 1 on any failure, 77 without
 * a CUDA device.
 *
 * Dimension legend: N token rows, I in_dim, O out_dim. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend_op_cases.h"

/* cuda_skinny.cu (CUDA builds, C linkage): switch the path of an instance (1 on, 0 off, -1 as opened)
 * and count the calls it served. */
void cuda_skinny_set_enabled(const Backend *be, int enabled);
long cuda_skinny_call_count(const Backend *be);

#define TEST_ROWS 33       /* one past SKINNY_MAX_ROWS (32): the last n is cuBLAS's */
#define MIN_SKINNY_ROWS 16 /* the path must serve at least n = 1..16 */

static int g_checks = 0, g_failures = 0;
static const Backend *CPU;

typedef struct Dev {
    const Backend *be;
    int bf16;
    const char *tag;
} Dev;

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test_cuda_skinny: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* Uniform in [-scale, scale) from a hash of (seed, i): fast enough for the 545M-element lm_head. */
static void fill_uniform(float *x, size_t n, uint64_t seed, float scale) {
    for (size_t i = 0; i < n; i++) {
        uint64_t z = (seed + 1) * 0xD1B54A32D192ED03ull + (i + 1) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        x[i] = scale * ((float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
    }
}

/* Largest err / (atol + |ref| * rel) over count values; NaN or Inf counts as infinitely far. */
static double worst_ratio(const float *got, const float *ref, size_t count, double atol, double rel,
                          size_t *worst_i, double *worst_abs) {
    double worst = 0.0;
    *worst_i = 0, *worst_abs = 0.0;
    for (size_t i = 0; i < count; i++) {
        double err = fabs((double)got[i] - (double)ref[i]);
        if (isnan(got[i]) || isinf(got[i])) err = INFINITY;
        double ratio = err / (atol + fabs((double)ref[i]) * rel);
        if (err > *worst_abs) *worst_abs = err;
        if (!(ratio <= worst)) worst = ratio, *worst_i = i;
    }
    return worst;
}

static double max_abs(const float *x, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i]));
    return m;
}

/* First element where two results differ in their bits (downloads are exact widenings), or -1. */
static long first_bit_difference(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) return (long)i;
    return -1;
}

static void record(int ok) {
    g_checks++;
    if (!ok) g_failures++;
}

/* ---------------------------------------------------------------- one shape */

static void test_shape(const Dev *d, const char *name, int in_dim, int out_dim) {
    const size_t nx = (size_t)TEST_ROWS * in_dim, nw = (size_t)out_dim * in_dim, ny = (size_t)TEST_ROWS * out_dim;
    float *x = xmalloc(nx * sizeof(float)), *w = xmalloc(nw * sizeof(float)), *b = xmalloc(out_dim * sizeof(float));
    fill_uniform(x, nx, 1, 1.0f);
    fill_uniform(w, nw, 2, 1.0f / sqrtf((float)in_dim));
    fill_uniform(b, out_dim, 3, 0.5f);
    void *gx = op_upload(d->be, x, nx), *gw = op_upload(d->be, w, nw), *gb = op_upload(d->be, b, out_dim);
    void *cx = op_upload(CPU, x, nx), *cw = op_upload(CPU, w, nw), *cb = op_upload(CPU, b, out_dim);
    free(w); /* the CPU backend holds its own copy */
    void *go = d->be->alloc(d->be, ny), *co = CPU->alloc(CPU, ny), *gx_rev = d->be->alloc(d->be, nx);
    float *ref = xmalloc(ny * sizeof(float)), *got = xmalloc(ny * sizeof(float));
    float *anchor = xmalloc(ny * sizeof(float)), *x_rev = xmalloc(nx * sizeof(float));

    for (int with_bias = 0; with_bias < 2; with_bias++) {
        const void *bias = with_bias ? gb : NULL;
        CPU->linear(CPU, co, cx, cw, with_bias ? cb : NULL, TEST_ROWS, in_dim, out_dim);
        CPU->download(CPU, ref, co, ny);
        double maxref = max_abs(ref, ny);
        int served[TEST_ROWS + 1] = {0}, anchor_n = 0, n_bad = 0, n_variant = 0;
        double worst_skinny = 0.0, worst_cublas = 0.0, worst_abs_all = 0.0;

        /* Largest n first: the first call the skinny path serves is the anchor of the bit checks. */
        for (int n = TEST_ROWS; n >= 1; n--) {
            long before = cuda_skinny_call_count(d->be);
            d->be->linear(d->be, go, gx, gw, bias, n, in_dim, out_dim);
            served[n] = cuda_skinny_call_count(d->be) > before;
            size_t count = (size_t)n * out_dim, wi;
            d->be->download(d->be, got, go, count);
            /* f32: both sides accumulate in fp32. bf16: the final rounding (<= |ref| 2^-8) and tensor-core
             * accumulation; cuBLAS's tolerance is test_cuda_ops's. */
            double atol = d->bf16 ? (served[n] ? 2e-4 : 2e-3) * maxref : 1e-5 * maxref + 1e-7;
            double rel = d->bf16 ? (served[n] ? 1.0 / 128.0 : 1.5 / 256.0) : 0.0;
            double wabs, ratio = worst_ratio(got, ref, count, atol, rel, &wi, &wabs);
            int ok = ratio <= 1.0;
            record(ok);
            if (served[n]) worst_skinny = fmax(worst_skinny, ratio);
            else worst_cublas = fmax(worst_cublas, ratio);
            worst_abs_all = fmax(worst_abs_all, wabs);
            if (!ok) {
                n_bad++;
                printf("FAIL %-9s %s n=%d%s (%s): worst at [row %zu, col %zu]: cuda %.9g cpu %.9g, err/tol %.3g\n",
                       d->tag, name, n, with_bias ? " +bias" : "", served[n] ? "skinny" : "cuBLAS", wi / out_dim,
                       wi % out_dim, (double)got[wi], (double)ref[wi], ratio);
            }
            if (!served[n]) continue;
            if (!anchor_n) {
                anchor_n = n;
                memcpy(anchor, got, count * sizeof(float));
                continue;
            }
            long diff = first_bit_difference(got, anchor, count);
            record(diff < 0);
            if (diff >= 0) {
                n_variant++;
                printf("FAIL %-9s %s%s: row %ld col %ld of the n=%d call differs from the n=%d call "
                       "(%.9g vs %.9g): not batch invariant\n",
                       d->tag, name, with_bias ? " +bias" : "", diff / out_dim, diff % out_dim, n, anchor_n,
                       (double)got[diff], (double)anchor[diff]);
            }
        }

        /* The path served a prefix n = 1..M with M >= MIN_SKINNY_ROWS. */
        int max_served = 0;
        while (max_served < TEST_ROWS && served[max_served + 1]) max_served++;
        int prefix = 1;
        for (int n = max_served + 1; n <= TEST_ROWS; n++) prefix &= !served[n];
        int path_ok = max_served >= MIN_SKINNY_ROWS && prefix;
        record(path_ok);
        if (!path_ok)
            printf("FAIL %-9s %s%s: the skinny path served n = 1..%d%s (want at least 1..%d)\n", d->tag, name,
                   with_bias ? " +bias" : "", max_served, prefix ? "" : " and some larger n", MIN_SKINNY_ROWS);

        int rev_ok = 1, det_ok = 1;
        if (anchor_n) {
            /* Same rows, reversed order: each row is computed at another position of the tile. */
            size_t count = (size_t)anchor_n * out_dim;
            for (int r = 0; r < anchor_n; r++)
                memcpy(x_rev + (size_t)r * in_dim, x + (size_t)(anchor_n - 1 - r) * in_dim, in_dim * sizeof(float));
            d->be->upload(d->be, gx_rev, x_rev, (size_t)anchor_n * in_dim); /* already rounded: exact */
            d->be->linear(d->be, go, gx_rev, gw, bias, anchor_n, in_dim, out_dim);
            d->be->download(d->be, got, go, count);
            for (int r = 0; r < anchor_n && rev_ok; r++) {
                long diff = first_bit_difference(got + (size_t)r * out_dim,
                                                 anchor + (size_t)(anchor_n - 1 - r) * out_dim, out_dim);
                if (diff >= 0) {
                    rev_ok = 0;
                    printf("FAIL %-9s %s%s: row %d moved to position %d changes col %ld (%.9g vs %.9g)\n", d->tag,
                           name, with_bias ? " +bias" : "", anchor_n - 1 - r, r, diff,
                           (double)got[(size_t)r * out_dim + diff],
                           (double)anchor[(size_t)(anchor_n - 1 - r) * out_dim + diff]);
                }
            }
            record(rev_ok);
            /* Determinism: the anchor call again. */
            d->be->linear(d->be, go, gx, gw, bias, anchor_n, in_dim, out_dim);
            d->be->download(d->be, got, go, count);
            long diff = first_bit_difference(got, anchor, count);
            det_ok = diff < 0;
            record(det_ok);
            if (!det_ok)
                printf("FAIL %-9s %s%s: two identical n=%d calls differ at row %ld col %ld\n", d->tag, name,
                       with_bias ? " +bias" : "", anchor_n, diff / out_dim, diff % out_dim);
        }
        int ok = n_bad == 0 && n_variant == 0 && path_ok && rev_ok && det_ok;
        printf("%s %-9s %-34s n=1..%d: skinny n<=%d err/tol %.3f, cuBLAS err/tol %.3f, max|err| %.2e "
               "(max|ref| %.3g); rows bit-identical across n %s, across positions %s; deterministic %s\n",
               ok ? "ok  " : "FAIL", d->tag, name, TEST_ROWS, max_served, worst_skinny, worst_cublas,
               worst_abs_all, maxref, n_variant ? "NO" : "yes", rev_ok ? "yes" : "NO", det_ok ? "yes" : "NO");
        fflush(stdout);
    }
    free(x), free(b), free(ref), free(got), free(anchor), free(x_rev);
    d->be->free(d->be, gx), d->be->free(d->be, gw), d->be->free(d->be, gb), d->be->free(d->be, go), d->be->free(d->be, gx_rev);
    CPU->free(CPU, cx), CPU->free(CPU, cw), CPU->free(CPU, cb), CPU->free(CPU, co);
}

/* ---------------------------------------------------------------- fallbacks and views */

/* in_dim % 8 != 0: not the skinny path's, and cuBLAS gets it right. */
static void test_fallback(const Dev *d) {
    const int n = 4, in_dim = 900, out_dim = 256;
    size_t nx = (size_t)n * in_dim, nw = (size_t)out_dim * in_dim, ny = (size_t)n * out_dim;
    float *x = xmalloc(nx * sizeof(float)), *w = xmalloc(nw * sizeof(float)), *b = xmalloc(out_dim * sizeof(float));
    float *got = xmalloc(ny * sizeof(float)), *ref = xmalloc(ny * sizeof(float));
    fill_uniform(x, nx, 4, 1.0f), fill_uniform(w, nw, 5, 1.0f / 30.0f), fill_uniform(b, out_dim, 6, 0.5f);
    void *gx = op_upload(d->be, x, nx), *gw = op_upload(d->be, w, nw), *gb = op_upload(d->be, b, out_dim),
         *go = d->be->alloc(d->be, ny);
    void *cx = op_upload(CPU, x, nx), *cw = op_upload(CPU, w, nw), *cb = op_upload(CPU, b, out_dim),
         *co = CPU->alloc(CPU, ny);
    long before = cuda_skinny_call_count(d->be);
    d->be->linear(d->be, go, gx, gw, gb, n, in_dim, out_dim);
    int fell_back = cuda_skinny_call_count(d->be) == before;
    CPU->linear(CPU, co, cx, cw, cb, n, in_dim, out_dim);
    d->be->download(d->be, got, go, ny);
    CPU->download(CPU, ref, co, ny);
    double maxref = max_abs(ref, ny), wabs;
    size_t wi;
    double ratio = worst_ratio(got, ref, ny, d->bf16 ? 2e-3 * maxref : 1e-5 * maxref + 1e-7,
                               d->bf16 ? 1.5 / 256.0 : 0.0, &wi, &wabs);
    int ok = fell_back && ratio <= 1.0;
    record(ok);
    printf("%s %-9s fallback [%d,%d]x[%d,%d]^T +bias (in_dim %% 8 != 0): %s, err/tol %.3f\n", ok ? "ok  " : "FAIL",
           d->tag, n, in_dim, out_dim, in_dim, fell_back ? "went to cuBLAS" : "TAKEN BY THE SKINNY PATH", ratio);
    free(x), free(w), free(b), free(got), free(ref);
    d->be->free(d->be, gx), d->be->free(d->be, gw), d->be->free(d->be, gb), d->be->free(d->be, go);
    CPU->free(CPU, cx), CPU->free(CPU, cw), CPU->free(CPU, cb), CPU->free(CPU, co);
}

/* x and w 8 elements into their buffers (still 16-byte aligned), out 1 element in (any alignment):
 * the skinny path serves it, bit-identical to the call on whole buffers. */
static void test_views(const Dev *d) {
    const int n = 5, in_dim = 512, out_dim = 200, off = 8;
    size_t nx = (size_t)n * in_dim, nw = (size_t)out_dim * in_dim, ny = (size_t)n * out_dim;
    size_t elem = d->be->storage == DTYPE_F32 ? 4 : 2;
    float *x = xmalloc(nx * sizeof(float)), *w = xmalloc(nw * sizeof(float)), *b = xmalloc(out_dim * sizeof(float));
    float *plain = xmalloc(ny * sizeof(float)), *viewed = xmalloc(ny * sizeof(float));
    fill_uniform(x, nx, 7, 1.0f), fill_uniform(w, nw, 8, 1.0f / 22.0f), fill_uniform(b, out_dim, 9, 0.5f);
    void *gx = op_upload(d->be, x, nx), *gw = op_upload(d->be, w, nw), *gb = op_upload(d->be, b, out_dim),
         *go = d->be->alloc(d->be, ny);
    void *gx_big = d->be->alloc(d->be, nx + off), *gw_big = d->be->alloc(d->be, nw + off), *go_big = d->be->alloc(d->be, ny + 1);
    d->be->copy(d->be, gx_big, off, gx, 0, nx);
    d->be->copy(d->be, gw_big, off, gw, 0, nw);
    d->be->linear(d->be, go, gx, gw, gb, n, in_dim, out_dim);
    long before = cuda_skinny_call_count(d->be);
    d->be->linear(d->be, (char *)go_big + elem, (char *)gx_big + off * elem, (char *)gw_big + off * elem, gb, n, in_dim,
                  out_dim);
    int served = cuda_skinny_call_count(d->be) > before;
    d->be->download(d->be, plain, go, ny);
    float *tmp = xmalloc((ny + 1) * sizeof(float));
    d->be->download(d->be, tmp, go_big, ny + 1);
    memcpy(viewed, tmp + 1, ny * sizeof(float));
    long diff = first_bit_difference(viewed, plain, ny);
    int ok = served && diff < 0;
    record(ok);
    printf("%s %-9s views: x, w at +%d elements, out at +1: %s, %s\n", ok ? "ok  " : "FAIL", d->tag, off,
           served ? "skinny path" : "NOT SERVED BY THE SKINNY PATH",
           diff < 0 ? "bit-identical to whole buffers" : "DIFFERS from whole buffers");
    free(x), free(w), free(b), free(plain), free(viewed), free(tmp);
    d->be->free(d->be, gx), d->be->free(d->be, gw), d->be->free(d->be, gb), d->be->free(d->be, go);
    d->be->free(d->be, gx_big), d->be->free(d->be, gw_big), d->be->free(d->be, go_big);
}

/* ---------------------------------------------------------------- the bf16 GEMV (mode 3) */

/* The streaming GEMV the default policy uses for large weights at 1..4 rows:
 * against the CPU, each row bit-identical whatever n, and run to run. */
static void test_gemv(const Dev *d, const char *name, int in_dim, int out_dim) {
    const int rows = 4;
    const size_t nx = (size_t)rows * in_dim, nw = (size_t)out_dim * in_dim, ny = (size_t)rows * out_dim;
    float *x = xmalloc(nx * sizeof(float)), *w = xmalloc(nw * sizeof(float)), *b = xmalloc(out_dim * sizeof(float));
    fill_uniform(x, nx, 11, 1.0f);
    fill_uniform(w, nw, 12, 1.0f / sqrtf((float)in_dim));
    fill_uniform(b, out_dim, 13, 0.5f);
    void *gx = op_upload(d->be, x, nx), *gw = op_upload(d->be, w, nw), *gb = op_upload(d->be, b, out_dim);
    void *cx = op_upload(CPU, x, nx), *cw = op_upload(CPU, w, nw), *cb = op_upload(CPU, b, out_dim);
    free(w);
    void *go = d->be->alloc(d->be, ny), *co = CPU->alloc(CPU, ny);
    float *ref = xmalloc(ny * sizeof(float)), *got = xmalloc(ny * sizeof(float)), *first = xmalloc(ny * sizeof(float));
    CPU->linear(CPU, co, cx, cw, cb, rows, in_dim, out_dim);
    CPU->download(CPU, ref, co, ny);
    double maxref = 0;
    for (size_t i = 0; i < ny; i++) maxref = fmax(maxref, fabs(ref[i]));
    cuda_skinny_set_enabled(d->be, 3);
    for (int n = 1; n <= rows; n++) {
        long before = cuda_skinny_call_count(d->be);
        d->be->linear(d->be, go, gx, gw, gb, n, in_dim, out_dim);
        int served = cuda_skinny_call_count(d->be) > before;
        d->be->download(d->be, got, go, (size_t)n * out_dim);
        double worst = 0;
        for (size_t i = 0; i < (size_t)n * out_dim; i++)
            worst = fmax(worst, fabs(got[i] - ref[i]) / (2e-4 * maxref + fabs(ref[i]) / 128.0));
        if (n == 1) memcpy(first, got, (size_t)out_dim * sizeof(float));
        int invariant = memcmp(first, got, (size_t)out_dim * sizeof(float)) == 0;
        d->be->linear(d->be, go, gx, gw, gb, n, in_dim, out_dim);
        d->be->download(d->be, first + out_dim, go, (size_t)out_dim); /* row 0 again: determinism */
        int repeat = memcmp(first, first + out_dim, (size_t)out_dim * sizeof(float)) == 0;
        int ok = served && worst <= 1.0 && invariant && repeat;
        record(ok);
        printf("%s %-9s gemv %s n=%d: error %.2f of tolerance, row 0 as at n=1: %s, repeatable: %s\n",
               ok ? "ok  " : "FAIL", d->tag, name, n, worst, invariant ? "yes" : "NO", repeat ? "yes" : "NO");
    }
    cuda_skinny_set_enabled(d->be, 2);
    free(x), free(b), free(ref), free(got), free(first);
    d->be->free(d->be, gx), d->be->free(d->be, gw), d->be->free(d->be, gb), d->be->free(d->be, go);
    CPU->free(CPU, cx), CPU->free(CPU, cw), CPU->free(CPU, cb), CPU->free(CPU, co);
}

/* ---------------------------------------------------------------- main */

typedef struct Shape {
    const char *name;
    int in_dim, out_dim;
} Shape;

int main(void) {
    CPU = backend_cpu();
    const Backend *f32 = backend_cuda_f32(), *bf16 = backend_cuda();
    if (!f32 || !bf16) {
        printf("no CUDA device (cudaGetDeviceCount failed or found none): skipping test_cuda_skinny\n");
        return 77;
    }
    /* every supported shape, whatever COLT_NO_SKINNY says: this test is about the path */
    cuda_skinny_set_enabled(f32, 2), cuda_skinny_set_enabled(bf16, 2);
    static const Shape shapes[] = {
        /* ragged: one 8-wide k vector, partial output tiles of each warp width, k tails */
        {"ragged [8]->[3]", 8, 3},
        {"ragged [520]->[2050]", 520, 2050},
        {"ragged [264]->[8195]", 264, 8195},
        /* Qwen2.5-0.5B: D 896, QD 896, KVD 128, F 4864, V 151936 */
        {"0.5B q/o [896]->[896]", 896, 896},
        {"0.5B k/v [896]->[128]", 896, 128},
        {"0.5B gate/up [896]->[4864]", 896, 4864},
        {"0.5B down [4864]->[896]", 4864, 896},
        {"0.5B lm_head [896]->[151936]", 896, 151936},
        /* Qwen2.5-1.5B: D 1536, KVD 256, F 8960 */
        {"1.5B q/o [1536]->[1536]", 1536, 1536},
        {"1.5B k/v [1536]->[256]", 1536, 256},
        {"1.5B gate/up [1536]->[8960]", 1536, 8960},
        {"1.5B down [8960]->[1536]", 8960, 1536},
        /* Qwen2.5-7B: D 3584, KVD 512, F 18944, V 152064 */
        {"7B q/o [3584]->[3584]", 3584, 3584},
        {"7B k/v [3584]->[512]", 3584, 512},
        {"7B gate/up [3584]->[18944]", 3584, 18944},
        {"7B down [18944]->[3584]", 18944, 3584},
        {"7B lm_head [3584]->[152064]", 3584, 152064},
    };
    Dev devs[2] = {{f32, 0, "cuda_f32"}, {bf16, 1, "cuda_bf16"}};
    for (int k = 0; k < 2; k++) {
        test_fallback(&devs[k]);
        test_views(&devs[k]);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            test_shape(&devs[k], shapes[s].name, shapes[s].in_dim, shapes[s].out_dim);
    }
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        test_gemv(&devs[1], shapes[s].name, shapes[s].in_dim, shapes[s].out_dim);
    printf("test_cuda_skinny: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}

/* bench_skinny.c — the decode-sized linear (src/backend/cuda/cuda_skinny.cu) against cuBLAS on the
 * Qwen2.5 projection shapes for n = 1..32 token rows: microseconds per call, the weight bandwidth
 * the skinny path reaches (weight bytes / time) and its share of the H200's 4.8 TB/s, as a markdown
 * table; then, per model, the linears of one decode step summed (q, k, v, o, gate, up, down per
 * layer, plus the lm_head).
 *
 * Timing: CUDA events around `iters` back-to-back calls after one warm-up (backend_cuda_time_ms).
 * Each call reads the next of several copies of w (>= 256 MiB in all), so the weights come from HBM
 * as in a decode step, not from the 50 MB L2. q, k and v carry Qwen2's bias. The two paths are
 * switched with cuda_skinny_set_enabled. Not a correctness test (tests/gpu/test_cuda_skinny.c is).
 *
 * Usage: bench_skinny [iters (50)] [f32]   (f32: the backend_cuda_f32 table instead of bf16)
 * Dimension legend: N token rows, I in_dim, O out_dim. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_bench.h"
#include "core/rng.h"

/* cuda_skinny.cu (CUDA builds, C linkage): 1 on, 0 off (cuBLAS), -1 environment; calls served. */
void cuda_skinny_set_enabled(const Backend *be, int enabled);
long cuda_skinny_call_count(const Backend *be);

#define PEAK_GBS 4800.0
#define FILL_CHUNK ((size_t)1 << 22)
#define COLD_BYTES ((size_t)256 << 20) /* copies of w per shape: well past the L2 */
#define MAX_COPIES 2048

static const int ROWS[] = {1, 2, 4, 8, 16, 32};
#define N_ROWS ((int)(sizeof ROWS / sizeof ROWS[0]))

typedef struct Model {
    const char *name;
    int d, q_dim, kv_dim, f, vocab, layers;
} Model;

typedef struct LinearCall {
    const Backend *be;
    void *out, *x, *bias;
    void **w; /* [copies] */
    int copies, next;
    int n, in_dim, out_dim;
} LinearCall;

static void run_linear(void *ctx) {
    LinearCall *c = ctx;
    void *w = c->w[c->next];
    c->next = (c->next + 1) % c->copies;
    c->be->linear(c->be, c->out, c->x, w, c->bias, c->n, c->in_dim, c->out_dim);
}

/* Fills a device buffer of n elements with a repeated random chunk. */
static void fill(const Backend *be, void *buf, size_t n, void *chunk_dev) {
    for (size_t off = 0; off < n; off += FILL_CHUNK) {
        size_t len = n - off < FILL_CHUNK ? n - off : FILL_CHUNK;
        be->copy(be, buf, off, chunk_dev, 0, len);
    }
}

/* Times one shape at every n; prints its rows and adds count x its times to the step totals. */
static void bench_shape(const Backend *be, void *chunk, const char *name, int in_dim, int out_dim, int with_bias,
                        double count, int iters, double *step_skinny_us, double *step_cublas_us,
                        double *step_bytes) {
    size_t elem = be->storage == DTYPE_F32 ? 4 : 2;
    size_t w_elems = (size_t)out_dim * in_dim, w_bytes = w_elems * elem;
    int copies = (int)((COLD_BYTES + w_bytes - 1) / w_bytes);
    if (copies < 1) copies = 1;
    if (copies > MAX_COPIES) copies = MAX_COPIES;
    void **w = malloc((size_t)copies * sizeof(void *));
    for (int i = 0; i < copies; i++) {
        w[i] = be->alloc(be, w_elems);
        fill(be, w[i], w_elems, chunk);
    }
    int max_n = ROWS[N_ROWS - 1];
    void *x = be->alloc(be, (size_t)max_n * in_dim), *out = be->alloc(be, (size_t)max_n * out_dim);
    void *bias = be->alloc(be, (size_t)out_dim);
    fill(be, x, (size_t)max_n * in_dim, chunk);
    fill(be, bias, (size_t)out_dim, chunk);
    for (int r = 0; r < N_ROWS; r++) {
        LinearCall call = {be, out, x, with_bias ? bias : NULL, w, copies, 0, ROWS[r], in_dim, out_dim};
        /* COLT_SKINNY_MODE=3 times the bf16 GEMV (1..4 rows) instead of the tensor-core kernel;
         * 1 the default policy (each where it wins). */
        cuda_skinny_set_enabled(be, getenv("COLT_SKINNY_MODE") ? atoi(getenv("COLT_SKINNY_MODE")) : 2);
        long before = cuda_skinny_call_count(be);
        double skinny_ms = backend_cuda_time_ms(be, run_linear, &call, iters);
        int served = cuda_skinny_call_count(be) > before;
        cuda_skinny_set_enabled(be, 0);
        double cublas_ms = backend_cuda_time_ms(be, run_linear, &call, iters);
        double skinny_us = skinny_ms * 1e3, cublas_us = cublas_ms * 1e3;
        double gbs = (double)w_bytes / (skinny_ms * 1e-3) / 1e9;
        printf("| %s%s | %d | %d | %d | %.2f%s | %.2f | %.2fx | %.0f | %.1f |\n", name, with_bias ? " +b" : "", in_dim,
               out_dim, ROWS[r], skinny_us, served ? "" : " (cuBLAS: not served)", cublas_us, cublas_us / skinny_us,
               gbs, 100.0 * gbs / PEAK_GBS);
        fflush(stdout);
        step_skinny_us[r] += count * skinny_us;
        step_cublas_us[r] += count * cublas_us;
        if (r == 0) *step_bytes += count * (double)w_bytes;
    }
    cuda_skinny_set_enabled(be, -1);
    for (int i = 0; i < copies; i++) be->free(be, w[i]);
    free(w);
    be->free(be, x), be->free(be, out), be->free(be, bias);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 50;
    if (iters < 1) iters = 1;
    int use_f32 = argc > 2 && strcmp(argv[2], "f32") == 0;
    const Backend *be = use_f32 ? backend_cuda_f32() : backend_cuda();
    if (!be) {
        printf("no CUDA device: nothing to benchmark\n");
        return 77;
    }
    static const Model models[] = {
        {"Qwen2.5-0.5B", 896, 896, 128, 4864, 151936, 24},
        {"Qwen2.5-1.5B", 1536, 1536, 256, 8960, 151936, 28},
        {"Qwen2.5-7B", 3584, 3584, 512, 18944, 152064, 28},
    };
    int n_models = (int)(sizeof models / sizeof models[0]);

    float *host = malloc(FILL_CHUNK * sizeof(float));
    for (size_t i = 0; i < FILL_CHUNK; i++) host[i] = 0.05f * rng_normal(3, 0, i);
    void *chunk = be->alloc(be, FILL_CHUNK);
    be->upload(be, chunk, host, FILL_CHUNK);
    free(host);

    printf("bench_skinny: %s storage, %d timed calls per cell, weights cold (>= %zu MiB of copies per shape)\n\n",
           use_f32 ? "fp32" : "bf16", iters, COLD_BYTES >> 20);
    double step_skinny[3][N_ROWS], step_cublas[3][N_ROWS], step_bytes[3];
    memset(step_skinny, 0, sizeof step_skinny), memset(step_cublas, 0, sizeof step_cublas);
    memset(step_bytes, 0, sizeof step_bytes);
    printf("| shape | in | out | n | skinny us | cuBLAS us | speedup | skinny GB/s | %% of %.1f TB/s |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
           PEAK_GBS / 1000.0);
    for (int m = 0; m < n_models; m++) {
        const Model *md = &models[m];
        char name[64];
        double layers = md->layers;
        double *ss = step_skinny[m], *sc = step_cublas[m], *sb = &step_bytes[m];
        snprintf(name, sizeof name, "%s q", md->name);
        bench_shape(be, chunk, name, md->d, md->q_dim, 1, layers, iters, ss, sc, sb);
        snprintf(name, sizeof name, "%s k/v", md->name);
        bench_shape(be, chunk, name, md->d, md->kv_dim, 1, 2 * layers, iters, ss, sc, sb);
        snprintf(name, sizeof name, "%s o", md->name);
        bench_shape(be, chunk, name, md->q_dim, md->d, 0, layers, iters, ss, sc, sb);
        snprintf(name, sizeof name, "%s gate/up", md->name);
        bench_shape(be, chunk, name, md->d, md->f, 0, 2 * layers, iters, ss, sc, sb);
        snprintf(name, sizeof name, "%s down", md->name);
        bench_shape(be, chunk, name, md->f, md->d, 0, layers, iters, ss, sc, sb);
        snprintf(name, sizeof name, "%s lm_head", md->name);
        bench_shape(be, chunk, name, md->d, md->vocab, 0, 1, iters, ss, sc, sb);
    }

    printf("\nOne decode step's linears (7 per layer x layers + lm_head), summed from the rows above:\n\n"
           "| model | n | skinny ms | cuBLAS ms | speedup | weights GB | skinny TB/s |\n"
           "|---|---:|---:|---:|---:|---:|---:|\n");
    for (int m = 0; m < n_models; m++)
        for (int r = 0; r < N_ROWS; r++)
            printf("| %s | %d | %.3f | %.3f | %.2fx | %.3f | %.2f |\n", models[m].name, ROWS[r],
                   step_skinny[m][r] * 1e-3, step_cublas[m][r] * 1e-3, step_cublas[m][r] / step_skinny[m][r],
                   step_bytes[m] * 1e-9, step_bytes[m] / (step_skinny[m][r] * 1e-6) * 1e-12);
    be->free(be, chunk);
    return 0;
}

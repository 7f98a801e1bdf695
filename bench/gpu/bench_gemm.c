/* bench_gemm.c — TFLOP/s of the CUDA backend's `linear` (bf16 storage,
 * cuBLASLt, fp32 accumulation) on the Qwen2.5 projection shapes, as a
 * markdown table with % of the H100/H200 dense bf16 peak (989 TFLOP/s).
 *
 * Not a correctness test (tests/gpu/test_cuda_ops.c is). Timing: CUDA events
 * around `iters` back-to-back calls after one warm-up (backend_cuda_time_ms).
 * Dimension legend: N tokens, I in_dim, O out_dim. */
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_bench.h"

#include "bench_fill.h"

#define PEAK_TFLOPS 989.0

typedef struct LinearCall {
    const Backend *be;
    void *out, *x, *w;
    int n, in_dim, out_dim;
} LinearCall;

static void run_linear(void *ctx) {
    LinearCall *c = ctx;
    c->be->linear(c->be, c->out, c->x, c->w, NULL, c->n, c->in_dim, c->out_dim);
}

int main(int argc, char **argv) {
    const Backend *be = backend_cuda();
    if (!be) {
        printf("no CUDA device: nothing to benchmark\n");
        return 77;
    }
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    if (iters < 1) iters = 1;
    static const int tokens[] = {512, 2048, 8192};
    static const int shapes[][2] = {{896, 896},   {896, 4864},   {4864, 896},   {1536, 8960},
                                    {8960, 1536}, {3584, 18944}, {18944, 3584}, {3584, 152064}};
    int n_tokens = (int)(sizeof tokens / sizeof tokens[0]), n_shapes = (int)(sizeof shapes / sizeof shapes[0]);

    void *chunk = bench_random_chunk(be, 3, 0.05f);

    printf("| N | in | out | ms | TFLOP/s | %% of %.0f |\n|---:|---:|---:|---:|---:|---:|\n", PEAK_TFLOPS);
    for (int s = 0; s < n_shapes; s++) {
        int in_dim = shapes[s][0], out_dim = shapes[s][1];
        void *w = be->alloc(be, (size_t)out_dim * in_dim);
        bench_fill(be, w, (size_t)out_dim * in_dim, chunk);
        for (int t = 0; t < n_tokens; t++) {
            int n = tokens[t];
            void *x = be->alloc(be, (size_t)n * in_dim), *out = be->alloc(be, (size_t)n * out_dim);
            bench_fill(be, x, (size_t)n * in_dim, chunk);
            LinearCall call = {be, out, x, w, n, in_dim, out_dim};
            double ms = backend_cuda_time_ms(be, run_linear, &call, iters);
            double tflops = 2.0 * n * in_dim * out_dim / (ms * 1e-3) / 1e12;
            printf("| %d | %d | %d | %.3f | %.1f | %.1f |\n", n, in_dim, out_dim, ms, tflops,
                   100.0 * tflops / PEAK_TFLOPS);
            fflush(stdout);
            be->free(be, x), be->free(be, out);
        }
        be->free(be, w);
    }
    be->free(be, chunk);
    return 0;
}

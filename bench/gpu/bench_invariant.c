/* bench_invariant.c — what the deterministic mode costs: the batch-invariant
 * linear (src/backend/cuda/cuda_invariant.cu) against the default path (cuBLASLt
 * and the skinny decode kernels) on the Qwen2.5 projection shapes, bf16, for
 * decode-sized and training-sized row counts. Prints TFLOP/s and the weight
 * stream in TB/s (weights read once per call) for both, and their ratio.
 * Usage: bench_invariant [preset ...]  (0.5b 1.5b 7b; default 0.5b 1.5b)
 * COLT_ROWS="1 16 128 4096 32768": the row counts.
 * COLT_INV_SHAPE=k: force the invariant kernel's tile shape k (cuda_invariant.cu). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_bench.h"
#include "bench_gpu_shapes.h"

void cuda_invariant_force_shape(const Backend *be, int shape); /* cuda_invariant.cu: a tile shape (-1 automatic) */

typedef struct Call {
    const Backend *be;
    void *out, *x, *w, *bias;
    int n, in_dim, out_dim;
} Call;

static void run_linear(void *ctx) {
    Call *c = ctx;
    c->be->linear(c->be, c->out, c->x, c->w, c->bias, c->n, c->in_dim, c->out_dim);
}

int main(int argc, char **argv) {
    const Backend *be = backend_cuda();
    if (!be) {
        printf("bench_invariant: no GPU\n");
        return 77;
    }
    int rows[16], n_rows = 0;
    const char *env = getenv("COLT_ROWS");
    char *list = strdup(env ? env : "1 16 64 512 4096 32768");
    for (char *t = strtok(list, " ,"); t && n_rows < 16; t = strtok(NULL, " ,")) rows[n_rows++] = atoi(t);
    free(list);
    if (getenv("COLT_INV_SHAPE")) cuda_invariant_force_shape(be, atoi(getenv("COLT_INV_SHAPE")));
    const char *def[] = {"0.5b", "1.5b"};
    int n_presets = argc > 1 ? argc - 1 : 2;
    printf("Batch-invariant linear (deterministic mode) against the default path, bf16, CUDA events\n\n");
    printf("| model | projection | rows | default TFLOP/s | default TB/s | invariant TFLOP/s | invariant TB/s | "
           "invariant / default time |\n|---|---|---:|---:|---:|---:|---:|---:|\n");
    for (int p = 0; p < n_presets; p++) {
        const Shape *s = shape_by_name(argc > 1 ? argv[p + 1] : def[p]);
        if (!s) {
            fprintf(stderr, "bench_invariant: unknown preset %s\n", argc > 1 ? argv[p + 1] : def[p]);
            return 2;
        }
        int hd = s->hidden / s->heads, qkv = (s->heads + 2 * s->kv_heads) * hd;
        struct {
            const char *name;
            int in_dim, out_dim;
        } proj[] = {{"q|k|v", s->hidden, qkv}, {"o", s->hidden, s->hidden}, {"gate|up", s->hidden, 2 * s->inter},
                    {"down", s->inter, s->hidden}, {"lm_head", s->hidden, s->vocab}};
        for (size_t j = 0; j < sizeof proj / sizeof proj[0]; j++) {
            int in_dim = proj[j].in_dim, out_dim = proj[j].out_dim, max_n = 0;
            for (int r = 0; r < n_rows; r++)
                if (rows[r] > max_n) max_n = rows[r];
            Call c = {.be = be, .in_dim = in_dim, .out_dim = out_dim};
            c.w = be->alloc(be, (size_t)out_dim * in_dim);
            c.x = be->alloc(be, (size_t)max_n * in_dim);
            c.out = be->alloc(be, (size_t)max_n * out_dim);
            be->zero(be, c.w, (size_t)out_dim * in_dim);
            be->zero(be, c.x, (size_t)max_n * in_dim);
            for (int r = 0; r < n_rows; r++) {
                c.n = rows[r];
                if (strcmp(proj[j].name, "lm_head") == 0 && c.n > 4096) continue; /* the trainer chunks it */
                double flops = 2.0 * c.n * in_dim * out_dim, bytes = 2.0 * in_dim * out_dim;
                int iters = flops > 1e12 ? 5 : 50;
                be->set_batch_invariant(be, 0);
                double ms_default = backend_cuda_time_ms(be, run_linear, &c, iters);
                be->set_batch_invariant(be, 1);
                double ms_inv = backend_cuda_time_ms(be, run_linear, &c, iters);
                be->set_batch_invariant(be, 0);
                printf("| %s | %s %dx%d | %d | %.1f | %.2f | %.1f | %.2f | %.2f |\n", s->name, proj[j].name, out_dim,
                       in_dim, c.n, flops / ms_default / 1e9, bytes / ms_default / 1e9, flops / ms_inv / 1e9,
                       bytes / ms_inv / 1e9, ms_inv / ms_default);
            }
            be->free(be, c.w), be->free(be, c.x), be->free(be, c.out);
        }
    }
    printf("\nCommand: build-cuda/bench_invariant [presets]; hardware: see nvidia-smi in the run log.\n");
    return 0;
}

/* bench_attention.c — TFLOP/s of the CUDA backend's causal attention, forward
 * (`attention`) and backward (`attention_backward`), bf16 storage, on the
 * Qwen2.5 attention shapes: B sequences of T tokens packed into one call (a
 * training batch: slot = sequence, positions 0..T-1), as a markdown table with
 * % of the H100/H200 dense bf16 peak (989 TFLOP/s).
 *
 * FLOPs (the standard FlashAttention accounting): forward 4 * T^2/2 * Dh * H
 * per sequence (QK^T and PV over the causal half); backward 2.5x the forward
 * (5 products against 2: S, dP, dV, dK, dQ). What the kernels recompute
 * (hi + lo splits; S and dP again when statistics or dq are recomputed) is not
 * counted: the figure is useful work per second. The forward writes lse and
 * the backward takes it with the forward's output, as training calls them; the
 * backward's time includes everything the op does (its host plan, the delta
 * pass, the kv and dq kernels).
 *
 * Not a correctness test (tests/gpu/test_cuda_ops.c is). Timing: CUDA events
 * around `iters` back-to-back calls after one warm-up (backend_cuda_time_ms).
 * Usage: bench_attention [iters] [preset ...]  (presets 0.5b 1.5b 7b; default all)
 * COLT_TOKENS=N: tokens per call (default 32768 for 0.5b/1.5b, 16384 for 7b,
 * as in the training-step benchmarks).
 * Dimension legend: B sequences, T tokens per sequence, N = B*T, H query heads,
 * KVH key/value heads, Dh head dim. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_bench.h"

#include "bench_fill.h"

#define PEAK_TFLOPS 989.0

typedef struct AttnShape {
    const char *name;
    int heads, kv_heads, head_dim, tokens;
} AttnShape;

static const AttnShape SHAPES[] = {
    {"0.5b", 14, 2, 64, 32768},
    {"1.5b", 12, 2, 128, 32768},
    {"7b", 28, 4, 128, 16384},
};

typedef struct AttnCall {
    const Backend *be;
    void *out, *lse, *q, *k_cache, *v_cache, *dout, *dq, *dk_cache, *dv_cache;
    int *slot, *pos;
    int n, heads, kv_heads, head_dim, n_slots, max_len;
} AttnCall;

static void run_forward(void *ctx) {
    AttnCall *c = ctx;
    c->be->attention(c->be, c->out, c->lse, c->q, c->k_cache, c->v_cache, c->slot, c->pos, c->n, c->heads, c->kv_heads, c->head_dim,
                     c->max_len);
}

static void run_backward(void *ctx) {
    AttnCall *c = ctx;
    c->be->attention_backward(c->be, c->dq, c->dk_cache, c->dv_cache, c->dout, c->q, c->out, c->lse, c->k_cache, c->v_cache,
                              c->slot, c->pos, c->n, c->heads, c->kv_heads, c->head_dim, c->n_slots, c->max_len);
}

int main(int argc, char **argv) {
    const Backend *be = backend_cuda();
    if (!be) {
        printf("no CUDA device: nothing to benchmark\n");
        return 77;
    }
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    if (iters < 1) iters = 1;
    const char *want[8];
    int n_want = 0;
    for (int a = 2; a < argc && n_want < 8; a++) want[n_want++] = argv[a];
    const int seq_lens[] = {512, 1024, 2048};
    const char *env_tokens = getenv("COLT_TOKENS");

    struct cudaDeviceProp prop;
    const char *device = cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.name : "unknown device";
    printf("Causal attention, bf16 storage, cuda backend, %s (%d SMs)", device,
           cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.multiProcessorCount : 0);
    printf("\ncommand: `");
    if (env_tokens) printf("COLT_TOKENS=%s ", env_tokens);
    if (getenv("COLT_FA_PRECISE")) printf("COLT_FA_PRECISE=%s ", getenv("COLT_FA_PRECISE"));
    for (int a = 0; a < argc; a++) printf("%s%s", a ? " " : "", argv[a]);
    printf("` (%d iterations timed with CUDA events after one warm-up)\n", iters);
    printf("FLOPs: forward 4 * T^2/2 * Dh * H per sequence; backward 2.5x forward\n\n");
    printf("| model | H/KVH/Dh | B x T | fwd ms | fwd TFLOP/s | fwd %% of %.0f | bwd ms | bwd TFLOP/s | bwd %% | "
           "fwd+bwd TFLOP/s |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
           PEAK_TFLOPS);

    void *chunk = bench_random_chunk(be, 5, 1.0f);

    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
        const AttnShape *s = &SHAPES[si];
        int selected = n_want == 0;
        for (int w = 0; w < n_want; w++) selected |= strcmp(want[w], s->name) == 0;
        if (!selected) continue;
        int tokens = env_tokens ? atoi(env_tokens) : s->tokens;
        for (size_t li = 0; li < sizeof seq_lens / sizeof seq_lens[0]; li++) {
            int T = seq_lens[li], B = tokens / T, N = B * T;
            if (B < 1) continue;
            size_t nq = (size_t)N * s->heads * s->head_dim, nc = (size_t)N * s->kv_heads * s->head_dim;
            AttnCall c = {.be = be, .n = N, .heads = s->heads, .kv_heads = s->kv_heads, .head_dim = s->head_dim,
                          .n_slots = B, .max_len = T};
            c.q = be->alloc(be, nq), c.out = be->alloc(be, nq), c.dout = be->alloc(be, nq), c.dq = be->alloc(be, nq);
            c.k_cache = be->alloc(be, nc), c.v_cache = be->alloc(be, nc);
            c.dk_cache = be->alloc_f32(be, nc), c.dv_cache = be->alloc_f32(be, nc), c.lse = be->alloc_f32(be, (size_t)N * s->heads);
            bench_fill(be, c.q, nq, chunk), bench_fill(be, c.dout, nq, chunk);
            bench_fill(be, c.k_cache, nc, chunk), bench_fill(be, c.v_cache, nc, chunk);
            be->zero_f32(be, c.dk_cache, nc), be->zero_f32(be, c.dv_cache, nc);
            c.slot = malloc(sizeof(int) * N), c.pos = malloc(sizeof(int) * N);
            for (int i = 0; i < N; i++) c.slot[i] = i / T, c.pos[i] = i % T;
            double fwd_ms = backend_cuda_time_ms(be, run_forward, &c, iters);
            double bwd_ms = backend_cuda_time_ms(be, run_backward, &c, iters);
            double fwd_flop = 4.0 * (double)T * T / 2.0 * s->head_dim * s->heads * B, bwd_flop = 2.5 * fwd_flop;
            double fwd_tf = fwd_flop / (fwd_ms * 1e-3) / 1e12, bwd_tf = bwd_flop / (bwd_ms * 1e-3) / 1e12;
            double all_tf = (fwd_flop + bwd_flop) / ((fwd_ms + bwd_ms) * 1e-3) / 1e12;
            printf("| %s | %d/%d/%d | %d x %d | %.3f | %.1f | %.1f%% | %.3f | %.1f | %.1f%% | %.1f |\n", s->name,
                   s->heads, s->kv_heads, s->head_dim, B, T, fwd_ms, fwd_tf, 100.0 * fwd_tf / PEAK_TFLOPS, bwd_ms,
                   bwd_tf, 100.0 * bwd_tf / PEAK_TFLOPS, all_tf);
            fflush(stdout);
            free(c.slot), free(c.pos);
            be->free(be, c.q), be->free(be, c.out), be->free(be, c.dout), be->free(be, c.dq), be->free(be, c.k_cache);
            be->free(be, c.v_cache), be->free(be, c.dk_cache), be->free(be, c.dv_cache), be->free(be, c.lse);
        }
    }
    be->free(be, chunk);
    return 0;
}

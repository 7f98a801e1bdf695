/* bench_gpu_train_step.c — training step throughput on the GPU backend:
 * forward + backward + AdamW of Qwen2.5-shaped random models, B sequences of T
 * tokens, bf16 storage. Prints a markdown table with tokens/s and MFU =
 * (6 * params * tokens + attention FLOPs) / time / 989e12 (H200 dense bf16).
 * Usage: bench_gpu_train_step [preset ...]   (presets: 0.5b 1.5b 7b; default 0.5b 1.5b)
 * COLT_RECOMPUTE=1: with activation recompute (gradient checkpointing).
 * COLT_TOKENS=N: tokens per step (default 8192; a GRPO micro-batch of 128
 * completions of ~350 tokens is ~45K).
 * COLT_PROFILE=1: also time every op of the last step of each configuration
 * (ops bracketed by synchronisations: attribution, not the headline figure). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_bench.h"
#include "backend/profile.h"
#include "core/error.h"
#include "core/log.h"
#include "model/model.h"
#include "model/model_train.h"
#include "parallel/optim.h"

#include "bench_gpu_shapes.h"

static double param_count(const Shape *s) {
    double D = s->hidden, F = s->inter, Dh = (double)s->hidden / s->heads;
    double attn = D * (s->heads * Dh) * 2 + D * (s->kv_heads * Dh) * 2 + (s->heads + 2 * s->kv_heads) * Dh;
    double layer = attn + 3 * D * F + 2 * D;
    return s->layers * layer + (double)s->vocab * D * (s->tied ? 1 : 2) + D;
}

int main(int argc, char **argv) {
    const Backend *be = backend_cuda();
    if (!be) {
        printf("no CUDA device\n");
        return 77;
    }
    const bool profile = getenv("COLT_PROFILE") && atoi(getenv("COLT_PROFILE")) > 0;
    const bool recompute = getenv("COLT_RECOMPUTE") && atoi(getenv("COLT_RECOMPUTE")) > 0;
    if (profile) be = backend_profile_wrap(be);
    FILE *devnull = fopen("/dev/null", "w");
    const char *want[8] = {"0.5b", "1.5b"};
    int n_want = 2;
    if (argc > 1) {
        n_want = argc - 1 < 8 ? argc - 1 : 8;
        for (int i = 0; i < n_want; i++) want[i] = argv[i + 1];
    }
    const int seq_lens[] = {512, 1024, 2048};
    printf("Training step (forward + backward + AdamW), bf16 storage, fp32 master/grads/moments, cuda backend%s, "
           "%s tokens per step\n\n", recompute ? ", activation recompute" : "",
           getenv("COLT_TOKENS") ? getenv("COLT_TOKENS") : "8192");
    printf("| model | params | B x T | tokens/s | step ms | MFU |\n|---|---:|---|---:|---:|---:|\n");
    char err[ERR_LEN];
    for (int w = 0; w < n_want; w++) {
        const Shape *s;
        Model *m = shape_random_model(want[w], be, &s);
        if (!m) continue;
        ModelGrads *g = NULL;
        Optimizer *opt = NULL;
        AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f};
        if (model_grads_create(&g, m, err) != 0 || optim_create(&opt, m, &ac, be, err) != 0) {
            printf("| %s | %s |\n", s->name, err);
            model_free(m);
            continue;
        }
        const int total_tokens = getenv("COLT_TOKENS") ? atoi(getenv("COLT_TOKENS")) : 8192;
        for (size_t li = 0; li < sizeof seq_lens / sizeof seq_lens[0]; li++) {
            int T = seq_lens[li], B = total_tokens / T, N = B * T;
            TrainState *ts = NULL;
            if (train_state_create_recompute(&ts, m, B, T, N, recompute, err) != 0) {
                printf("| %s | | %d x %d | %s |\n", s->name, B, T, err);
                continue;
            }
            int *tok = malloc(sizeof(int) * N), *slot = malloc(sizeof(int) * N), *pos = malloc(sizeof(int) * N);
            int *tgt = malloc(sizeof(int) * N);
            float *lp = malloc(sizeof(float) * N), *dlp = malloc(sizeof(float) * N);
            for (int i = 0; i < N; i++) {
                tok[i] = (i * 7919) % s->vocab;
                slot[i] = i / T;
                pos[i] = i % T;
                tgt[i] = (i + 1) % T == 0 ? -1 : ((i + 1) * 7919) % s->vocab;
                dlp[i] = tgt[i] >= 0 ? -1.0f / N : 0.0f;
            }
            double best = 1e30;
            int ok = 1;
            const int iters = profile ? 3 : 4;
            for (int it = 0; it < iters && ok; it++) {
                if (profile && it == iters - 1) backend_profile_report(be, devnull);  /* reset: profile the last step */
                double t0 = time_now();
                model_grads_zero(g);
                ok = model_train_forward(m, ts, tok, slot, pos, tgt, N, 1.0f, lp, NULL, err) == 0 &&
                     model_train_backward(m, ts, dlp, g, err) == 0;
                if (!ok) break;
                optim_clip_grad_norm(m, g, 1.0, be);  /* syncs: returns a host double */
                optim_step(opt, g, 1e-5f);
                float probe;
                be->download(be, &probe, model_param(m, 0).data, 1);  /* waits for the step */
                double dt = time_now() - t0;
                if (it > 0 && dt < best) best = dt;  /* first iteration warms up */
            }
            if (!ok) {
                printf("| %s | | %d x %d | error: %s |\n", s->name, B, T, err);
            } else {
                double P = param_count(s), L = s->layers, Dq = (double)s->heads * (s->hidden / s->heads);
                double attn = 6.0 * 2.0 * L * B * (double)T * T / 2.0 * Dq;  /* causal QK^T and PV, fwd+bwd */
                double flops = 6.0 * P * N + attn;
                printf("| %s | %.2fB | %d x %d | %.0f | %.1f | %.1f%% |\n", s->name, P / 1e9, B, T, N / best,
                       best * 1e3, 100.0 * flops / best / 989e12);
            }
            if (profile) {
                printf("\nper-op time of one step, %s %d x %d:\n\n", s->name, B, T);
                backend_profile_report(be, stdout);
                printf("\n");
            }
            fflush(stdout);
            free(tok), free(slot), free(pos), free(tgt), free(lp), free(dlp);
            train_state_free(ts);
        }
        optim_free(opt);
        model_grads_free(g);
        model_free(m);
    }
    fclose(devnull);
    return 0;
}

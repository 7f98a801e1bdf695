/* bench_forward.c — CPU forward throughput (tokens/s) of model_forward:
 * prefill (one sequence of 256 tokens, logits for the last one) and decode
 * (one token per sequence per call, logits for every token) at batch 1 and 8,
 * for the pretrained stories260K and a random model of `colt init`'s "tiny"
 * preset. Prints a markdown table with the command line and the CPU model.
 * Not a test: it checks nothing but that the forward calls succeed.
 *
 * Usage: bench_forward [repeats] (OMP_NUM_THREADS sets the thread count). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "core/error.h"
#include "core/log.h"
#include "model/model.h"

#define PREFILL_T 256
#define DECODE_STEPS 128


/* Prefill: best of `repeats` runs of one 256-token forward; returns tokens/s. */
static double bench_prefill(Model *m, int repeats) {
    char err[ERR_LEN];
    ModelState *st;
    bench_check(model_state_create(&st, m, 1, PREFILL_T, PREFILL_T, err), "bench_forward", err);
    int V = model_config(m)->vocab_size;
    int tokens[PREFILL_T], slot[PREFILL_T], pos[PREFILL_T];
    uint8_t want[PREFILL_T] = {0};
    float *logits = malloc((size_t)V * sizeof(float));
    for (int t = 0; t < PREFILL_T; t++) tokens[t] = (t * 7919 + 1) % V, slot[t] = 0, pos[t] = t;
    want[PREFILL_T - 1] = 1;
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        double t0 = time_now();
        bench_check(model_forward(m, st, tokens, slot, pos, PREFILL_T, want, logits, err), "bench_forward", err);
        double dt = time_now() - t0;
        if (dt < best) best = dt;
    }
    free(logits);
    model_state_free(st);
    return PREFILL_T / best;
}

/* Decode: `batch` sequences, DECODE_STEPS calls of one token each; best of repeats. */
static double bench_decode(Model *m, int batch, int repeats) {
    char err[ERR_LEN];
    ModelState *st;
    bench_check(model_state_create(&st, m, batch, DECODE_STEPS, batch, err), "bench_forward", err);
    int V = model_config(m)->vocab_size;
    int tokens[8], slot[8], pos[8];
    float *logits = malloc((size_t)batch * V * sizeof(float));
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        double t0 = time_now();
        for (int step = 0; step < DECODE_STEPS; step++) {
            for (int b = 0; b < batch; b++) tokens[b] = (step * 31 + b * 17 + 1) % V, slot[b] = b, pos[b] = step;
            bench_check(model_forward(m, st, tokens, slot, pos, batch, NULL, logits, err), "bench_forward", err);
        }
        double dt = time_now() - t0;
        if (dt < best) best = dt;
    }
    free(logits);
    model_state_free(st);
    return (double)DECODE_STEPS * batch / best;
}

static long long count_params(const ModelConfig *c) {
    long long D = c->hidden_size, F = c->intermediate_size, QD = (long long)c->num_attention_heads * c->head_dim,
              KVD = (long long)c->num_key_value_heads * c->head_dim;
    long long layer = 2 * D + D * QD * 2 + 2 * D * KVD + 3 * D * F;
    return (long long)c->vocab_size * D * (c->tie_word_embeddings ? 1 : 2) + c->num_hidden_layers * layer + D;
}

static void bench_row(const char *label, Model *m, int repeats) {
    double pre = bench_prefill(m, repeats), d1 = bench_decode(m, 1, repeats), d8 = bench_decode(m, 8, repeats);
    printf("| %s | %.2fM | %.0f | %.0f | %.0f |\n", label, count_params(model_config(m)) / 1e6, pre, d1, d8);
}

int main(int argc, char **argv) {
    int repeats = argc > 1 ? atoi(argv[1]) : 5;
    if (repeats < 1) repeats = 1;
    char cpu[256], err[ERR_LEN];
    bench_cpu_model_name(cpu, sizeof(cpu));
    printf("command: `");
    for (int i = 0; i < argc; i++) printf("%s%s", i ? " " : "", argv[i]);
    printf("` (OMP threads %d, best of %d)\n", omp_get_max_threads(), repeats);
    printf("CPU: %s\n\n", cpu);
    printf("| model | params | prefill %d tok/s | decode b=1 tok/s | decode b=8 tok/s |\n", PREFILL_T);
    printf("|---|---|---|---|---|\n");

    Model *m = NULL;
    const char *dir = COLT_SHARED_DATA "/models/stories260K/hf";
    if (model_load(&m, dir, backend_cpu(), err) == 0) {
        bench_row("stories260K (llama)", m, repeats);
        model_free(m);
    } else {
        fprintf(stderr, "skipping stories260K: %s\n", err);
    }
    /* colt init's "tiny" preset (qwen2 shapes) with random weights */
    ModelConfig cfg = BENCH_TINY_PRESET;
    bench_check(model_create_random(&m, &cfg, 1, backend_cpu(), err), "bench_forward", err);
    bench_row("tiny preset (qwen2, random)", m, repeats);
    model_free(m);
    return 0;
}

/* bench_train_step.c — CPU training throughput (tokens/s) of
 * model_train_forward + model_train_backward on a batch of 8 sequences x 128
 * tokens (prompt 32, completion 96: the completion positions carry targets and
 * random dlogprobs), for the pretrained stories260K and a random model of
 * `colt init`'s "tiny" preset. Prints a markdown table with the command line
 * and the CPU model. Not a test: it checks nothing but that the calls succeed.
 *
 * Usage: bench_train_step [repeats] (OMP_NUM_THREADS sets the thread count). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "core/error.h"
#include "core/log.h"
#include "model/model.h"
#include "model/model_train.h"

#define N_SEQS 8
#define SEQ_LEN 128
#define PROMPT_LEN 32


/* Best of `repeats` for forward alone and forward + backward; prints a row. */
static void bench_row(const char *label, Model *m, int repeats) {
    enum { N = N_SEQS * SEQ_LEN };
    char err[ERR_LEN];
    int V = model_config(m)->vocab_size;
    static int tokens[N], slot[N], pos[N], targets[N];
    static float lp[N], ent[N], dlp[N];
    for (int s = 0, i = 0; s < N_SEQS; s++)
        for (int t = 0; t < SEQ_LEN; t++, i++) {
            tokens[i] = (int)((1103515245u * (unsigned)(i + 7) + 12345u) % (unsigned)V);
            slot[i] = s;
            pos[i] = t;
        }
    for (int i = 0; i < N; i++) {
        int t = pos[i];
        targets[i] = t >= PROMPT_LEN - 1 && t + 1 < SEQ_LEN ? tokens[i + 1] : -1;
        dlp[i] = targets[i] >= 0 ? (float)((i % 7) - 3) / 96.0f : 0.0f;
    }
    TrainState *st;
    ModelGrads *g;
    bench_check(train_state_create(&st, m, N_SEQS, SEQ_LEN, N, err), "bench_train_step", err);
    bench_check(model_grads_create(&g, m, err), "bench_train_step", err);
    double best_fwd = 1e30, best_step = 1e30;
    for (int r = 0; r < repeats + 1; r++) { /* first run warms up */
        double t0 = time_now();
        bench_check(model_train_forward(m, st, tokens, slot, pos, targets, N, 0.7f, lp, ent, err), "bench_train_step", err);
        double t1 = time_now();
        bench_check(model_train_backward(m, st, dlp, g, err), "bench_train_step", err);
        double t2 = time_now();
        if (r > 0) {
            if (t1 - t0 < best_fwd) best_fwd = t1 - t0;
            if (t2 - t0 < best_step) best_step = t2 - t0;
        }
    }
    printf("| %s | %d x %d | %.0f | %.0f | %.1f |\n", label, N_SEQS, SEQ_LEN, N / best_fwd, N / best_step,
           1e3 * best_step);
    model_grads_free(g);
    train_state_free(st);
}

int main(int argc, char **argv) {
    int repeats = argc > 1 ? atoi(argv[1]) : 3;
    if (repeats < 1) repeats = 1;
    char cpu[256], err[ERR_LEN], dir[1024];
    bench_cpu_model_name(cpu, sizeof(cpu));
    printf("command: %s %d (OMP_NUM_THREADS=%d)\nCPU: %s\n\n", argv[0], repeats, omp_get_max_threads(), cpu);
    printf("| model | batch (seqs x tokens) | forward tokens/s | forward+backward tokens/s | step ms |\n");
    printf("|---|---|---|---|---|\n");
    Model *m;
    snprintf(dir, sizeof(dir), "%s/models/stories260K/hf", COLT_SHARED_DATA);
    if (model_load(&m, dir, backend_cpu(), err) == 0) {
        bench_row("stories260K", m, repeats);
        model_free(m);
    } else {
        fprintf(stderr, "skipping stories260K: %s\n", err);
    }
    /* colt init's "tiny" preset (qwen2 shapes) with random weights */
    ModelConfig cfg = BENCH_TINY_PRESET;
    bench_check(model_create_random(&m, &cfg, 1, backend_cpu(), err), "bench_train_step", err);
    bench_row("tiny preset (qwen2, random)", m, repeats);
    model_free(m);
    return 0;
}

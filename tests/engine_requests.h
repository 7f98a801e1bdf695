/* engine_requests.h — the request set the engine tests (test_engine.c on the
 * CPU, gpu/test_cuda_engine.c) generate: 14 sequences, 3 runs of 3 identical
 * prompts (GRPO's layout, so prompt blocks are shared) and 5 single prompts of
 * 1 to 40 random tokens, RNG streams 0..13. */
#ifndef COLT_TESTS_ENGINE_REQUESTS_H
#define COLT_TESTS_ENGINE_REQUESTS_H

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "engine/generate.h"
#include "model/model_train.h"

#define N_SEQS 14
#define MAX_PROMPT 40

typedef struct Requests {
    int prompts[N_SEQS][MAX_PROMPT];
    GenSequence seqs[N_SEQS];
} Requests;

static inline void make_requests(Requests *r, int vocab) {
    static const int lens[N_SEQS] = {17, 17, 17, 1, 33, 33, 33, 5, 40, 9, 9, 9, 16, 32};
    for (int i = 0; i < N_SEQS; i++) {
        bool copy = i > 0 && lens[i] == lens[i - 1] && lens[i] != 40;
        for (int k = 0; k < lens[i]; k++)
            r->prompts[i][k] = copy ? r->prompts[i - 1][k] : (int)(rng_uniform(99, (uint64_t)i, (uint64_t)k) * vocab);
        r->seqs[i] = (GenSequence){.prompt = r->prompts[i], .prompt_len = lens[i], .stream = (uint64_t)i};
    }
}

static inline void free_requests(Requests *r) {
    for (int i = 0; i < N_SEQS; i++) gen_sequence_free(&r->seqs[i]);
}

/* Sequences whose tokens and log-probs are the same bits in a and b. */
static inline int bit_identical(const Requests *a, const Requests *b) {
    int same = 0;
    for (int i = 0; i < N_SEQS; i++) {
        const GenSequence *x = &a->seqs[i], *y = &b->seqs[i];
        same += x->n_tokens == y->n_tokens && memcmp(x->tokens, y->tokens, sizeof(int) * (size_t)x->n_tokens) == 0 &&
                memcmp(x->logprobs, y->logprobs, sizeof(float) * (size_t)x->n_tokens) == 0;
    }
    return same;
}

/* The engine's log-prob of every sampled token against the trainer's: one
 * model_train_forward over each prompt + completion (a slot per sequence) at
 * `temperature`. Sets the mean and max |difference| and the number of tokens
 * whose two log-probs differ in any bit; 0, or -1 with err set. */
static inline int trainer_logprob_diff(Model *m, const Requests *r, float temperature, double *mean, double *max,
                                       int *n_differ, char *err) {
    int n = 0, max_len = 0;
    for (int i = 0; i < N_SEQS; i++) {
        int len = r->seqs[i].prompt_len + r->seqs[i].n_tokens - 1;
        n += len;
        if (len > max_len) max_len = len;
    }
    int *tok = malloc(sizeof(int) * n), *slot = malloc(sizeof(int) * n), *pos = malloc(sizeof(int) * n),
        *tgt = malloc(sizeof(int) * n);
    float *lp = malloc(sizeof(float) * n);
    int k = 0;
    for (int i = 0; i < N_SEQS; i++) {
        const GenSequence *s = &r->seqs[i];
        for (int p = 0; p < s->prompt_len + s->n_tokens - 1; p++, k++) {
            tok[k] = p < s->prompt_len ? s->prompt[p] : s->tokens[p - s->prompt_len];
            slot[k] = i;
            pos[k] = p;
            tgt[k] = p >= s->prompt_len - 1 ? s->tokens[p - s->prompt_len + 1] : -1;
        }
    }
    TrainState *ts = NULL;
    int rc = train_state_create(&ts, m, N_SEQS, max_len, n, err) != 0 ||
                     model_train_forward(m, ts, tok, slot, pos, tgt, n, temperature, lp, NULL, err) != 0
                 ? -1
                 : 0;
    double sum = 0;
    int count = 0;
    *max = 0;
    *n_differ = 0;
    for (k = 0; rc == 0 && k < n; k++) {
        if (tgt[k] < 0) continue;
        const GenSequence *s = &r->seqs[slot[k]];
        float engine = s->logprobs[pos[k] - s->prompt_len + 1];
        double d = fabs((double)lp[k] - engine);
        sum += d;
        count++;
        if (d > *max) *max = d;
        *n_differ += memcmp(&lp[k], &engine, sizeof(float)) != 0;
    }
    train_state_free(ts);
    *mean = count ? sum / count : NAN;
    free(tok), free(slot), free(pos), free(tgt), free(lp);
    return rc;
}

#endif
